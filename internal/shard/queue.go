package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/telemetry"
)

// Queue defaults.
const (
	DefaultWorkers    = 8
	DefaultMaxBatch   = 64
	DefaultMaxPending = 10000
)

var (
	// ErrQueueFull: MaxPending tasks are already waiting; the task was
	// not accepted (and did not run).
	ErrQueueFull = errors.New("shard: queue full")
	// ErrClosed: the queue is draining or stopped; the task was not
	// accepted, or was accepted but never ran because the queue stopped.
	ErrClosed = errors.New("shard: queue closed")
	// ErrUnavailable: a task's executor could not do its work now for a
	// cause outside the task (its database unreachable, say), and running
	// it again shortly is safe: a Result.Err that wraps it is answered
	// 503, to be retried, not 500.
	ErrUnavailable = errors.New("shard: unavailable")
)

// Task is one unit of work for a key.
type Task struct {
	// Kind names what to do ("persist", "recompute"); the executor
	// dispatches on it.
	Kind string
	// Payload is the task's input, as JSON.
	Payload json.RawMessage
	// Batchable lets the queue hand this task to the executor together
	// with the consecutive batchable tasks of the same Kind for the same
	// key that follow it (persists, written in one transaction). A task
	// that reads or rewrites the key's state as a whole (a recompute) must
	// not be batchable: it then always runs alone, after everything
	// submitted before it and before everything submitted after it.
	Batchable bool
}

// Result is the outcome of one task.
type Result struct {
	// Value is the task's answer as JSON (a stream position, say); nil
	// means none.
	Value json.RawMessage
	// Err is the task's own failure: the task ran (or its batch did) and
	// failed. It is not retried by the queue, nor remembered by a Server:
	// a retry under the same idempotency key runs the task again, so a
	// failure must leave nothing behind that a second run would repeat.
	Err error
}

// Exec runs tasks for key. tasks is either one task, or a run of
// consecutive Batchable tasks of the same Kind (at most MaxBatch). It
// returns one Result per task, in order. Calls for one key never overlap;
// calls for different keys do, up to Workers at once.
//
// ctx is not canceled when the queue's Run context ends: work that started
// is finished, not abandoned halfway. A panic is recovered and becomes
// every task's error.
type Exec func(ctx context.Context, key string, tasks []Task) []Result

// QueueConfig configures a Queue. Zero values mean the documented defaults.
type QueueConfig struct {
	// Workers is how many keys run at once [8].
	Workers int
	// MaxBatch bounds the tasks of one executor call [64].
	MaxBatch int
	// MaxPending bounds the tasks waiting to start, over all keys; a
	// Submit beyond it fails with ErrQueueFull [10000].
	MaxPending int
	// Exec runs the tasks. Required.
	Exec Exec
	// Placement, if set, fences the keys while the shard map changes:
	// SubmitAt admits a task only when Placement does, a key's tasks start
	// only when Placement says they may run (a gained key waits for its
	// old owner's release; Kick re-checks), and Placement hears of every
	// admitted task's end. Nil admits and runs everything.
	Placement Placement
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate names the first invalid field.
func (c *QueueConfig) Validate() error {
	switch {
	case c.Exec == nil:
		return errors.New("shard: queue config: Exec is nil")
	case c.Workers < 0:
		return fmt.Errorf("shard: queue config: Workers %d is negative", c.Workers)
	case c.MaxBatch < 0:
		return fmt.Errorf("shard: queue config: MaxBatch %d is negative", c.MaxBatch)
	case c.MaxPending < 0:
		return fmt.Errorf("shard: queue config: MaxPending %d is negative", c.MaxPending)
	}
	return nil
}

// Queue runs tasks per key: the tasks of one key one at a time, in the order
// they were submitted; different keys in parallel on a bounded pool of
// workers. Keys that are ready to run take turns, so one busy key cannot
// starve the others.
//
// No goroutine belongs to a key: a key is a small record that exists while
// it has tasks waiting or running, and is dropped when it has none.
type Queue struct {
	cfg QueueConfig
	log *slog.Logger
	m   *queueMetrics

	mu       sync.Mutex
	cond     *sync.Cond // signaled when ready grows or stopping is set
	keys     map[string]*keyQueue
	ready    []*keyQueue // keys with waiting tasks and no running batch, in turn order
	waiting  int         // tasks accepted, not started
	unfinish int         // tasks accepted, not finished (waiting + running)
	started  bool        // Run was called
	closed   bool        // no more tasks are accepted (Drain, or Run's end)
	stopping bool        // Run's context is done: workers exit
	drained  chan struct{}
	isDrain  bool                 // drained is closed
	parked   map[string]*keyQueue // keys whose tasks Placement does not let run yet
}

// keyQueue is one key's waiting tasks. It is in Queue.ready or Queue.parked
// exactly when it has waiting tasks and no running batch.
type keyQueue struct {
	key    string
	tasks  []*pending
	busy   bool // a worker is running a batch of it
	parked bool // in Queue.parked: its tasks may not run yet
}

// pending is one accepted task and, once done is closed, its outcome.
type pending struct {
	task Task
	at   time.Time
	res  Result
	err  error // ErrClosed when the queue stopped before the task ran
	done chan struct{}
}

// NewQueue checks cfg and builds a Queue. Tasks may be submitted at once;
// they start when Run runs.
func NewQueue(cfg QueueConfig) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Workers = positive(cfg.Workers, DefaultWorkers)
	cfg.MaxBatch = positive(cfg.MaxBatch, DefaultMaxBatch)
	cfg.MaxPending = positive(cfg.MaxPending, DefaultMaxPending)
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	q := &Queue{cfg: cfg, log: log, m: newQueueMetrics(reg), keys: map[string]*keyQueue{}, drained: make(chan struct{}), parked: map[string]*keyQueue{}}
	q.cond = sync.NewCond(&q.mu)
	return q, nil
}

