package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/testenv"
)

// linkLeakOptions are the goleak options of the link tests: goroutines from
// before the test, and the reapers of private redis-servers, which testenv
// stops in t.Cleanup, after the deferred leak check.
func linkLeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/weft-dev/weft/internal/testenv.startProcess.func1"),
	}
}

// linkEvent is one linkUp or linkDown.
type linkEvent struct {
	kind string // "up" or "down"
	at   time.Time
	err  error
}

// linkRecorder is a linkEvents that records what a link reports.
type linkRecorder struct {
	mu     sync.Mutex
	events []linkEvent
	msgs   []string // lines, taken out of their frames
	chans  []string // the channel of each of msgs
	frames int      // messages
}

func (r *linkRecorder) linkUp(time.Time) { r.add(linkEvent{kind: "up"}) }
func (r *linkRecorder) linkChannelsDown(channels []string, err error) {
	r.add(linkEvent{kind: "down:" + strings.Join(channels, ","), err: err})
}
func (r *linkRecorder) linkChannelsUp(channels []string, _ time.Time) {
	r.add(linkEvent{kind: "up:" + strings.Join(channels, ",")})
}
func (r *linkRecorder) linkDown(err error)  { r.add(linkEvent{kind: "down", err: err}) }
func (r *linkRecorder) linkFresh(time.Time) {}

// linkMessage records each line of the frame.
func (r *linkRecorder) linkMessage(channel, payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for line := range strings.SplitSeq(payload, "\n") {
		r.msgs = append(r.msgs, line)
		r.chans = append(r.chans, channel)
	}
	r.frames++
}

func (r *linkRecorder) add(e linkEvent) {
	e.at = time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *linkRecorder) snapshot() []linkEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *linkRecorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// kinds is the event sequence, e.g. "up down up".
func (r *linkRecorder) kinds() string {
	var ks []string
	for _, e := range r.snapshot() {
		ks = append(ks, e.kind)
	}
	return strings.Join(ks, " ")
}

// waitEvents waits until there are n events and returns them.
func (r *linkRecorder) waitEvents(t *testing.T, n int, timeout time.Duration) []linkEvent {
	t.Helper()
	testenv.WaitFor(t, timeout, func() error {
		if len(r.snapshot()) < n {
			return fmt.Errorf("want %d link events, have %q", n, r.kinds())
		}
		return nil
	})
	return r.snapshot()
}

