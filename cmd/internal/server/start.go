package server

import (
	"log/slog"
)

// logStart is the first line of every instance: which build, in which
// role, and the warnings about its configuration an operator must see
// before anything else (the libraries warn about a short secret).
func logStart(log *slog.Logger, cfg Config, role string) {
	b := Build()
	log.Info("starting", "role", role, "name", cfg.Name, "version", b.Version, "revision", b.Revision, "go", b.GoVersion,
		"http", cfg.HTTPAddr, "cluster", cfg.Cluster)
	if cfg.Secret == "" && cfg.Insecure {
		log.Warn("running without a secret (--insecure): anyone who can publish on the Redis channel or reach /_weft/ can forge positions and writes; for development only")
	}
}
