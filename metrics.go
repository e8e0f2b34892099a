package weft

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the front door's own series; the layers under it register
// theirs. Labels are bounded: stream and consumer names.
type metrics struct {
	rows      *prometheus.CounterVec
	fails     *prometheus.CounterVec
	handovers *prometheus.CounterVec
	expired   *prometheus.CounterVec
	attempts  *prometheus.CounterVec
	dead      *prometheus.CounterVec
	pruned    *prometheus.CounterVec
	lag       *lagCollector
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "consumer", Name: "rows_total",
			Help: "Rows a consumer applied (committed with its cursor), by stream and consumer."}, []string{"stream", "consumer"}),
		fails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "consumer", Name: "batch_failures_total",
			Help: "A consumer's batches rolled back (its function's error, or the database's), by stream and consumer."}, []string{"stream", "consumer"}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "group", Name: "handovers_total",
			Help: "Partitions of a consumer group this member took, released, or lost (taken over after its lease ran out), by stream, consumer and event."},
			[]string{"stream", "consumer", "event"}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "group", Name: "members_expired_total",
			Help: "Other members of a consumer group this member took for dead (their liveness lock gone past the grace) and whose lease it ended, by stream and consumer."},
			[]string{"stream", "consumer"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "consumer", Name: "attempts_total",
			Help: "Failed attempts of a consumer's function at a position (each is retried, or dead-lettered after the last), by stream and consumer."},
			[]string{"stream", "consumer"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "consumer", Name: "dead_letters_total",
			Help: "Positions a consumer dead-lettered (its retry policy gave up, or a permanent error; or parked behind one), by stream and consumer."},
			[]string{"stream", "consumer"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "stream", Name: "pruned_rows_total",
			Help: "Table rows this process deleted by a stream's Retention, by stream."}, []string{"stream"}),
		lag: &lagCollector{},
	}
	for _, c := range []prometheus.Collector{m.rows, m.fails, m.handovers, m.expired, m.attempts, m.dead, m.pruned, m.lag} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// lagCollector reports each consumer's cursor and lag when scraped.
type lagCollector struct{ n atomic.Pointer[Node] } // set once the consumers are built

var (
	posDesc      = prometheus.NewDesc("weft_consumer_position", "A consumer's cursor: every row at or below it is applied.", []string{"stream", "consumer"}, nil)
	lagPosDesc   = prometheus.NewDesc("weft_consumer_lag_positions", "How far a consumer's cursor is behind its stream's persisted-upto, in positions.", []string{"stream", "consumer"}, nil)
	lagSecsDesc  = prometheus.NewDesc("weft_consumer_lag_seconds", "How long the oldest row a consumer has not applied has waited; 0 when caught up.", []string{"stream", "consumer"}, nil)
	ownedDesc    = prometheus.NewDesc("weft_group_partitions_owned", "How many partitions of a consumer group this member owns and runs.", []string{"stream", "consumer"}, nil)
	deadDesc     = prometheus.NewDesc("weft_consumer_dead_letters", "A consumer's dead letters stored now (a group's, as each member last read them, about every announce interval).", []string{"stream", "consumer"}, nil)
	inFlightDesc = prometheus.NewDesc("weft_group_in_flight", "A consumer group member's partitions being applied or delivered apart, each in a lane of its own (Deliver, or Apply with MaxInFlight); 0 for batches.", []string{"stream", "consumer"}, nil)
	pausedDesc   = prometheus.NewDesc("weft_consumer_paused", "1 while a consumer or group is paused (PauseConsumer, `master consumers pause`), as this process last read it; else 0.", []string{"stream", "consumer"}, nil)
)

func (l *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- posDesc
	ch <- lagPosDesc
	ch <- lagSecsDesc
	ch <- ownedDesc
	ch <- deadDesc
	ch <- pausedDesc
	ch <- inFlightDesc
	ch <- livenessHeldDesc
	ch <- watchedDesc
}

func (l *lagCollector) Collect(ch chan<- prometheus.Metric) {
	n := l.n.Load()
	if n == nil {
		return
	}
	for _, c := range n.consumer {
		s := c.status()
		ch <- prometheus.MustNewConstMetric(posDesc, prometheus.GaugeValue, float64(s.Pos), s.Stream, s.Name)
		ch <- prometheus.MustNewConstMetric(lagPosDesc, prometheus.GaugeValue, float64(s.LagPositions), s.Stream, s.Name)
		ch <- prometheus.MustNewConstMetric(lagSecsDesc, prometheus.GaugeValue, s.LagSeconds, s.Stream, s.Name)
		ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, float64(s.DeadLetters), s.Stream, s.Name)
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, gauge(s.Paused), s.Stream, s.Name)
	}
	for _, g := range n.groups {
		g.collect(ch)
	}
}

// gauge is a boolean as a gauge's value.
func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
