package shard

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/telemetry"
)

const (
	metricsNamespace = "weft"
	metricsSubsystem = "shard"
	// maxKindLabels bounds the kind label: task kinds are a small set
	// fixed by the application, but one arriving over HTTP could be
	// anything, so only the first few distinct kinds get their own series.
	maxKindLabels = 32
	otherKind     = "other"
)

// Task outcomes (label values).
const (
	outcomeOK      = "ok"      // ran, no error
	outcomeError   = "error"   // ran, the executor returned an error
	outcomeFull    = "full"    // refused: the queue was full
	outcomeClosed  = "closed"  // refused: the queue was closed
	outcomeDropped = "dropped" // accepted, never ran: the queue stopped first
)

type queueMetrics struct {
	depth    prometheus.Gauge
	tasks    *prometheus.CounterVec
	batch    *prometheus.HistogramVec
	latency  *prometheus.HistogramVec
	execTime *prometheus.HistogramVec
	kinds    kindLabels
}

func newQueueMetrics(reg prometheus.Registerer) *queueMetrics {
	m := &queueMetrics{
		depth: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "queue_depth", Help: "Tasks accepted by the per-key queue and not yet started."}),
		tasks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "queue_tasks_total", Help: "Tasks submitted to the per-key queue, by kind and outcome (ok, error, full, closed, dropped)."},
			[]string{"kind", "outcome"}),
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "queue_batch_size", Help: "Tasks handed to one executor call, by kind.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10)}, []string{"kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "queue_task_duration_seconds", Help: "Time from submission to result, waiting included, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"kind"}),
		execTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "queue_exec_duration_seconds", Help: "Time of one executor call (one batch), by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"kind"}),
	}
	// Queues sharing a registerer share their series; the depth gauge is
	// only ever moved up and down, so it then sums their depths.
	m.depth = telemetry.Register(reg, m.depth)
	m.tasks = telemetry.Register(reg, m.tasks)
	m.batch = telemetry.Register(reg, m.batch)
	m.latency = telemetry.Register(reg, m.latency)
	m.execTime = telemetry.Register(reg, m.execTime)
	return m
}

type serverMetrics struct {
	requests *prometheus.CounterVec
	dedup    *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer) *serverMetrics {
	m := &serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_requests_total", Help: "Forwarded tasks received, by HTTP status code."}, []string{"code"}),
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_duplicates_total", Help: "Requests answered without running their task again, by how (cached: it had finished; coalesced: it was running)."},
			[]string{"how"}),
	}
	m.requests = telemetry.Register(reg, m.requests)
	m.dedup = telemetry.Register(reg, m.dedup)
	return m
}

type forwarderMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// Forwarder outcomes (label values).
const (
	fwdLocal     = "local"      // the key is ours: the local queue ran it
	fwdOK        = "ok"         // the owner ran it
	fwdTaskError = "task_error" // the owner ran it and it failed
	fwdRetry     = "retryable"  // an attempt failed and may be retried
	fwdNotOwner  = "not_owner"  // 409
	fwdMoved     = "moved"      // the key moved at runtime: forwarded again
	fwdRejected  = "rejected"   // other 4xx: not retried
	fwdCanceled  = "canceled"
)

func newForwarderMetrics(reg prometheus.Registerer) *forwarderMetrics {
	m := &forwarderMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "forward_attempts_total", Help: "Forwarding attempts, by outcome (local, ok, task_error, retryable, not_owner, moved, rejected, canceled)."},
			[]string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "forward_duration_seconds", Help: "Time of Forwarder.Do, retries included, by path (local or remote).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"path"}),
	}
	m.requests = telemetry.Register(reg, m.requests)
	m.duration = telemetry.Register(reg, m.duration)
	return m
}

// kindLabels maps task kinds to bounded label values.
type kindLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (k *kindLabels) label(kind string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.seen[kind]; ok {
		return kind
	}
	if len(k.seen) >= maxKindLabels {
		return otherKind
	}
	if k.seen == nil {
		k.seen = map[string]struct{}{}
	}
	k.seen[kind] = struct{}{}
	return kind
}