// testLink is a running link with its recorder.
type testLink struct {
	*link
	t      *testing.T
	rec    *linkRecorder
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startTestLink runs a link on redisURL; tune adjusts its config. Call stop
// before the test ends (and before its leak check).
func startTestLink(t *testing.T, redisURL string, tune func(*linkConfig)) *testLink {
	t.Helper()
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := linkConfig{
		Options:  opts,
		Channels: []string{"weft:" + t.Name(), "weft:" + t.Name() + "/events"},
		Logger:   slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tune != nil {
		tune(&cfg)
	}
	l, err := newLink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tl := &testLink{link: l, t: t, rec: &linkRecorder{}, cancel: cancel, done: make(chan error, 1)}
	go func() { tl.done <- l.run(ctx, tl.rec) }()
	return tl
}

// stop cancels run, checks that it returns nil soon, and closes the link;
// once.
func (tl *testLink) stop() {
	tl.t.Helper()
	tl.once.Do(tl.doStop)
}

func (tl *testLink) doStop() {
	tl.cancel()
	select {
	case err := <-tl.done:
		if err != nil {
			tl.t.Errorf("run returned %v, want nil on ctx done", err)
		}
	case <-time.After(10 * time.Second):
		tl.t.Fatalf("run did not return within 10s of ctx done")
	}
	if err := tl.close(); err != nil {
		tl.t.Errorf("close: %v", err)
	}
}

// echo publishes a line and waits until the link receives it back: both
// its subscriber and its publisher work.
func (tl *testLink) echo(payload string) {
	tl.t.Helper()
	if err := tl.publish(tl.cfg.Channels[0], []byte(payload)); err != nil {
		tl.t.Fatal(err)
	}
	testenv.Eventually(tl.t, 5*time.Second, func() bool { return slices.Contains(tl.rec.messages(), payload) },
		"echo of %q", payload)
}

func adminClient(t *testing.T, r *testenv.Redis) *redis.Client {
	t.Helper()
	return redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
}

// killPubSub closes every pub/sub connection on the server, as a network
// fault or an operator would.
func killPubSub(t *testing.T, admin *redis.Client) {
	t.Helper()
	n, err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Int()
	if err != nil || n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v; want 1 connection killed", n, err)
	}
}

// pubsubClients is how many pub/sub connections the server has.
func pubsubClients(t *testing.T, admin *redis.Client) int {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(list) {
		if strings.Contains(line, " flags=P ") {
			n++
		}
	}
	return n
}

func TestLinkConfigValidate(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	opts := &redis.Options{Addr: "127.0.0.1:1"}
	for _, tc := range []struct {
		cfg   linkConfig
		field string
	}{
		{linkConfig{Channels: []string{"weft:x"}}, "Options"},
		{linkConfig{Options: opts}, "Channels"},
		{linkConfig{Options: opts, Channels: []string{"c", "d", "c"}}, "Channels"},
		{linkConfig{Options: opts, Channels: []string{""}}, "Channels"},
		{linkConfig{Options: opts, Channels: []string{"c"}, PingInterval: -1}, "PingInterval"},
		{linkConfig{Options: opts, Channels: []string{"c"}, PingTimeout: -1}, "PingTimeout"},
		{linkConfig{Options: opts, Channels: []string{"c"}, RunIDCheck: -1}, "RunIDCheck"},
		{linkConfig{Options: opts, Channels: []string{"c"}, PublishQueue: -1}, "PublishQueue"},
		{linkConfig{Options: opts, Channels: []string{"c"}, MaxBatch: -1}, "MaxBatch"},
		{linkConfig{Options: opts, Channels: []string{"c"}, Backoff: backoff.Config{Multiplier: 0.5}}, "Backoff"},
	} {
		l, err := newLink(tc.cfg)
		if err == nil {
			l.close()
			t.Errorf("newLink(%+v) succeeded, want an error naming %s", tc.cfg, tc.field)
			continue
		}
		if !strings.HasPrefix(err.Error(), "fabric: ") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("newLink error %q does not name %s", err, tc.field)
		}
	}
}

