package fabric

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// metrics are the node's Prometheus series. Labels are bounded: verbs,
// reasons, causes and stream names, never positions or instance IDs.
type metrics struct {
	commandsIn     *prometheus.CounterVec
	linesIn        *prometheus.CounterVec
	echoes         prometheus.Counter
	commandsOut    *prometheus.CounterVec
	invalid        *prometheus.CounterVec
	notes          *prometheus.CounterVec
	gaps           *prometheus.CounterVec
	reconnects     prometheus.Counter
	connected      prometheus.Gauge
	established    prometheus.Gauge
	ready          prometheus.GaugeFunc
	viewLag        *prometheus.GaugeVec
	viewLagSecs    *prometheus.GaugeVec
	viewPos        *prometheus.GaugeVec
	tasksRunning   *prometheus.GaugeVec
	taskSeconds    *prometheus.HistogramVec
	taskErrors     *prometheus.CounterVec
	writeGroup     *prometheus.HistogramVec
	writeStatement *prometheus.HistogramVec
	writeOutcomes  *prometheus.CounterVec
	writesInDoubt  *prometheus.GaugeVec
	applied        *prometheus.CounterVec
	persisted      *prometheus.GaugeVec
	position       *prometheus.GaugeVec
	degraded       prometheus.GaugeFunc
	peers          *prometheus.GaugeVec

	// The built-in verbs' series of commandsIn and commandsOut, resolved
	// once, so that no line pays a label lookup. Read-only after
	// newMetrics.
	verbsIn, verbsOut map[string]prometheus.Counter
}

// builtinVerbs are the verbs counted without a label lookup.
var builtinVerbs = []string{wire.VerbRData, wire.VerbPosition, wire.VerbReplicate, wire.VerbHello, wire.VerbBye, wire.VerbSealed}

// received and sent count a command by verb.
func (m *metrics) received(verb string) { countVerb(m.verbsIn, m.commandsIn, verb) }
func (m *metrics) sent(verb string)     { countVerb(m.verbsOut, m.commandsOut, verb) }

func countVerb(known map[string]prometheus.Counter, vec *prometheus.CounterVec, verb string) {
	if c, ok := known[verb]; ok {
		c.Inc()
		return
	}
	vec.WithLabelValues(verb).Inc()
}

// newMetrics registers the node's series. ready is what /readyz says
// (Node.Ready) and degraded whether it rests on PostgreSQL's positions,
// both read at each scrape: the metrics and the health check are one
// truth, never two (issue 48).
func newMetrics(reg prometheus.Registerer, ready, degraded func() bool) (*metrics, error) {
	const ns, sub = "weft", "fabric"
	m := &metrics{
		commandsIn: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "commands_received_total", Help: "Commands received on the channel, by verb (own echoes excluded)."}, []string{"verb"}),
		linesIn: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "lines_received_total", Help: "Lines received, own echoes included, by Redis channel (one per subscribed stream, and the control channel)."}, []string{"channel"}),
		echoes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "echoes_total", Help: "Own commands received back from the channel, dropped before decoding."}),
		commandsOut: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "commands_sent_total", Help: "Commands queued for publishing, by verb."}, []string{"verb"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "invalid_commands_total", Help: "Lines on the channel that were skipped, by reason."}, []string{"reason"}),
		notes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "protocol_events_total", Help: "Stale and dropped commands, resets and failed catch-ups, by stream, kind and cause."}, []string{"stream", "kind", "cause"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "gaps_total", Help: "Gaps detected (something was missed and is fetched), by stream and cause."}, []string{"stream", "cause"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "reconnects_total", Help: "Subscriptions lost and started again."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "connected", Help: "1 while the subscription is confirmed."}),
		established: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "established", Help: "1 once the connection is established (every stream caught up after connecting)."}),
		ready: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "ready", Help: "1 while the instance serves fresh data: what /readyz says at the scrape (ready, or ready degraded: see weft_fabric_degraded)."},
			func() float64 { return b2f(ready()) }),
		viewLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "view_lag", Help: "Largest distance, in stream positions, between a writer's announced position and the local view, by stream."}, []string{"stream"}),
		viewLagSecs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "view_lag_seconds", Help: "How long the most lagging writer of a stream has been ahead of the local view (0 when caught up), by stream."}, []string{"stream"}),
		viewPos: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "view_min_position", Help: "Lowest local view over the writers of a stream."}, []string{"stream"}),
		tasksRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "tasks_running", Help: "Background tasks in flight, by kind."}, []string{"kind"}),
		taskSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "task_duration_seconds", Help: "Duration of background tasks, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"kind"}),
		taskErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "task_errors_total", Help: "Background tasks that failed, by kind."}, []string{"kind"}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "rows_applied_total", Help: "Row batches delivered to the application, by stream and source (live or catchup)."}, []string{"stream", "source"}),
	}
	m.writeGroup = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
		Name: "write_group_calls", Help: "Writes and Inserts of this instance's writer committed together in one transaction (group commit), by stream.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 7)}, []string{"stream"})
	m.writeStatement = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
		Name: "write_statement_calls", Help: "Inserts of this instance's writer run by one statement of a group's pipeline (joined by PerRow), by stream.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 7)}, []string{"stream"})
	m.writeOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "write_outcomes_resolved_total", Help: "Transactions (or autocommit statements) of this instance's writer whose outcome was unknown (a COMMIT's reply lost, a connection failed mid-statement) and was read from the table, by stream and outcome (committed, rolled_back, unknown: nothing in the table could tell)."},
		[]string{"stream", "outcome"})
	m.writesInDoubt = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "writes_in_doubt", Help: "1 while a transaction of this instance's writer has an unknown outcome: the writer's position waits below its IDs until the table says, by stream."},
		[]string{"stream"})
	m.degraded = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "degraded", Help: "1 while the connection, once established, is not (Redis down or reconnecting): readiness then rests on positions followed from PostgreSQL."},
		func() float64 { return b2f(degraded()) })
	m.peers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "peers", Help: "The peer table: live instances, departed ones remembered (to refuse their replayed lines), and writer names with a known holder."}, []string{"kind"})
	m.persisted = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "stream",
		Name: "persisted_upto", Help: "Position at or below which every ID of the stream is persisted, as this instance knows it."}, []string{"stream"})
	m.position = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: "stream",
		Name: "position", Help: "Each writer's position (delivered view; the own position for writers) as this instance knows it."}, []string{"stream", "writer"})
	for _, c := range []prometheus.Collector{m.persisted, m.position, m.commandsIn, m.linesIn, m.echoes, m.commandsOut, m.invalid, m.notes, m.gaps, m.reconnects,
		m.connected, m.established, m.ready, m.viewLag, m.viewLagSecs, m.viewPos, m.tasksRunning, m.taskSeconds, m.taskErrors, m.applied,
		m.degraded, m.peers, m.writeGroup, m.writeStatement, m.writeOutcomes, m.writesInDoubt} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.verbsIn, m.verbsOut = map[string]prometheus.Counter{}, map[string]prometheus.Counter{}
	for _, v := range builtinVerbs {
		m.verbsIn[v] = m.commandsIn.WithLabelValues(v)
		m.verbsOut[v] = m.commandsOut.WithLabelValues(v)
	}
	return m, nil
}
