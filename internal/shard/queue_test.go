package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startQueue builds a queue and runs it until the test ends.
func startQueue(t testing.TB, cfg QueueConfig) *Queue {
	t.Helper()
	q, err := NewQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return q
}

// wait waits for an enqueued task.
func (p *pending) wait(t testing.TB) Result {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("task %s %s never finished", p.task.Kind, p.task.Payload)
	}
	if p.err != nil {
		t.Fatalf("task %s %s: %v", p.task.Kind, p.task.Payload, p.err)
	}
	return p.res
}

func mustEnqueue(t testing.TB, q *Queue, key string, task Task) *pending {
	t.Helper()
	p, _, err := q.enqueue(key, task, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// enqueueUntilClosed enqueues task under key until q refuses it with
// ErrClosed, and returns the tasks it accepted meanwhile; after 10 s the
// test fails with the message.
func enqueueUntilClosed(t *testing.T, q *Queue, key string, task Task, msg string) []*pending {
	t.Helper()
	var accepted []*pending
	testenv.Eventually(t, 10*time.Second, func() bool {
		p, _, err := q.enqueue(key, task, 0)
		if p != nil {
			accepted = append(accepted, p)
		}
		return errors.Is(err, ErrClosed)
	}, "%s", msg)
	return accepted
}

func seqTask(kind string, batchable bool, seq int) Task {
	return Task{Kind: kind, Batchable: batchable, Payload: json.RawMessage(strconv.Itoa(seq))}
}

func payloadInt(t Task) int {
	n, err := strconv.Atoi(string(t.Payload))
	if err != nil {
		panic(err)
	}
	return n
}

// echo answers every task with its payload.
func echo(tasks []Task) []Result {
	out := make([]Result, len(tasks))
	for i, t := range tasks {
		out[i].Value = t.Payload
	}
	return out
}

// TestQueuePerKeyOrder submits from many goroutines per key and checks, in
// the executor, that a key never runs twice at once and that its tasks
// arrive in submission order, in well-formed batches.
func TestQueuePerKeyOrder(t *testing.T) {
	const (
		keys       = 32
		perKey     = 300
		submitters = 4
		workers    = 8
		maxBatch   = 8
	)
	type keyState struct {
		active  atomic.Int32
		last    atomic.Int64
		mu      sync.Mutex // serializes enqueue with seq assignment
		nextSeq int
	}
	states := map[string]*keyState{}
	for k := range keys {
		s := &keyState{}
		s.last.Store(-1)
		states[fmt.Sprintf("k%d", k)] = s
	}
	var (
		overlaps, disorders, badBatches atomic.Int64
		running, maxRunning             atomic.Int32
	)
	q := startQueue(t, QueueConfig{Workers: workers, MaxBatch: maxBatch, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		s := states[key]
		if s.active.Add(1) != 1 {
			overlaps.Add(1)
		}
		if n := running.Add(1); n > maxRunning.Load() {
			maxRunning.Store(n) // racy max, only ever an underestimate
		}
		if len(tasks) > 1 {
			for _, tk := range tasks {
				if !tk.Batchable || tk.Kind != tasks[0].Kind {
					badBatches.Add(1)
				}
			}
		}
		if len(tasks) > maxBatch {
			badBatches.Add(1)
		}
		for _, tk := range tasks {
			seq := int64(payloadInt(tk))
			if seq <= s.last.Load() {
				disorders.Add(1)
			}
			s.last.Store(seq)
			runtime.Gosched() // widen the window for an overlap to show
		}
		running.Add(-1)
		s.active.Add(-1)
		return echo(tasks)
	}})

	var wg sync.WaitGroup
	for key, s := range states {
		for sub := range submitters {
			wg.Go(func() {
				var ps []*pending
				var seqs []int
				for i := range perKey / submitters {
					kind, batchable := "persist", true
					switch (i + sub) % 5 {
					case 3:
						kind, batchable = "recompute", false
					case 4:
						kind = "index"
					}
					s.mu.Lock()
					seq := s.nextSeq
					s.nextSeq++
					ps = append(ps, mustEnqueue(t, q, key, seqTask(kind, batchable, seq)))
					s.mu.Unlock()
					seqs = append(seqs, seq)
				}
				for i, p := range ps {
					if got := payloadInt(Task{Payload: p.wait(t).Value}); got != seqs[i] {
						t.Errorf("%s: task %d got the result of %d", key, seqs[i], got)
					}
				}
			})
		}
	}
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Errorf("a key ran concurrently %d times", n)
	}
	if n := disorders.Load(); n != 0 {
		t.Errorf("%d tasks ran out of submission order", n)
	}
	if n := badBatches.Load(); n != 0 {
		t.Errorf("%d malformed batches", n)
	}
	if m := maxRunning.Load(); m > workers {
		t.Errorf("%d keys ran at once, more than %d workers", m, workers)
	}
	for key, s := range states {
		if got := s.last.Load(); got != perKey-1 {
			t.Errorf("%s: last task run %d, want %d", key, got, perKey-1)
		}
	}
	if d := q.Depth(); d != 0 {
		t.Errorf("Depth after everything ran = %d", d)
	}
}