// TestLinkPublishDropsWhenFull: publish queues without Redis and never
// blocks: past PublishQueue lines or QueueBytes bytes a line is dropped and
// counted, and room made by the publisher is used again.
func TestLinkPublishDropsWhenFull(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	l, err := newLink(linkConfig{Options: &redis.Options{Addr: "127.0.0.1:1"}, Channels: []string{"c"}, PublishQueue: 2, QueueBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	for i := range 2 {
		if err := l.publish(l.cfg.Channels[0], []byte{'a' + byte(i)}); err != nil {
			t.Fatalf("publish %d into a queue with room: %v", i, err)
		}
	}
	if err := l.publish(l.cfg.Channels[0], []byte("c")); !errors.Is(err, errPublishDropped) {
		t.Fatalf("publish into a full queue = %v, want errPublishDropped", err)
	}
	l.dequeued([]outLine{<-l.queue, <-l.queue})
	if err := l.publish(l.cfg.Channels[0], []byte("12345678901")); !errors.Is(err, errPublishDropped) {
		t.Fatalf("publish of 11 bytes with QueueBytes 10 = %v, want errPublishDropped", err)
	}
	if err := l.publish(l.cfg.Channels[0], []byte("1234567890")); err != nil {
		t.Fatalf("publish of 10 bytes into an empty queue: %v", err)
	}
	if st := l.stats(); st.PublishDropped != 2 || st.QueuedLines != 1 || st.QueuedBytes != 10 {
		t.Fatalf("stats %+v: want 2 dropped, 1 line of 10 bytes queued", st)
	}
}

// TestLinkOrder: 20,000 lines published by one link arrive at another, all
// of them, each on its channel, in pipelines of at most MaxBatch and
// frames: per channel in order, and the control (barrier) channel's lines
// in their place among all lines.
func TestLinkOrder(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	const lines = 20000
	chans := []string{"weft:" + t.Name(), "weft:" + t.Name() + "/events", "weft:" + t.Name() + "/typing"}
	tune := func(c *linkConfig) { c.Channels, c.Barrier = chans, chans[0] }
	sender := startTestLink(t, r.URL(), tune)
	defer sender.stop()
	receiver := startTestLink(t, r.URL(), tune)
	defer receiver.stop()
	sender.rec.waitEvents(t, 1, 10*time.Second)
	receiver.rec.waitEvents(t, 1, 10*time.Second)

	chanOf := func(i int) string {
		if i%10 == 9 {
			return chans[0]
		}
		return chans[1+i%2]
	}
	start := time.Now()
	for i := range lines {
		if err := sender.publish(chanOf(i), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		if n := len(receiver.rec.messages()); n < lines {
			return fmt.Errorf("received %d of %d lines", n, lines)
		}
		return nil
	})
	t.Logf("%d lines in %v", lines, time.Since(start))

	got := receiver.rec.messages()
	if len(got) != lines {
		t.Fatalf("received %d lines, want %d", len(got), lines)
	}
	receiver.rec.mu.Lock()
	gotChans := slices.Clone(receiver.rec.chans)
	frames := receiver.rec.frames
	receiver.rec.mu.Unlock()
	last := map[string]int{}
	for k, m := range got {
		i, err := strconv.Atoi(m)
		if err != nil {
			t.Fatalf("line %d is %q", k, m)
		}
		if gotChans[k] != chanOf(i) {
			t.Fatalf("line %d arrived on %q, was published on %q", i, gotChans[k], chanOf(i))
		}
		if prev, ok := last[gotChans[k]]; ok && prev >= i {
			t.Fatalf("on %s, line %d after %d (order broken)", gotChans[k], i, prev)
		}
		last[gotChans[k]] = i
		if gotChans[k] == chans[0] && i != k {
			t.Fatalf("control line %d arrived %d-th (out of its place)", i, k)
		}
	}
	if st := sender.stats(); st.PublishFrames != uint64(frames) {
		t.Errorf("sender published %d frames, receiver got %d", st.PublishFrames, frames)
	}
	t.Logf("%d lines in %d frames", lines, frames)
	st := sender.stats()
	if st.Published != lines || st.PublishErrors != 0 {
		t.Errorf("sender stats: published %d, errors %d; want %d, 0", st.Published, st.PublishErrors, lines)
	}
	if st.PublishBatches < lines/defaultMaxBatch || st.PublishBatches > lines {
		t.Errorf("sender stats: %d batches for %d lines with MaxBatch %d", st.PublishBatches, lines, defaultMaxBatch)
	}
	if k := receiver.rec.kinds(); k != "up" {
		t.Errorf("receiver events %q, want just up", k)
	}
}

// TestLinkFlushOnStop: a line queued just before run's context ends (a
// BYE, say) still goes out.
func TestLinkFlushOnStop(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	receiver := startTestLink(t, r.URL(), nil)
	defer receiver.stop()
	receiver.rec.waitEvents(t, 1, 10*time.Second)
	sender := startTestLink(t, r.URL(), nil)
	defer sender.stop() // on failure; stopping twice is fine
	sender.rec.waitEvents(t, 1, 10*time.Second)
	for i := range 1000 {
		if err := sender.publish(sender.cfg.Channels[0], []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	sender.stop()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := len(receiver.rec.messages()); n != 1000 {
			return fmt.Errorf("received %d of the 1000 lines queued before stop; sender %+v", n, sender.stats())
		}
		return nil
	})
	for i, m := range receiver.rec.messages() {
		if m != strconv.Itoa(i) {
			t.Fatalf("line %d is %q, want %q (order broken)", i, m, strconv.Itoa(i))
		}
	}
	if st := sender.stats(); st.Published != 1000 {
		t.Errorf("sender published %d lines, want 1000", st.Published)
	}
}

// TestLinkRedisRestart: Redis is SIGKILLed and restarted on the same port
// while the link keeps trying to reconnect: linkDown, then linkUp again,
// with the new run_id seen, and the publisher works again too.
func TestLinkRedisRestart(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	var attempts atomic.Int64
	tl := startTestLink(t, r.URL(), func(c *linkConfig) {
		c.Backoff = backoff.Config{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}
		c.OnAttempt = func() { attempts.Add(1) }
	})
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)
	tl.echo("before")
	firstRunID := tl.stats().LastRunID
	if firstRunID == "" {
		t.Fatal("no run_id after linkUp")
	}

	r.Kill(t)
	events := tl.rec.waitEvents(t, 2, 5*time.Second)
	if events[1].kind != "down" || events[1].err == nil {
		t.Fatalf("after kill: events %q, err %v; want down with an error", tl.rec.kinds(), events[1].err)
	}
	if tl.stats().Connected {
		t.Error("stats say connected after linkDown")
	}
	// Restart while the link is in its reconnect loop.
	before := attempts.Load()
	testenv.Eventually(t, 5*time.Second, func() bool { return attempts.Load() >= before+2 }, "reconnect attempts while down")
	r.Start(t)

	tl.rec.waitEvents(t, 3, 10*time.Second)
	if k := tl.rec.kinds(); k != "up down up" {
		t.Fatalf("events %q, want %q", k, "up down up")
	}
	st := tl.stats()
	if st.LastRunID == "" || st.LastRunID == firstRunID {
		t.Errorf("run_id %q after restart, want a new one (was %q)", st.LastRunID, firstRunID)
	}
	if !st.Connected || st.Reconnects != 1 {
		t.Errorf("stats %+v: want connected with 1 reconnect", st)
	}
	tl.echo("after")
}

// TestLinkClientKill: CLIENT KILL TYPE pubsub makes go-redis resubscribe
// silently inside Receive; the link must turn that into linkDown + linkUp
// on a connection of its own, leaving no second subscriber behind.
func TestLinkClientKill(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	admin := adminClient(t, r)
	defer admin.Close()
	var attempts atomic.Int64
	tl := startTestLink(t, r.URL(), func(c *linkConfig) { c.OnAttempt = func() { attempts.Add(1) } })
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)
	tl.echo("before")

	killPubSub(t, admin)
	events := tl.rec.waitEvents(t, 3, 10*time.Second)
	if k := tl.rec.kinds(); k != "up down up" {
		t.Fatalf("events %q, want %q", k, "up down up")
	}
	if events[1].err == nil {
		t.Error("linkDown without an error")
	}
	if n := attempts.Load(); n != 2 {
		t.Errorf("%d connection attempts, want 2 (the first and one reconnect)", n)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if n := pubsubClients(t, admin); n != 1 {
			return fmt.Errorf("%d pub/sub connections on the server, want 1", n)
		}
		return nil
	})
	tl.echo("after")
}

