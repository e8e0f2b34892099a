package fabric

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/fabric/wire"
	"github.com/weft-dev/weft/internal/testenv"
)

// BenchmarkReaderFrames is BenchmarkReaderCPU as a live reader gets its
// lines: stamped, in frames of up to maxFrameBytes, each frame signed
// (what a writer's link publishes in a burst). It reports the reader process's CPU per applied
// row, less the publisher's (the same frames sent to a channel nobody
// follows); compare with BenchmarkReaderCPU/raw, one message per row.
func BenchmarkReaderFrames(b *testing.B) {
	const (
		rows   = 50_000
		secret = "bench-secret"
	)
	rds := testenv.StartRedis(b)
	opts := benchOptions(b, rds.URL())
	sink := newBenchSink()
	fetcher := newBenchFetcher()
	reader := runBenchNode(b, Config{
		Instance: benchReader, Cluster: benchCluster, RedisURL: rds.URL(), Secret: secret,
		Streams: []core.StreamSpec{{Name: benchStream, Ephemeral: true}},
		Handler: sink, Fetcher: fetcher, ReplicateWait: 100 * time.Millisecond,
	})
	testenv.Eventually(b, 10*time.Second, func() bool { return ready(reader) }, "reader not ready")
	env := newEnvelope(secret, 0)
	encode := func(cmd wire.Command) []byte {
		line, err := wire.Encode(nil, cmd)
		if err != nil {
			b.Fatal(err)
		}
		return line
	}
	pub := newRawPub(b, opts)
	ctx := context.Background()
	first := env.seal(benchChannel, encode(&wire.Position{Stream: benchStream, Writer: benchWriter}), time.Now())
	if err := pub.publish(ctx, benchChannel, []string{string(first)}); err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, 10*time.Second, func() bool { return knows(reader, benchKey) }, "reader never heard of %s", benchKey)
	// frames stamps each line and signs each frame, as a writer's link does.
	frames := func(from int64) []string {
		var out []string
		var f []byte
		for i := range rows {
			pos := from + int64(i) + 1
			line := env.stamp(encode(&wire.RData{Stream: benchStream, Writer: benchWriter, Prev: pos - 1, Pos: pos, Rows: json.RawMessage(benchRowJSON)}), time.Now())
			if len(f) > 0 && len(f)+1+len(line)+signRoom > maxFrameBytes {
				out = append(out, string(env.sign(benchChannel, f)))
				f = f[:0]
			}
			if len(f) > 0 {
				f = append(f, '\n')
			}
			f = append(f, line...)
		}
		return append(out, string(env.sign(benchChannel, f)))
	}
	var pubCPU, readCPU time.Duration
	var pos int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		msgs := frames(pos)
		pos += rows
		b.StartTimer()
		pubCPU += cpuOf(b, func() error { return pub.publish(ctx, benchVoidChannel, msgs) })
		sink.want.Store(int64(i+1) * rows)
		readCPU += cpuOf(b, func() error {
			if err := pub.publish(ctx, benchChannel, msgs); err != nil {
				return err
			}
			awaitCount(b, &sink.applied, sink.want.Load(), sink.reached, fetcher.called)
			return nil
		})
	}
	b.StopTimer()
	sink.check(b, benchNodes{reader: reader, fetcher: fetcher}, pos)
	n := float64(b.N * rows)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(us(readCPU-pubCPU)/n, "µs/row")
}
