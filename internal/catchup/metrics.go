package catchup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/telemetry"
)

const (
	metricsNamespace = "weft"
	metricsSubsystem = "catchup"
)

// serverMetrics are the endpoint's series. The stream label only ever holds
// configured stream names ("unknown" otherwise): a caller cannot grow it.
type serverMetrics struct {
	requests *prometheus.CounterVec
	rows     *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_requests_total", Help: "Catch-up requests served, by stream and HTTP status code."}, []string{"stream", "code"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_rows_total", Help: "Positions (rows sharing one stream ID) served, by stream."}, []string{"stream"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_response_bytes_total", Help: "Bytes of catch-up pages served, by stream."}, []string{"stream"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "server_request_duration_seconds", Help: "Time to answer a catch-up request, by stream.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"stream"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.rows, m.bytes, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// clientMetrics are the client's series.
type clientMetrics struct {
	requests  *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	rows      *prometheus.CounterVec
	duration  *prometheus.HistogramVec
}

// Client request outcomes (label values).
const (
	outcomeOK       = "ok"
	outcomeGone     = "gone"
	outcomeRetry    = "retryable" // 5xx, 429, network error, bad body
	outcomeRejected = "rejected"  // other 4xx: not retried
	outcomeCanceled = "canceled"  // the caller gave up
	outcomeBusy     = "busy"      // no slot of PerSourceLimit in time
	outcomeFallback = "fallback"  // rows read from the fallback Source
	outcomeFailed   = "fallback_failed"
)

func newClientMetrics(reg prometheus.Registerer) *clientMetrics {
	m := &clientMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "client_requests_total", Help: "Catch-up page reads, by stream and outcome (HTTP attempts and fallback reads)."}, []string{"stream", "outcome"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "client_fallbacks_total", Help: "Pages read from the fallback Source instead of the source instance, by stream and cause (no_url, cooldown, or the source's failure)."}, []string{"stream", "cause"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "client_rows_total", Help: "Positions fetched, by stream and source (http or fallback)."}, []string{"stream", "source"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "client_request_duration_seconds", Help: "Duration of one HTTP catch-up attempt, by stream.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"stream"}),
	}
	m.requests = telemetry.Register(reg, m.requests)
	m.fallbacks = telemetry.Register(reg, m.fallbacks)
	m.rows = telemetry.Register(reg, m.rows)
	m.duration = telemetry.Register(reg, m.duration)
	return m
}
