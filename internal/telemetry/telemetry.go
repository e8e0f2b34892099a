// Package telemetry holds what weft's components do alike with the Logger
// and Registerer of their configs: the defaults when none is given, and
// series that several components of one kind share.
package telemetry

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Logger returns l, or a logger that discards everything when l is nil
// (a config's "Logger; nil discards").
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// Registerer returns r, or a new private registry when r is nil (a
// config's "nil means a private registry"): the component's series then
// work but are not exported.
func Registerer(r prometheus.Registerer) prometheus.Registerer {
	if r == nil {
		return prometheus.NewRegistry()
	}
	return r
}

// Register registers c with reg, or returns the collector already
// registered under its name, so that several components (queues, clients,
// servers) may share one registerer and its series. Any other failure
// leaves c working but unexported.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	return c
}