// gate blocks executors until opened.
type gate chan struct{}

func (g gate) open() { close(g) }

// TestQueueBatching queues a long run of tasks behind a busy key and checks
// how the run is cut into executor calls.
func TestQueueBatching(t *testing.T) {
	const maxBatch = 16
	g := make(gate)
	var mu sync.Mutex
	var calls []string // "kind:size"
	q := startQueue(t, QueueConfig{Workers: 2, MaxBatch: maxBatch, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		if tasks[0].Kind == "block" {
			<-g
		}
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%s:%d", tasks[0].Kind, len(tasks)))
		mu.Unlock()
		return echo(tasks)
	}})

	var ps []*pending
	seq := 0
	add := func(n int, kind string, batchable bool) {
		for range n {
			ps = append(ps, mustEnqueue(t, q, "room", seqTask(kind, batchable, seq)))
			seq++
		}
	}
	add(1, "block", false)
	add(50, "persist", true)
	add(1, "persist", false) // a persist that asked not to be batched
	add(10, "persist", true)
	add(1, "recompute", false) // breaks the run
	add(39, "persist", true)
	add(5, "index", true) // another batchable kind breaks it too
	add(5, "persist", true)
	if got := q.Depth(); got != len(ps) && got != len(ps)-1 {
		t.Errorf("Depth = %d with %d tasks queued", got, len(ps))
	}
	g.open()
	for i, p := range ps {
		if got := payloadInt(Task{Payload: p.wait(t).Value}); got != i {
			t.Fatalf("task %d got the result of %d", i, got)
		}
	}
	want := []string{"block:1", "persist:16", "persist:16", "persist:16", "persist:2", "persist:1", "persist:10",
		"recompute:1", "persist:16", "persist:16", "persist:7", "index:5", "persist:5"}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(calls, " ") != strings.Join(want, " ") {
		t.Errorf("executor calls:\n got %v\nwant %v", calls, want)
	}
	if n := testutil.CollectAndCount(q.m.batch); n == 0 {
		t.Error("no batch size series")
	}
}

// TestQueueParallelism checks that different keys run at once, up to
// Workers and no more.
func TestQueueParallelism(t *testing.T) {
	const workers, keys = 4, 8
	g := make(gate)
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	q := startQueue(t, QueueConfig{Workers: workers, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		n := running.Add(1)
		mu.Lock()
		maxRunning.Store(max(maxRunning.Load(), n))
		mu.Unlock()
		<-g // a slow key
		running.Add(-1)
		return echo(tasks)
	}})
	var ps []*pending
	for k := range keys {
		ps = append(ps, mustEnqueue(t, q, fmt.Sprintf("slow%d", k), seqTask("recompute", false, k)))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return running.Load() == workers },
		"%d of %d slow keys running, want %d", running.Load(), keys, workers)
	if d := q.Depth(); d != keys-workers {
		t.Errorf("Depth = %d while %d keys run, want %d", d, workers, keys-workers)
	}
	g.open()
	for _, p := range ps {
		p.wait(t)
	}
	if m := maxRunning.Load(); m != workers {
		t.Errorf("max concurrency %d, want %d", m, workers)
	}
}

// TestQueueDrain checks that Drain refuses new tasks and returns once every
// accepted task has finished.
func TestQueueDrain(t *testing.T) {
	g := make(gate)
	var ran atomic.Int32
	q := startQueue(t, QueueConfig{Workers: 2, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		<-g
		ran.Add(int32(len(tasks)))
		return echo(tasks)
	}})
	var ps []*pending
	for i := range 30 {
		ps = append(ps, mustEnqueue(t, q, fmt.Sprintf("k%d", i%3), seqTask("persist", i%2 == 0, i)))
	}
	drained := make(chan error, 1)
	go func() { drained <- q.Drain(context.Background()) }()
	// Those that got in before Drain closed the queue count too.
	late := enqueueUntilClosed(t, q, "k0", seqTask("persist", true, 99), "Submit still accepted while draining")
	ps = append(ps, late...)
	accepted := 30 + len(late)
	if _, err := q.Submit(context.Background(), "new", seqTask("persist", true, 100)); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit while draining: %v, want ErrClosed", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v with tasks blocked", err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	if err := q.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "unfinished") {
		t.Errorf("Drain with a short deadline: %v", err)
	}
	cancel()
	g.open()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); int(n) != accepted {
		t.Errorf("%d tasks ran, want %d", n, accepted)
	}
	for _, p := range ps {
		p.wait(t)
	}
}

