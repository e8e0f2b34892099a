package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/redact"
)

// describeMachine reads the CPU model and core count from /proc/cpuinfo
// and the server versions from the servers themselves.
func describeMachine(ctx context.Context, redisURL, dbURL string) (Machine, error) {
	m := Machine{Go: runtime.Version(), CPU: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				m.CPU = strings.TrimSpace(v)
			case "processor":
				m.Cores++
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return m, fmt.Errorf("redis url: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return m, fmt.Errorf("redis at %s: %w (is it running?)", opts.Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			m.Redis = v
		}
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return m, fmt.Errorf("postgres at %s: %w (is it running?)", redact.URL(dbURL), err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&m.Postgres); err != nil {
		return m, fmt.Errorf("postgres version: %w", err)
	}
	return m, nil
}