// TestLinkBackoffOutage: with Redis down for 20s, the attempts follow the
// geometric schedule (counted within the bounds that ±Jitter allows), and
// after Redis is back linkUp comes within Max + 1s.
func TestLinkBackoffOutage(t *testing.T) {
	if testing.Short() && !testenv.InCI() {
		t.Skip("a 20s outage (never skipped under CI=true)")
	}
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	const outage = 20 * time.Second
	r := testenv.StartRedis(t)
	bo := backoff.Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	var attempts atomic.Int64
	tl := startTestLink(t, r.URL(), func(c *linkConfig) {
		c.Backoff = bo
		c.OnAttempt = func() { attempts.Add(1) }
	})
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)
	tl.established() // the node caught up: the drop restarts the schedule

	r.Kill(t)
	killed := time.Now()
	before := attempts.Load()
	// The outage under test, not a synchronisation. The node keeps
	// publishing meanwhile: those lines are lost and counted, and the
	// publisher must neither spin nor stay broken after the outage.
	sent := 0
	for time.Since(killed) < outage {
		if err := tl.publish(tl.cfg.Channels[0], []byte("lost "+strconv.Itoa(sent))); err != nil {
			t.Fatal(err)
		}
		sent++
		time.Sleep(min(500*time.Millisecond, outage-time.Since(killed)))
	}
	during := attempts.Load() - before
	r.Start(t)
	restarted := time.Now()

	fewest, most := bo.RetriesWithin(outage)
	// ±1: the window starts at the kill, not at the first delay, and an
	// attempt may fall either side of its end.
	if during < int64(fewest-1) || during > int64(most+1) {
		t.Errorf("%d attempts in a %v outage, want %d..%d (schedule bounds %d..%d, ±1)",
			during, outage, fewest-1, most+1, fewest, most)
	}
	t.Logf("%d attempts in %v (schedule allows %d..%d)", during, outage, fewest, most)

	events := tl.rec.waitEvents(t, 3, 2*bo.Max)
	if k := tl.rec.kinds(); k != "up down up" {
		t.Fatalf("events %q, want %q", k, "up down up")
	}
	if took := events[2].at.Sub(restarted); took > bo.Max+time.Second {
		t.Errorf("linkUp %v after Redis was back, want within Max + 1s = %v", took, bo.Max+time.Second)
	} else {
		t.Logf("linkUp %v after Redis was back", took)
	}
	tl.echo("after")
	st := tl.stats()
	t.Logf("publisher: %d lines sent in the outage; stats %+v", sent, st)
	if st.PublishErrors == 0 || st.PublishErrors > uint64(sent) || st.PublishBatches > uint64(sent)+2 {
		t.Errorf("publisher stats %+v after %d lines sent in the outage: want some errors, at most one batch a line", st, sent)
	}
}