// TestQueueStop checks Run's end: the running batch finishes, waiting tasks
// fail with ErrClosed, later submits fail too.
func TestQueueStop(t *testing.T) {
	g := make(gate)
	started := make(chan struct{}, 1)
	q, err := NewQueue(QueueConfig{Workers: 1, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		started <- struct{}{}
		<-g
		if err := ctx.Err(); err != nil {
			return failAll(len(tasks), err) // must not happen: in-flight work is not canceled
		}
		return echo(tasks)
	}})
	if err != nil {
		t.Fatal(err)
	}
	first := mustEnqueue(t, q, "k", seqTask("recompute", false, 0))
	second := mustEnqueue(t, q, "k", seqTask("recompute", false, 1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	<-started
	cancel()
	// Run's AfterFunc runs soon after cancel, not at once: poll. A task
	// accepted meanwhile is dropped below like the second one.
	late := enqueueUntilClosed(t, q, "k", seqTask("persist", true, 2), "Submit accepted after Run's context ended")
	if _, err := q.Submit(context.Background(), "k", seqTask("persist", true, 3)); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Run's context ended: %v, want ErrClosed", err)
	}
	select {
	case <-done:
		t.Fatal("Run returned while a batch was running")
	default:
	}
	g.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res := first.wait(t); res.Err != nil {
		t.Errorf("in-flight task: %v", res.Err)
	}
	<-second.done
	if !errors.Is(second.err, ErrClosed) {
		t.Errorf("waiting task: %v, want ErrClosed", second.err)
	}
	for _, p := range late {
		<-p.done
		if !errors.Is(p.err, ErrClosed) {
			t.Errorf("task accepted as Run ended: %v, want ErrClosed", p.err)
		}
	}
	if err := q.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
	if err := q.Drain(context.Background()); err != nil {
		t.Errorf("Drain after Run: %v", err)
	}
	if got := testutil.ToFloat64(q.m.tasks.WithLabelValues("recompute", outcomeDropped)); got != 1 {
		t.Errorf("dropped tasks metric = %v, want 1", got)
	}
}

func TestQueueFull(t *testing.T) {
	g := make(gate)
	started := make(chan struct{}, 1)
	q := startQueue(t, QueueConfig{Workers: 1, MaxPending: 3, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		if tasks[0].Kind == "block" {
			started <- struct{}{}
			<-g
		}
		return echo(tasks)
	}})
	block := mustEnqueue(t, q, "a", seqTask("block", false, 0))
	<-started // running tasks do not count as pending
	var ps []*pending
	for i := range 3 {
		ps = append(ps, mustEnqueue(t, q, fmt.Sprintf("k%d", i), seqTask("persist", true, i)))
	}
	if _, err := q.Submit(context.Background(), "k9", seqTask("persist", true, 9)); !errors.Is(err, ErrQueueFull) {
		t.Errorf("Submit beyond MaxPending: %v, want ErrQueueFull", err)
	}
	if got := testutil.ToFloat64(q.m.depth); got != 3 {
		t.Errorf("depth gauge = %v, want 3", got)
	}
	g.open()
	block.wait(t)
	for _, p := range ps {
		p.wait(t)
	}
	if got := testutil.ToFloat64(q.m.depth); got != 0 {
		t.Errorf("depth gauge = %v after everything ran", got)
	}
	if got := testutil.ToFloat64(q.m.tasks.WithLabelValues("persist", outcomeFull)); got != 1 {
		t.Errorf("full metric = %v, want 1", got)
	}
}

// TestSubmitCanceled: the caller stops waiting, the task still runs.
func TestSubmitCanceled(t *testing.T) {
	g := make(gate)
	started := make(chan struct{})
	var ran atomic.Int32
	q := startQueue(t, QueueConfig{Workers: 1, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		if tasks[0].Kind == "block" {
			close(started)
			<-g
		}
		ran.Add(1)
		return echo(tasks)
	}})
	block := mustEnqueue(t, q, "k", seqTask("block", false, 0))
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := q.Submit(ctx, "k", seqTask("persist", true, 1))
		errc <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return q.Depth() == 1 }, "task never queued")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Submit: %v, want context.Canceled", err)
	}
	if _, err := q.Submit(ctx, "k", seqTask("persist", true, 2)); !errors.Is(err, context.Canceled) {
		t.Errorf("Submit with a done context: %v", err)
	}
	g.open()
	block.wait(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return ran.Load() == 2 }, "the abandoned task did not run")
}

