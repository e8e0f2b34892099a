package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/engine"
)

// The failover measurement (issue 44, item 5 (b)): three members of a
// consumer group, each a process of its own (the benchmark's binary in
// its hidden "member" mode) with the default 10 s lease, split a stream
// that a writer appends to steadily; one is killed with SIGKILL, and the
// figure is the time from the kill until every partition it owned is
// owned by another member. Members hold a liveness lock the others watch
// (weft), or none (Config.SealDead negative: the lease only, the
// baseline), in the same run.
const (
	failoverMembers = 3
	failoverRate    = 500 // rows a second
)

func measureFailover(ctx context.Context, e *benchEnv) ([]Sample, error) {
	const group = "Failover: kill -9 under load, default 10 s lease"
	var out []Sample
	for _, m := range []struct {
		id, name string
		kill     func(context.Context, *benchEnv, bool) (time.Duration, error)
	}{
		{"failover.writer_kill", "a writer: persisted-upto past its head on every reader, s (raw: the lease only)", writerKill},
		{"failover.member_kill", "a group member's partitions owned again, s (raw: the lease only)", memberKill},
	} {
		seen, err := m.kill(ctx, e, true)
		if err != nil {
			return nil, fmt.Errorf("%s, liveness: %w", m.id, err)
		}
		leased, err := m.kill(ctx, e, false)
		if err != nil {
			return nil, fmt.Errorf("%s, lease only: %w", m.id, err)
		}
		e.log.Info("failover", "figure", m.id, "liveness_s", seen.Seconds(), "lease_only_s", leased.Seconds())
		out = append(out, Sample{ID: m.id, Group: group, Name: m.name, Unit: "s", Weft: seen.Seconds(), Raw: leased.Seconds(), HasRaw: true,
			Goal: &Goal{Kind: GoalAtMost, Value: 1.5}})
	}
	return out, nil
}

// writerKill runs one kill of a writer: a writer process of its own
// (the benchmark's binary in its hidden "writer" mode) and one in this
// process append steadily, a third node reads; the first is killed with
// SIGKILL and the figure is the time until persisted-upto on both
// readers passed the stream's sequence at the kill. Sealers look for
// dead writers (live) or seal by the lease only (SealDead negative).
func writerKill(ctx context.Context, e *benchEnv, live bool) (time.Duration, error) {
	what, sealDead := "failover-writer-lease", -time.Nanosecond
	if live {
		what, sealDead = "failover-writer-live", 0
	}
	g, err := newGroupEnvSealing(ctx, e, what, sealDead)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	reader, err := weft.Open(ctx, g.config(e, what, "reader"))
	if err != nil {
		return 0, err
	}
	g.nodes = append(g.nodes, reader) // Close closes it
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(self, "writer", "-db", g.db.URL, "-redis", e.redisURL, "-cluster", e.cluster(what), "-name", "victim")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the writer: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	wctx, stopWriting := context.WithCancel(ctx)
	wrote := make(chan error, 1)
	go func() { wrote <- g.writeSteadily(wctx) }()
	defer func() { stopWriting(); <-wrote }()
	if err := waitFor(ctx, 60*time.Second, "the writer process writing", func() (bool, error) {
		var n int64
		err := g.pool.QueryRow(ctx, `SELECT count(*) FROM weft_writers w WHERE name = 'victim' AND NOT sealed AND EXISTS (SELECT 1 FROM jobs)`).Scan(&n)
		return err == nil && n > 0, nil
	}); err != nil {
		return 0, err
	}
	// Long enough for the sealers to have seen its liveness lock, and for
	// it to have written under load.
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(2 * time.Second):
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	killed := time.Now()
	var head int64
	if err := g.pool.QueryRow(ctx, `SELECT last_value FROM jobs_seq`).Scan(&head); err != nil {
		return 0, err
	}
	if err := waitFor(ctx, 60*time.Second, "persisted-upto past the dead writer's head", func() (bool, error) {
		return engine.Of(g.writer).Generator("jobs").ComputedUpto() >= head && engine.Of(reader).Generator("jobs").ComputedUpto() >= head, nil
	}); err != nil {
		return 0, err
	}
	return time.Since(killed), nil
}

// writerMain is the hidden "writer" mode: a writer of stream jobs,
// appending failoverRate/2 rows a second until killed or interrupted.
func writerMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("writer", flag.ContinueOnError)
	db := fs.String("db", "", "database URL")
	rds := fs.String("redis", "", "Redis URL")
	cluster := fs.String("cluster", "", "cluster name")
	name := fs.String("name", "w", "process name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	n, err := weft.Open(ctx, weft.Config{Name: *name, DatabaseURL: *db, RedisURL: *rds, Cluster: *cluster, Secret: benchSecret,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Streams: []weft.Stream{{Name: "jobs"}}, Writes: []string{"jobs"}, SealExpired: -1})
	if err != nil {
		return err
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-ctx.Done():
		case <-t.C:
			rows := make([]any, failoverRate/2/50)
			for j := range rows {
				rows[j] = map[string]any{"user": fmt.Sprintf("@w%d:bench", i*len(rows)+j)}
			}
			if _, err := n.Append(ctx, "jobs", rows...); err != nil && ctx.Err() == nil {
				return errors.Join(err, n.Close())
			}
		}
	}
	return n.Close()
}

