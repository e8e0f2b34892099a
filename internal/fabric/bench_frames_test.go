package fabric

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/testenv"
)

// BenchmarkReaderFrames is BenchmarkReaderCPU as a live reader gets its
// lines: stamped, in frames of up to maxFrameBytes, each frame signed
// (what a writer's link publishes in a burst). It reports the reader process's CPU per applied
// row, less the publisher's (the same frames sent to a channel nobody
// follows); compare with BenchmarkReaderCPU/raw, one message per row.
//
// A frame carries what queued while the publisher's previous round trip was
// in flight: 64 KiB in a burst, a few lines when rows come at a pace. The
// sub-benchmarks cut the frames at 8 and 32 lines too, so the reader's
// cost per frame shows: what it spends on a frame, whatever its size.
func BenchmarkReaderFrames(b *testing.B) {
	b.Run("lines=8", func(b *testing.B) { readerFrames(b, 8) })
	b.Run("lines=32", func(b *testing.B) { readerFrames(b, 32) })
	b.Run("full", func(b *testing.B) { readerFrames(b, 0) })
}

// readerFrames measures frames of at most lines lines (0: frames only
// bounded by their size).
func readerFrames(b *testing.B, lines int) {
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
	// frames packs the rows as a writer's link does: its framer, stamped
	// and signed by the envelope.
	fr := &framer{stamp: env.stamp, sign: env.sign}
	frames := func(from int64) []string {
		batch := make([]outLine, rows)
		for i := range batch {
			pos := from + int64(i) + 1
			batch[i] = outLine{benchChannel, string(encode(&wire.RData{Stream: benchStream, Writer: benchWriter, Prev: pos - 1, Pos: pos, Rows: json.RawMessage(benchRowJSON)}))}
		}
		var out []string
		for len(batch) > 0 {
			n := len(batch)
			if lines > 0 {
				n = min(n, lines)
			}
			for _, f := range fr.pack(batch[:n], time.Now()) {
				out = append(out, string(fr.payload(f)))
			}
			batch = batch[n:]
		}
		return out
	}
	perRow, _ := readerCPU(b, pub, sink, benchNodes{reader: reader, fetcher: fetcher}, rows, frames)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(perRow, "µs/row")
}
