package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/weft-dev/weft/cmd/internal/binproc"
	"github.com/weft-dev/weft/internal/redact"
	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
)

// eventsCfg is the benchmark's durable stream: one sequence, one table
// whose rows column holds each position's JSON rows (the shape the rooms
// workload and the fabric tests use).
var eventsCfg = streams.Config{
	Name:     "events",
	Sequence: "events_seq",
	Tables:   []streams.Table{{Name: "events", IDColumn: "stream_id", WriterColumn: "writer"}},
}

// eventsSchema is the weft stream's table and the raw baselines' twin,
// which has a sequence of its own so the two never share IDs or pages.
const eventsSchema = `
CREATE SEQUENCE events_seq;
CREATE TABLE events (stream_id bigint PRIMARY KEY, writer text NOT NULL, rows jsonb NOT NULL);
CREATE INDEX ON events (writer, stream_id);
CREATE SEQUENCE raw_seq;
CREATE TABLE raw_events (stream_id bigint PRIMARY KEY, writer text NOT NULL, rows jsonb NOT NULL);
CREATE INDEX ON raw_events (writer, stream_id);`

// database is one fresh database for one measurement, dropped by Close.
type database struct {
	admin string
	name  string
	URL   string
	Pool  *pgxpool.Pool
}

// newDatabase creates weft_bench_<random> on the server of admin, migrates
// it and creates the events tables. maxConns bounds the pool.
//
// Unless syncCommit, the database commits without waiting for the WAL
// flush (synchronous_commit = off), for weft and raw alike: on the
// benchmark machine one fdatasync takes about 1.2 ms with outliers of tens
// of milliseconds, which would swamp both sides of every comparison.
func newDatabase(ctx context.Context, admin string, maxConns int32, syncCommit bool) (*database, error) {
	return createDatabase(ctx, admin, maxConns, syncCommit, true)
}

// createDatabase is newDatabase; without withSchema the database is left
// empty (the binaries migrate it themselves).
func createDatabase(ctx context.Context, admin string, maxConns int32, syncCommit, withSchema bool) (*database, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("database name: %w", err)
	}
	d := &database{admin: admin, name: "weft_bench_" + hex.EncodeToString(b[:])}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w (is PostgreSQL running?)", redact.URL(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{d.name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", d.name, err)
	}
	if !syncCommit {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{d.name}.Sanitize()+" SET synchronous_commit = off"); err != nil {
			return nil, errors.Join(fmt.Errorf("database %s: %w", d.name, err), d.drop())
		}
	}
	u, err := url.Parse(admin)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	u.Path = "/" + d.name
	d.URL = u.String()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		return nil, errors.Join(err, d.drop())
	}
	cfg.MaxConns = maxConns
	if d.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, errors.Join(fmt.Errorf("pool %s: %w", d.name, err), d.drop())
	}
	if !withSchema {
		return d, nil
	}
	if _, err := schema.Migrate(ctx, d.Pool, nil); err != nil {
		return nil, errors.Join(fmt.Errorf("migrate %s: %w", d.name, err), d.Close())
	}
	if _, err := d.Pool.Exec(ctx, eventsSchema); err != nil {
		return nil, errors.Join(fmt.Errorf("events schema: %w", err), d.Close())
	}
	return d, nil
}

// Close closes the pool and drops the database, disconnecting whatever
// else is still connected to it.
func (d *database) Close() error {
	if d.Pool != nil {
		d.Pool.Close()
	}
	return d.drop()
}

func (d *database) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

// privateRedis is a redis-server of our own on a free port, for the one
// measurement that kills Redis: the shared 6379 is never touched.
type privateRedis struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrivateRedis(ctx context.Context) (*privateRedis, error) {
	dir, err := os.MkdirTemp("", "weft-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("redis dir: %w", err)
	}
	port, err := binproc.FreePort()
	if err != nil {
		return nil, err
	}
	r := &privateRedis{dir: dir, port: port}
	if err := r.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

func (r *privateRedis) URL() string { return "redis://127.0.0.1:" + strconv.Itoa(r.port) + "/0" }

// start launches the server on r.port and waits until it answers PING.
func (r *privateRedis) start(ctx context.Context) error {
	log, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redis log: %w", err)
	}
	defer log.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(r.done)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(r.port)})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return nil
		}
		select {
		case <-r.done:
			return fmt.Errorf("redis-server on port %d exited (see %s)", r.port, filepath.Join(r.dir, "redis.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d: no PING answer", r.port)
		}
	}
}

// kill is kill -9, and waits for the exit.
func (r *privateRedis) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// Close kills the server and removes its directory.
func (r *privateRedis) Close() {
	r.kill()
	os.RemoveAll(r.dir)
}

// mono is CLOCK_MONOTONIC in nanoseconds: unlike time.Now's monotonic
// reading, it is comparable across processes, so a reader process can
// time a row stamped by the writer process.
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // never fails on Linux
	}
	return ts.Nano()
}

// cpuTime is this process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