// positive returns v, or def when v is not positive.
func positive[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Submit queues t for key and waits for its result. The error is
// ErrQueueFull or ErrClosed when the task was not run, or ctx's error.
//
// When ctx ends first, Submit stops waiting and returns ctx's error, but a
// task that was accepted still runs: the queue cannot know whether a half
// served caller wants it undone. A caller that must know what happened
// uses an idempotency key (see Server) or reads the result back. The
// task runs on a copy of t.Payload, so the caller may reuse its buffer
// once Submit has returned, however it returned.
//
// With a Placement, Submit is SubmitAt with no known epoch, and a task the
// Placement does not admit fails with ErrNotOwner.
func (q *Queue) Submit(ctx context.Context, key string, t Task) (Result, error) {
	res, d, err := q.SubmitAt(ctx, key, t, 0)
	if err == nil && d.Verdict != handover.Accept {
		return Result{}, fmt.Errorf("%w: key %q: %s (owner %q at epoch %d)", ErrNotOwner, key, d.Verdict, d.Owner, d.Epoch)
	}
	return res, err
}

// SubmitAt is Submit for a sender that knows the shard map up to epoch
// (0: unknown): the queue's Placement decides whether the task is admitted
// here. When it is not, the task is not queued, the Decision says why
// (another owner, a newer map to learn, or wait), and the error is nil.
// Without a Placement every task is admitted.
func (q *Queue) SubmitAt(ctx context.Context, key string, t Task, epoch int64) (Result, handover.Decision, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, handover.Decision{}, err
	}
	p, d, err := q.enqueue(key, t, epoch)
	if err != nil || d.Verdict != handover.Accept {
		return Result{}, d, err
	}
	res, err := q.wait(ctx, p)
	return res, d, err
}

// wait waits for p's outcome or ctx's end.
func (q *Queue) wait(ctx context.Context, p *pending) (Result, error) {
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		select {
		case <-p.done: // both ready: the result wins
			return p.res, p.err
		default:
			return Result{}, ctx.Err()
		}
	}
}

