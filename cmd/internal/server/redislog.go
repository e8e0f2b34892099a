package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisLogger hands go-redis's log lines (a failed dial, a pool problem)
// to an instance's logger, at WARN, so that a JSON log stays JSON; its
// own logger writes plain text to stderr.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Log(ctx, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}

// logRedisTo sends go-redis's log lines to log. go-redis's logger is one
// per process (redis.SetLogger), so only the binaries' wiring sets it,
// here, as an instance starts; no library package does, least of all on
// import. In a process that runs several instances (tests), the one
// started last logs them all.
func logRedisTo(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }
