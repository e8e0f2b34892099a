package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestChannelNames(t *testing.T) {
	if got := ControlChannel("prod"); got != "weft:prod" {
		t.Errorf("ControlChannel = %q", got)
	}
	if got := StreamChannel("prod", "events"); got != "weft:prod/events" {
		t.Errorf("StreamChannel = %q", got)
	}
	// Names cannot hold '/': no stream channel is another cluster's
	// control channel, and no two (cluster, stream) pairs share one.
	if wire.ValidName("a/b") {
		t.Fatal("a wire name may hold '/': channel names are ambiguous")
	}
	c := newChannels("prod", []string{"events"}, []string{"events", "other"}, newTestLines(t))
	for _, tc := range []struct {
		cmd     wire.Command
		channel string
	}{
		{&wire.RData{Stream: "events"}, "weft:prod/events"},
		{&wire.Position{Stream: "events"}, "weft:prod/events"},
		{&wire.Sealed{Stream: "other"}, "weft:prod/other"},
		{&wire.Sealed{Stream: "unknown"}, "weft:prod/unknown"},
		{&wire.HelloCmd{}, "weft:prod"},
		{&wire.Replicate{}, "weft:prod"},
		{&wire.Bye{}, "weft:prod"},
	} {
		if got := c.of(tc.cmd); got != tc.channel {
			t.Errorf("%s goes on %q, want %q", tc.cmd.Verb(), got, tc.channel)
		}
		if !c.belongs(tc.cmd, tc.channel) && tc.channel != "weft:prod/other" && tc.channel != "weft:prod/unknown" {
			t.Errorf("%s refused on its own channel %q", tc.cmd.Verb(), tc.channel)
		}
	}
	for _, tc := range []struct {
		cmd     wire.Command
		channel string
	}{
		{&wire.RData{Stream: "events"}, "weft:prod"},
		{&wire.Position{Stream: "other"}, "weft:prod/events"},
		{&wire.HelloCmd{}, "weft:prod/events"},
		{&wire.Bye{}, "weft:other"},
	} {
		if c.belongs(tc.cmd, tc.channel) {
			t.Errorf("%s accepted on %q", tc.cmd.Verb(), tc.channel)
		}
	}
	if got := c.subscriptions(); strings.Join(got, " ") != "weft:prod weft:prod/events" {
		t.Errorf("subscriptions %q", got)
	}
}

// An instance that follows only the events stream never receives a line
// of another stream, which a writer beside it publishes on (counted per
// channel); and a stream's command published on another channel is
// refused, and moves nothing.
func TestNodeFollowsOnlyItsStreams(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	typing := NewEphemeral("typing")
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{tune: func(c *Config) {
		c.Ephemerals = []*Ephemeral{typing}
		c.Streams = append(c.Streams, core.StreamSpec{Name: "typing", Ephemeral: true})
	}})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() }, "not ready")

	opts, _ := redis.ParseURL(rds.URL())
	rc := redis.NewClient(opts)
	defer rc.Close()
	ctx := context.Background()
	ps := rc.Subscribe(ctx, StreamChannel("test", "typing"))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	const changes = 20
	for i := range changes {
		if _, err := typing.Put(ctx, fmt.Sprintf("k%d", i), json.RawMessage(`[{"typing":true}]`)); err != nil {
			t.Fatal(err)
		}
		if _, err := w1.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
	}
	seen := 0
	for seen < changes {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(msg.Payload, "\n") { // a frame
			if strings.HasPrefix(line, "RDATA typing ") {
				seen++
			}
		}
	}
	converged(t, pool, reader, "persister1")

	if n := testutil.CollectAndCount(reader.node.m.linesIn); n != 2 {
		t.Errorf("reader has %d channel series, want 2 (control and events)", n)
	}
	if v := testutil.ToFloat64(reader.node.m.linesIn.WithLabelValues(StreamChannel("test", "typing"))); v != 0 {
		t.Errorf("reader received %v lines of the typing stream it does not follow", v)
	}
	if v := testutil.ToFloat64(reader.node.m.linesIn.WithLabelValues(eventsChannel)); v < changes {
		t.Errorf("reader received %v lines on the events channel, want >= %d", v, changes)
	}
	if v := testutil.ToFloat64(w1.node.m.linesIn.WithLabelValues(StreamChannel("test", "typing"))); v < changes {
		t.Errorf("the typing writer received %v lines on its own channel, want >= %d", v, changes)
	}

	// An events POSITION far ahead, stamped as new, on the control channel
	// and on the typing channel: refused as on the wrong channel.
	for _, ch := range []string{ControlChannel("test"), StreamChannel("test", "typing")} {
		line := wire.AppendStamp([]byte(`POSITION events persister2-aaaaaaaa 0 1000000`), wire.Stamp{Seq: uint64(time.Now().UnixMicro())})
		if err := rc.Publish(ctx, ch, line).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(w1.node.m.invalid.WithLabelValues(reasonWrongChannel)) == 2
	}, "the writer counted %v lines on the wrong channel, want 2", testutil.ToFloat64(w1.node.m.invalid.WithLabelValues(reasonWrongChannel)))
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(reader.node.m.invalid.WithLabelValues(reasonWrongChannel)) == 1
	}, "the reader counted %v lines on the wrong channel, want 1 (it does not hear the typing channel)",
		testutil.ToFloat64(reader.node.m.invalid.WithLabelValues(reasonWrongChannel)))
	if _, err := w1.write(ctx, pool, changes); err != nil {
		t.Fatal(err)
	}
	converged(t, pool, reader, "persister1")
	if got := reader.node.View(eventsKey("persister2")); got >= 1000000 {
		t.Fatalf("view jumped to the position published on the wrong channel: %d", got)
	}
}

func newTestLines(t *testing.T) *prometheus.CounterVec {
	t.Helper()
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lines"}, []string{"channel"})
}

// A writer that does not follow its stream publishes there without
// hearing it: readers get its rows, and it receives none of the other
// writer's, only the control channel.
func TestWriterOnlyHearsNotItsStream(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	w2 := startMember(t, pool, rds.URL(), "persister2", clusterOpts{tune: func(c *Config) { c.Streams = nil }})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() && w2.node.Ready() }, "not ready")

	ctx := context.Background()
	const rows = 20
	for i := range rows {
		for _, w := range []*member{w1, w2} {
			if _, err := w.write(ctx, pool, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	converged(t, pool, reader, "persister1", "persister2")
	converged(t, pool, w1, "persister2")
	if got := w2.node.chans.subscriptions(); !slices.Equal(got, []string{ControlChannel("test")}) {
		t.Errorf("the writer-only node subscribes to %q, want the control channel only", got)
	}
	if v := testutil.ToFloat64(w2.node.m.linesIn.WithLabelValues(eventsChannel)); v != 0 {
		t.Errorf("the writer-only node received %v lines of the stream it writes, want 0", v)
	}
	if v := testutil.ToFloat64(w1.node.m.linesIn.WithLabelValues(eventsChannel)); v < rows {
		t.Errorf("the following writer received %v lines of its stream, want >= %d", v, rows)
	}
}