// enqueue accepts t for key without waiting for it, if the Placement
// admits it.
func (q *Queue) enqueue(key string, t Task, epoch int64) (*pending, handover.Decision, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	accept := handover.Decision{Verdict: handover.Accept}
	switch {
	case q.closed:
		q.m.tasks.WithLabelValues(q.m.kinds.label(t.Kind), outcomeClosed).Inc()
		return nil, accept, ErrClosed
	case q.waiting >= q.cfg.MaxPending:
		q.m.tasks.WithLabelValues(q.m.kinds.label(t.Kind), outcomeFull).Inc()
		return nil, accept, fmt.Errorf("%w: %d tasks waiting", ErrQueueFull, q.waiting)
	}
	if q.cfg.Placement != nil {
		if d := q.cfg.Placement.Admit(key, epoch); d.Verdict != handover.Accept {
			return nil, d, nil
		}
	}
	// Copied: the task may run after Submit has returned (ctx ended).
	t.Payload = bytes.Clone(t.Payload)
	p := &pending{task: t, at: time.Now(), done: make(chan struct{})}
	kq := q.keys[key]
	if kq == nil {
		kq = &keyQueue{key: key}
		q.keys[key] = kq
	}
	kq.tasks = append(kq.tasks, p)
	q.waiting++
	q.unfinish++
	q.m.depth.Inc()
	if !kq.busy && !kq.parked && len(kq.tasks) == 1 {
		q.ready = append(q.ready, kq)
		q.cond.Signal()
	}
	return p, accept, nil
}

// Kick lets the parked keys whose tasks the Placement now lets run take
// their turn. The Placement's owner calls it when the map or a release
// changed.
func (q *Queue) Kick() {
	if q.cfg.Placement == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for key, kq := range q.parked {
		if q.cfg.Placement.Runnable(key) {
			delete(q.parked, key)
			kq.parked = false
			q.ready = append(q.ready, kq)
			q.cond.Signal()
		}
	}
}

// Depth returns the number of tasks waiting to start.
func (q *Queue) Depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting
}

// Run runs the workers until ctx is done. Then it stops accepting tasks,
// lets the batches that are running finish, fails the tasks that never
// started with ErrClosed, and returns. For a graceful shutdown call Drain
// first, then end ctx. Run may be called once.
func (q *Queue) Run(ctx context.Context) error {
	q.mu.Lock()
	if q.started {
		q.mu.Unlock()
		return errors.New("shard: queue: Run called twice")
	}
	q.started = true
	q.mu.Unlock()

	halt := func() {
		q.mu.Lock()
		q.closed, q.stopping = true, true
		q.cond.Broadcast()
		q.mu.Unlock()
	}
	if ctx.Err() != nil {
		halt() // now, not when AfterFunc's goroutine gets to it
	}
	stop := context.AfterFunc(ctx, halt)
	defer stop()
	execCtx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for range q.cfg.Workers {
		wg.Go(func() { q.work(execCtx) })
	}
	wg.Wait()

	q.mu.Lock()
	defer q.mu.Unlock()
	dropped := 0
	for key, kq := range q.keys {
		for _, p := range kq.tasks {
			p.err = ErrClosed
			close(p.done)
			q.m.tasks.WithLabelValues(q.m.kinds.label(p.task.Kind), outcomeDropped).Inc()
		}
		q.placed(key, len(kq.tasks))
		dropped += len(kq.tasks)
		delete(q.keys, key)
	}
	clear(q.parked)
	q.m.depth.Sub(float64(q.waiting))
	q.ready, q.waiting, q.unfinish = nil, 0, 0
	q.checkDrained()
	if dropped > 0 {
		q.log.Warn("shard queue stopped with tasks that never ran", "tasks", dropped)
	}
	return nil
}

// Drain stops accepting tasks (Submit then fails with ErrClosed) and waits
// until every accepted task has finished, or ctx ends. Run must be running
// for the queue to make progress.
func (q *Queue) Drain(ctx context.Context) error {
	q.mu.Lock()
	q.closed = true
	q.checkDrained()
	q.mu.Unlock()
	select {
	case <-q.drained:
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		n := q.unfinish
		q.mu.Unlock()
		return fmt.Errorf("shard: queue drain: %d tasks unfinished: %w", n, ctx.Err())
	}
}

// checkDrained closes drained once nothing is accepted any more and nothing
// is left. q.mu must be held.
func (q *Queue) checkDrained() {
	if q.closed && q.unfinish == 0 && !q.isDrain {
		q.isDrain = true
		close(q.drained)
	}
}