// TestLinkBackoffNeedsEstablished: connections that succeed but are never
// established keep backing off; established() makes the next drop
// reconnect after about Initial again.
func TestLinkBackoffNeedsEstablished(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	admin := adminClient(t, r)
	defer admin.Close()
	const initial = 100 * time.Millisecond
	// How much later than its delay a reconnect may come (dial, SUBSCRIBE,
	// INFO, under -race).
	const slack = 500 * time.Millisecond
	tl := startTestLink(t, r.URL(), func(c *linkConfig) {
		c.Backoff = backoff.Config{Initial: initial, Max: 5 * time.Second, Jitter: -1}
	})
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)

	// drop kills the subscription and returns how long the link took to
	// come back.
	drop := func() time.Duration {
		t.Helper()
		n := len(tl.rec.snapshot())
		testenv.Eventually(t, 5*time.Second, func() bool { return pubsubClients(t, admin) == 1 }, "one subscriber")
		killPubSub(t, admin)
		events := tl.rec.waitEvents(t, n+2, 10*time.Second)
		down, up := events[n], events[n+1]
		if down.kind != "down" || up.kind != "up" {
			t.Fatalf("events %q, want down then up at the end", tl.rec.kinds())
		}
		return up.at.Sub(down.at)
	}

	// Not established: 100ms, 200ms, 400ms, 800ms.
	for i, want := range []time.Duration{initial, 2 * initial, 4 * initial, 8 * initial} {
		got := drop()
		t.Logf("drop %d without established(): back after %v (delay %v)", i+1, got, want)
		if got < want || got > want+slack {
			t.Errorf("drop %d without established(): back after %v, want %v..%v", i+1, got, want, want+slack)
		}
	}
	// Established: the schedule starts over (1.6s otherwise).
	tl.established()
	got := drop()
	t.Logf("drop after established(): back after %v", got)
	if got < initial || got > initial+slack {
		t.Errorf("drop after established(): back after %v, want %v..%v", got, initial, initial+slack)
	}
	// Once: the next drop without established() waits longer again.
	got = drop()
	t.Logf("next drop without established(): back after %v", got)
	if got < 2*initial || got > 2*initial+slack {
		t.Errorf("next drop without established(): back after %v, want %v..%v", got, 2*initial, 2*initial+slack)
	}
}

