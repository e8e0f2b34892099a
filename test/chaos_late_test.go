package test

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
)

// Readers that join, and readers that restart, after each fate an event
// writer can meet:
//
//	(a) killed (SIGKILL) between a COMMIT and publishing it, and sealed by
//	    the master once its lease expired: rows in the table that no line
//	    ever announced;
//	(b) stopped with SIGTERM, sealing itself;
//	(c) removed from the shard map (`master writers remove`): it runs on
//	    and owns nothing, its rows stay;
//	(d) a spare added (`master writers add`) while a reader's shard-map
//	    follower lags: sync3 is stopped (SIGSTOP) through the change and
//	    the new writer's first rows.
//
// After each fate a new reader joins (late: killed and started afresh, it
// syncs from the beginning of time), sync1 is killed (SIGKILL) and
// restarted, and sync2, stopped (SIGTERM) before the fate, starts again,
// while the writers (a) and (b) are still down. Each must return every
// write acknowledged so far; and throughout, the oracle holds every reader
// to the table (exactly its rows, in each writer's order), to tokens and
// persisted-upto that never go backwards, and to never being ready while
// behind a writer, listed or not.
//
// The next cycle (WEFT_CHAOS=long) meets the same fates with the writers
// rotated: the removed one is the next spare.
func TestChaosLateReaders(t *testing.T) {
	writers := []string{"persister1", "persister2", "persister3"}
	var proxies map[string]*faultproxy.PGProxy
	ch := newChaos(t, chaosOpts{
		extra:  map[string][]string{"persister3": {"--event-writer"}, "late": nil},
		late:   []string{"late"},
		before: func(ch *chaos) { proxies = ch.pgProxies(writers...) },
	})
	ch.run("late-readers", func(ch *chaos) {
		if chaosLong() {
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			ch.w.openLoop(ctx, t, 50, 8, ch.targets)
		}
		members, spare := []string{"persister1", "persister2"}, "persister3"
		for range pick(1, 3) {
			a, b := members[0], members[1]
			ch.afterFate(a+" killed after a commit, sealed by the master", func() func() {
				ch.killAfterCommit(a, proxies[a])
				waitSealed(t, ch, a)
				return func() { ch.restart(a) }
			})
			ch.afterFate(b+" stopped, sealed itself", func() func() {
				ch.kill(b, syscall.SIGTERM)
				waitSealed(t, ch, b)
				return func() { ch.restart(b) }
			})
			ch.afterFate(a+" removed", func() func() {
				ch.awaitHandover(ch.changeWriters("remove", a), "sync2")
				return nil
			})
			ch.afterFate(spare+" added while sync3's follower lags", func() func() {
				ch.signal("sync3", syscall.SIGSTOP)
				epoch := ch.changeWriters("add", spare)
				ch.awaitRowsOf(spare, 20)
				ch.signal("sync3", syscall.SIGCONT)
				return func() { ch.awaitHandover(epoch) }
			})
			members, spare = []string{b, spare}, a
		}
	})
}

// afterFate stops sync2, runs fate (which may leave a writer down and
// return what brings it back), then has late join as a new reader, kills
// and restarts sync1, starts sync2 again, and waits until every instance
// that runs has returned every write acknowledged so far; then it runs
// what fate returned and lets the load go on.
func (ch *chaos) afterFate(what string, fate func() (resume func())) {
	t := ch.t
	t.Helper()
	ch.kill("sync2", syscall.SIGTERM)
	resume := fate()
	start := time.Now()
	ps := []*proc{ch.join("late")}
	ch.kill("sync1", syscall.SIGKILL)
	ps = append(ps, ch.relaunch("sync1"), ch.relaunch("sync2"))
	ch.c.waitReady(ps...)
	ready := time.Since(start)
	down := ch.down()
	ch.o.awaitSeen(t, ch.w.ackedSnapshot(), 60*time.Second, down...)
	t.Logf("after %s: late joined, sync1 and sync2 restarted; ready after %v, every acknowledged write returned by every instance (%v down) after %v",
		what, ready.Round(time.Millisecond), down, time.Since(start).Round(time.Millisecond))
	if resume != nil {
		resume()
	}
	ch.loadFor(pick(150, 400))
}

// down are the instances stopped on purpose (after joining, for late ones).
func (ch *chaos) down() []string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var out []string
	for name, held := range ch.held {
		if held && !ch.pending[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// awaitRowsOf waits until the events table holds n rows of writer.
func (ch *chaos) awaitRowsOf(writer string, n int64) {
	t := ch.t
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ch.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var got int64
	testenv.WaitFor(t, 30*time.Second, func() error {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE writer = $1`, writer).Scan(&got); err != nil {
			return err
		}
		if got < n {
			return fmt.Errorf("%d rows of %s in the table, want %d", got, writer, n)
		}
		return nil
	})
	t.Logf("%s has written %d rows", writer, got)
}