// work is one worker: it takes the next ready key, runs one batch of it,
// and puts the key back in turn if it has more.
func (q *Queue) work(ctx context.Context) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for len(q.ready) == 0 && !q.stopping {
			q.cond.Wait()
		}
		if q.stopping {
			return
		}
		kq := q.ready[0]
		q.ready[0] = nil
		q.ready = q.ready[1:]
		if q.cfg.Placement != nil && !q.cfg.Placement.Runnable(kq.key) {
			kq.parked = true
			q.parked[kq.key] = kq
			continue
		}
		batch := q.take(kq)
		kq.busy = true
		q.waiting -= len(batch)
		q.m.depth.Sub(float64(len(batch)))

		q.mu.Unlock()
		q.execute(ctx, kq.key, batch)
		q.placed(kq.key, len(batch))
		q.mu.Lock()

		kq.busy = false
		q.unfinish -= len(batch)
		if len(kq.tasks) > 0 {
			q.ready = append(q.ready, kq)
		} else {
			delete(q.keys, kq.key)
		}
		q.checkDrained()
	}
}

// placed tells the Placement that n admitted tasks of key ended.
func (q *Queue) placed(key string, n int) {
	if q.cfg.Placement != nil {
		for range n {
			q.cfg.Placement.Done(key)
		}
	}
}

// take removes the next batch from kq: its first task, and when that is
// batchable, the batchable tasks of the same kind right after it, up to
// MaxBatch. q.mu must be held.
func (q *Queue) take(kq *keyQueue) []*pending {
	n := 1
	if first := kq.tasks[0].task; first.Batchable {
		for n < len(kq.tasks) && n < q.cfg.MaxBatch {
			t := kq.tasks[n].task
			if !t.Batchable || t.Kind != first.Kind {
				break
			}
			n++
		}
	}
	batch := make([]*pending, n)
	copy(batch, kq.tasks)
	clear(kq.tasks[:n])
	kq.tasks = kq.tasks[n:]
	if len(kq.tasks) == 0 {
		kq.tasks = nil // let the backing array go
	}
	return batch
}

// execute runs one batch and hands out the results.
func (q *Queue) execute(ctx context.Context, key string, batch []*pending) {
	tasks := make([]Task, len(batch))
	for i, p := range batch {
		tasks[i] = p.task
	}
	kind := q.m.kinds.label(tasks[0].Kind)
	q.m.batch.WithLabelValues(kind).Observe(float64(len(batch)))
	start := time.Now()
	results := q.call(ctx, key, tasks)
	now := time.Now()
	q.m.execTime.WithLabelValues(kind).Observe(now.Sub(start).Seconds())
	latency := q.m.latency.WithLabelValues(kind)
	var ok, failed int
	for i, p := range batch {
		p.res = results[i]
		if p.res.Err != nil {
			failed++
		} else {
			ok++
		}
		latency.Observe(now.Sub(p.at).Seconds())
		close(p.done)
	}
	if ok > 0 {
		q.m.tasks.WithLabelValues(kind, outcomeOK).Add(float64(ok))
	}
	if failed > 0 {
		q.m.tasks.WithLabelValues(kind, outcomeError).Add(float64(failed))
	}
}

// call runs Exec, turning a panic or a wrong number of results into task
// errors.
func (q *Queue) call(ctx context.Context, key string, tasks []Task) (results []Result) {
	defer func() {
		if v := recover(); v != nil {
			q.log.Error("shard executor panicked", "key", key, "kind", tasks[0].Kind, "tasks", len(tasks), "panic", v)
			results = failAll(len(tasks), fmt.Errorf("shard: executor panicked on %s for key %q: %v", tasks[0].Kind, key, v))
		}
	}()
	results = q.cfg.Exec(ctx, key, tasks)
	if len(results) != len(tasks) {
		q.log.Error("shard executor returned the wrong number of results", "key", key, "kind", tasks[0].Kind,
			"tasks", len(tasks), "results", len(results))
		return failAll(len(tasks), fmt.Errorf("shard: executor returned %d results for %d %s tasks for key %q",
			len(results), len(tasks), tasks[0].Kind, key))
	}
	return results
}

func failAll(n int, err error) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i].Err = err
	}
	return out
}