func TestQueueExecMisbehaves(t *testing.T) {
	q := startQueue(t, QueueConfig{Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		switch tasks[0].Kind {
		case "panic":
			panic("boom")
		case "short":
			return nil
		}
		return echo(tasks)
	}})
	ctx := context.Background()
	res, err := q.Submit(ctx, "k", Task{Kind: "panic"})
	if err != nil || res.Err == nil || !strings.Contains(res.Err.Error(), "panicked") {
		t.Errorf("panicking executor: %v, %v", res.Err, err)
	}
	res, err = q.Submit(ctx, "k", Task{Kind: "short"})
	if err != nil || res.Err == nil || !strings.Contains(res.Err.Error(), "0 results for 1") {
		t.Errorf("executor with too few results: %v, %v", res.Err, err)
	}
	res, err = q.Submit(ctx, "k", Task{Kind: "fine", Payload: json.RawMessage(`"ok"`)})
	if err != nil || res.Err != nil || string(res.Value) != `"ok"` {
		t.Errorf("the queue did not survive: %s, %v, %v", res.Value, res.Err, err)
	}
	if got := testutil.ToFloat64(q.m.tasks.WithLabelValues("panic", outcomeError)); got != 1 {
		t.Errorf("error metric = %v, want 1", got)
	}
}

// TestQueueKeepsNothingPerKey runs many distinct keys and checks that
// nothing is left behind per key: no record, no goroutine.
func TestQueueKeepsNothingPerKey(t *testing.T) {
	before := runtime.NumGoroutine()
	q := startQueue(t, QueueConfig{Workers: 4, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		return echo(tasks)
	}})
	var wg sync.WaitGroup
	for s := range 50 {
		wg.Go(func() {
			for i := range 200 {
				if _, err := q.Submit(context.Background(), fmt.Sprintf("k%d-%d", s, i), seqTask("persist", true, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Submit returns once its result is handed out, before the worker
	// takes the lock back to drop the key's record. Drain returns once
	// every task is finished, which a worker records under the same lock
	// as the drop.
	if err := q.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	keys, ready := len(q.keys), len(q.ready)
	q.mu.Unlock()
	if keys != 0 || ready != 0 {
		t.Errorf("after 10000 keys ran: %d key records, %d ready, want none", keys, ready)
	}
	// The queue's own goroutines are its workers and nothing else.
	if n := runtime.NumGoroutine() - before; n > 4+1 {
		t.Errorf("%d goroutines more than before the queue, want at most its 4 workers and Run", n)
	}
}

func TestQueueConfig(t *testing.T) {
	noop := func(context.Context, string, []Task) []Result { return nil }
	for _, c := range []struct {
		cfg  QueueConfig
		want string
	}{
		{QueueConfig{}, "Exec"},
		{QueueConfig{Exec: noop, Workers: -1}, "Workers"},
		{QueueConfig{Exec: noop, MaxBatch: -1}, "MaxBatch"},
		{QueueConfig{Exec: noop, MaxPending: -1}, "MaxPending"},
	} {
		if _, err := NewQueue(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	q, err := NewQueue(QueueConfig{Exec: noop})
	if err != nil {
		t.Fatal(err)
	}
	if q.cfg.Workers != DefaultWorkers || q.cfg.MaxBatch != DefaultMaxBatch || q.cfg.MaxPending != DefaultMaxPending {
		t.Errorf("defaults: %+v", q.cfg)
	}
	// Two queues may share a registerer.
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := NewQueue(QueueConfig{Exec: noop, Registerer: reg}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKindLabelsBounded(t *testing.T) {
	var k kindLabels
	for i := range maxKindLabels {
		if got := k.label(fmt.Sprint("kind", i)); got != fmt.Sprint("kind", i) {
			t.Fatalf("label %d = %q", i, got)
		}
	}
	if got := k.label("one-too-many"); got != otherKind {
		t.Errorf("label beyond the bound = %q, want %q", got, otherKind)
	}
	if got := k.label("kind0"); got != "kind0" {
		t.Errorf("known kind = %q", got)
	}
}

// TestQueueRunAlreadyCanceled: a Run whose context is already done runs
// nothing.
func TestQueueRunAlreadyCanceled(t *testing.T) {
	var ran atomic.Int32
	q, err := NewQueue(QueueConfig{Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		ran.Add(1)
		return echo(tasks)
	}})
	if err != nil {
		t.Fatal(err)
	}
	var ps []*pending
	for i := range 100 {
		ps = append(ps, mustEnqueue(t, q, fmt.Sprintf("k%d", i), seqTask("persist", true, i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Run(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		<-p.done
		if !errors.Is(p.err, ErrClosed) {
			t.Fatalf("task: %v, want ErrClosed", p.err)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d batches ran", n)
	}
}
