package telemetry

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestDefaults(t *testing.T) {
	if l := Logger(nil); l == nil || l.Enabled(context.Background(), slog.LevelError) {
		t.Errorf("Logger(nil) = %v, want a logger that discards", l)
	}
	l := slog.Default()
	if Logger(l) != l {
		t.Error("Logger(l) is not l")
	}
	if Registerer(nil) == nil {
		t.Error("Registerer(nil) is nil")
	}
	reg := prometheus.NewRegistry()
	if Registerer(reg) != reg {
		t.Error("Registerer(reg) is not reg")
	}
}

func TestRegisterShares(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "shared_total", Help: "A series two components share."}
	a := Register(reg, prometheus.NewCounter(opts))
	b := Register(reg, prometheus.NewCounter(opts))
	if a != b {
		t.Fatal("the second registration did not return the first collector")
	}
	// Same name, other kind: not shared, but still usable.
	g := Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "shared_total", Help: "A series two components share."}))
	g.Inc()
}