// TestLinkHalfDead: with Redis paused the subscriber connection stays open
// but PING gets no answer: linkDown within PingInterval + PingTimeout, and
// linkUp once Redis answers again.
func TestLinkHalfDead(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	r := testenv.StartRedis(t)
	admin := adminClient(t, r)
	defer admin.Close()
	const (
		interval = 200 * time.Millisecond
		timeout  = 500 * time.Millisecond
		slack    = 500 * time.Millisecond
		pause    = 3 * time.Second
	)
	tl := startTestLink(t, r.URL(), func(c *linkConfig) {
		c.PingInterval = interval
		c.PingTimeout = timeout
		c.RunIDCheck = 100 * time.Millisecond // an INFO in flight must not delay linkDown
		c.Backoff = backoff.Config{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	})
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)

	paused := time.Now()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	events := tl.rec.waitEvents(t, 2, interval+timeout+5*time.Second)
	down := events[1]
	if down.kind != "down" || !errors.Is(down.err, errLinkPingTimeout) {
		t.Fatalf("events %q, err %v; want down with errLinkPingTimeout", tl.rec.kinds(), down.err)
	}
	took := down.at.Sub(paused)
	t.Logf("linkDown %v after the pause began", took)
	if took > interval+timeout+slack {
		t.Errorf("linkDown %v after the pause began, want within %v", took, interval+timeout+slack)
	}
	tl.rec.waitEvents(t, 3, pause+10*time.Second)
	if k := tl.rec.kinds(); k != "up down up" {
		t.Fatalf("events %q, want %q", k, "up down up")
	}
	tl.echo("after")
}

// TestLinkRunIDChange: Redis behind a proxy is replaced by another while
// the subscriber's connection to the proxy stays open. Only the run_id
// tells: the link must go down and subscribe again.
func TestLinkRunIDChange(t *testing.T) {
	defer goleak.VerifyNone(t, linkLeakOptions()...)
	first := testenv.StartRedis(t)
	second := testenv.StartRedis(t)
	admin := adminClient(t, first)
	defer admin.Close()
	admin2 := adminClient(t, second)
	defer admin2.Close()
	p := startProxy(t, first.Addr())
	defer p.stop()

	tl := startTestLink(t, "redis://"+p.addr()+"/0", func(c *linkConfig) {
		c.RunIDCheck = 100 * time.Millisecond
		c.Backoff = backoff.Config{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	})
	defer tl.stop()
	tl.rec.waitEvents(t, 1, 10*time.Second)
	firstRunID := tl.stats().LastRunID

	// New connections go to the second Redis; the publisher's connection
	// is cut so that its next INFO gets there. The subscriber's stays.
	p.setBackend(second.Addr())
	if err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	events := tl.rec.waitEvents(t, 3, 10*time.Second)
	if k := tl.rec.kinds(); k != "up down up" {
		t.Fatalf("events %q, want %q", k, "up down up")
	}
	if !errors.Is(events[1].err, errLinkRedisRestarted) {
		t.Errorf("linkDown(%v), want errLinkRedisRestarted", events[1].err)
	}
	secondRunID, err := admin2.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.stats().LastRunID; got == firstRunID || !strings.Contains(secondRunID, "run_id:"+got) {
		t.Errorf("LastRunID %q, want the second Redis's (first was %q)", got, firstRunID)
	}
	if n := pubsubClients(t, admin2); n != 1 {
		t.Errorf("%d subscribers on the second Redis, want 1", n)
	}
	tl.echo("after")
}

// tcpProxy forwards each new connection to the current backend; existing
// connections stay with the backend they were opened to.
type tcpProxy struct {
	t       *testing.T
	ln      net.Listener
	backend atomic.Value // string
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	closed  bool
}

func startProxy(t *testing.T, backend string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{t: t, ln: ln}
	p.backend.Store(backend)
	p.wg.Go(p.accept)
	return p
}

func (p *tcpProxy) addr() string           { return p.ln.Addr().String() }
func (p *tcpProxy) setBackend(addr string) { p.backend.Store(addr) }

func (p *tcpProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return // closed by stop
		}
		out, err := net.Dial("tcp", p.backend.Load().(string))
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		p.wg.Go(func() { pipe(out, in) })
		p.wg.Go(func() { pipe(in, out) })
	}
}

// stop closes the listener and every connection and waits for the copies.
func (p *tcpProxy) stop() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