// memberKill runs one kill: members with liveness locks or without, and
// returns the time from the SIGKILL until the victim's partitions are
// owned by the others.
func memberKill(ctx context.Context, e *benchEnv, live bool) (time.Duration, error) {
	what := "failover-lease"
	if live {
		what = "failover-live"
	}
	g, err := newGroupEnv(ctx, e, what)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	sealDead := "250ms"
	if !live {
		sealDead = "-1ns"
	}
	type member struct {
		cmd  *exec.Cmd
		port int
	}
	var members []member
	defer func() {
		for _, m := range members {
			_ = m.cmd.Process.Kill()
			_ = m.cmd.Wait()
		}
	}()
	for i := range failoverMembers {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		cmd := exec.Command(self, "member", "-db", g.db.URL, "-redis", e.redisURL, "-cluster", e.cluster(what),
			"-name", fmt.Sprintf("m%d", i+1), "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-seal-dead", sealDead)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("start a member: %w", err)
		}
		members = append(members, member{cmd, port})
	}
	owners := func() (map[string][]int, error) {
		rows, err := g.pool.Query(ctx, `SELECT coalesce(owner, ''), partition FROM weft_group_partitions WHERE name = 'g'`)
		if err != nil {
			return nil, err
		}
		out := map[string][]int{}
		var o string
		var p int
		_, err = pgx.ForEachRow(rows, []any{&o, &p}, func() error {
			if i := strings.LastIndexByte(o, '-'); i > 0 {
				o = o[:i] // the process's name
			}
			out[o] = append(out[o], p)
			return nil
		})
		return out, err
	}
	if err := waitFor(ctx, 60*time.Second, "members balanced", func() (bool, error) {
		o, err := owners()
		return err == nil && len(o) == failoverMembers && o[""] == nil, nil
	}); err != nil {
		return 0, err
	}
	wctx, stopWriting := context.WithCancel(ctx)
	wrote := make(chan error, 1)
	go func() { wrote <- g.writeSteadily(wctx) }()
	defer func() { stopWriting(); <-wrote }()
	if live {
		for _, m := range members {
			if err := waitFor(ctx, 30*time.Second, "members watching each other", func() (bool, error) {
				return watchedOn(m.port) == failoverMembers-1, nil
			}); err != nil {
				return 0, err
			}
		}
	}
	if err := waitFor(ctx, 30*time.Second, "rows applied", func() (bool, error) {
		var n int64
		err := g.pool.QueryRow(ctx, `SELECT count(*) FROM weft_group_cursors WHERE name = 'g' AND pos > 0`).Scan(&n)
		return err == nil && n > 0, nil
	}); err != nil {
		return 0, err
	}
	o, err := owners()
	if err != nil {
		return 0, err
	}
	victim := o["m1"]
	if err := members[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	killed := time.Now()
	if err := waitFor(ctx, 60*time.Second, "the dead member's partitions owned again", func() (bool, error) {
		o, err := owners()
		return err == nil && o["m1"] == nil && o[""] == nil, nil
	}); err != nil {
		return 0, err
	}
	took := time.Since(killed)
	e.log.Info("failover", "liveness", live, "partitions", len(victim), "owned_again_after", took)
	return took, nil
}

// writeSteadily appends failoverRate rows a second, 10 an append, until
// ctx ends.
func (g *groupEnv) writeSteadily(ctx context.Context) error {
	t := time.NewTicker(time.Second / (failoverRate / 10))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rows := make([]any, 10)
		for j := range rows {
			rows[j] = map[string]any{"user": fmt.Sprintf("@u%d:bench", (10*i+j)%groupUsers)}
		}
		if _, err := g.writer.Append(ctx, "jobs", rows...); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// watchedOn reads weft_group_members_watched from the member serving
// port; -1 when it cannot.
func watchedOn(port int) int {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "weft_group_members_watched{") {
			var n int
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &n); err == nil {
				return n
			}
		}
	}
	return -1
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// memberMain is the hidden "member" mode: one member of group g of
// stream jobs (keyed by user, 1 ms a row), until killed or interrupted.
func memberMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("member", flag.ContinueOnError)
	db := fs.String("db", "", "database URL")
	rds := fs.String("redis", "", "Redis URL")
	cluster := fs.String("cluster", "", "cluster name")
	name := fs.String("name", "m", "process name")
	listen := fs.String("listen", "", "serve /metrics here")
	sealDead := fs.Duration("seal-dead", 0, "Config.SealDead (negative: no liveness locks)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	apply := func(ctx context.Context, _ pgx.Tx, rows []weft.Row) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(len(rows)) * time.Millisecond):
			return nil
		}
	}
	n, err := weft.Open(ctx, weft.Config{Name: *name, DatabaseURL: *db, RedisURL: *rds, Cluster: *cluster, Secret: benchSecret,
		Listen: *listen, SealDead: *sealDead, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), Streams: []weft.Stream{{Name: "jobs"}},
		Consumers: []weft.Consumer{{Stream: "jobs", Name: "g", Key: "user", Apply: apply}}})
	if err != nil {
		return err
	}
	err = n.Wait(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return errors.Join(err, n.Close())
}
