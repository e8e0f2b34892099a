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
//	(d) a writer never run before started and added (`master writers
//	    add`) while a reader's shard-map follower lags: every read sync3
//	    makes of the shard map is cut (its PostgreSQL proxy) from before
//	    the new writer starts until the readers below have returned its
//	    first rows, sync3 among them.
//
// After each fate a new reader joins (late: killed and started afresh, it
// syncs from the beginning of time), sync1 is killed (SIGKILL) and
// restarted, and sync2, stopped (SIGTERM) before the fate, starts again,
// while the writers (a) and (b) are still down. Each must return every
// write acknowledged so far; and throughout, the oracle holds every reader
// to the table (exactly its rows, in each writer's order), to tokens and
// persisted-upto that never go backwards, and to never being ready while
// behind a writer, listed or not. The removed writer then stops for good.
//
// The next cycle (WEFT_CHAOS=long: three, under more load) meets the same
// fates with the writers rotated and another new one added.
func TestChaosLateReaders(t *testing.T) {
	cycles := pick(1, 3)
	writers := []string{"persister1", "persister2"}
	extra := map[string][]string{"late": nil}
	late := []string{"late"}
	for k := range cycles {
		w := fmt.Sprintf("persister%d", 3+k)
		writers = append(writers, w)
		extra[w] = []string{"--event-writer"}
		late = append(late, w)
	}
	var proxies map[string]*faultproxy.PGProxy
	ch := newChaos(t, chaosOpts{extra: extra, late: late,
		before: func(ch *chaos) { proxies = ch.pgProxies(append(slices.Clone(writers), "sync3")...) }})
	ch.run("late-readers", func(ch *chaos) {
		if chaosLong() {
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			ch.w.openLoop(ctx, t, 50, 8, ch.targets)
		}
		for k := range cycles {
			a, b, fresh := writers[k], writers[k+1], writers[k+2]
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
			ch.afterFate(fresh+" started and added while sync3's follower lags", func() func() {
				lag := ch.lagFollower("sync3", proxies["sync3"])
				ch.c.waitReady(ch.join(fresh))
				// Ready is not held: on a starved host a 3 s lease can lapse
				// between the claim and the first renewal (and the supervisor
				// restarts a writer sealed for it). Add it once it holds.
				waitHeld(t, ch, fresh)
				epoch := ch.changeWriters("add", fresh)
				ch.awaitRowsOf(fresh, 20)
				ch.checkLagging("sync3", epoch)
				return func() {
					ch.checkLagging("sync3", epoch) // all along the readers' checks
					lag.Disarm()
					ch.awaitHandover(epoch)
				}
			})
			ch.leave(a)
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

// lagFollower cuts every read of the shard map that name makes through
// px, from now until the rule returned is disarmed: its follower keeps
// the map it has.
func (ch *chaos) lagFollower(name string, px *faultproxy.PGProxy) *faultproxy.Armed {
	t := ch.t
	t.Helper()
	// The one statement the follower reads the map's epoch with
	// (membership.Store.snapshot).
	rule, err := px.Arm(faultproxy.Rule{Fault: faultproxy.CutAfterSync, Match: "json_object_agg(writer, epoch)", Times: -1})
	if err != nil {
		t.Fatal(err)
	}
	fired := rule.Fired()
	if !testenv.Poll(10*time.Second, func() bool { return rule.Fired() > fired }) {
		t.Fatalf("%s read no shard map in 10 s", name)
	}
	return rule
}

// checkLagging checks that name follows a shard map older than epoch.
func (ch *chaos) checkLagging(name string, epoch int64) {
	t := ch.t
	t.Helper()
	var st statusDoc
	if err := get(context.Background(), 2*time.Second, ch.get(name).url+"/status", &st); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if st.ShardMap == nil || st.ShardMap.Epoch >= epoch {
		t.Fatalf("%s follows shard map %+v, want one before epoch %d: its follower does not lag", name, st.ShardMap, epoch)
	}
	t.Logf("%s follows shard map epoch %d (the map is at %d)", name, st.ShardMap.Epoch, epoch)
}

// down are the instances stopped on purpose and not gone for good (one
// that has not joined yet, or has left, has no view to wait for).
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

// waitHeld waits until a live instance holds writer name (not sealed,
// its lease running), as `master writers add` requires.
func waitHeld(t *testing.T, ch *chaos, name string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() bool {
		conn, err := pgx.Connect(context.Background(), ch.dbURL)
		if err != nil {
			return false
		}
		defer conn.Close(context.Background())
		var held bool
		err = conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM weft_writers WHERE name = $1 AND NOT sealed AND lease_until > now())`, name).Scan(&held)
		return err == nil && held
	}, "no live instance holds writer name %s", name)
}
