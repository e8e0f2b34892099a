package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// Issue 44's acceptance for group members, with the example's default
// lease (10 s): under load, a mailer killed -9 has its partitions owned
// again within about a second (its liveness session ended with it), not
// its lease; a mailer stopped (SIGSTOP) keeps its session and is left to
// its lease; a mailer whose liveness session is ended and kept from it
// past the grace while it runs is taken for dead, fenced, and joins
// again. Every notice is sent once, each user's in order.
func TestMailerDeathSeenWithTheDefaultLease(t *testing.T) {
	const lease = 10 * time.Second // the example's default
	r := newRig(t, 3*time.Millisecond)
	procs := map[string]*exec.Cmd{}
	ports := map[string]int{}
	for _, n := range []string{"m1", "m2", "m3"} {
		ports[n] = testenv.FreePort(t)
		procs[n] = r.Start("-name", n, "-listen", fmt.Sprintf("127.0.0.1:%d", ports[n]))
	}
	wefttest.Eventually(t, 60*time.Second, func() bool { return r.balanced("m1", "m2", "m3") }, "not balanced: %v", r.owners())
	w1 := r.Start("-write", "3000", "-rate", "150", "-name", "w1", "-users", "200")
	w2 := r.Start("-write", "3000", "-rate", "150", "-name", "w2", "-users", "200")
	wefttest.Eventually(t, 30*time.Second, func() bool { return r.count() > 300 }, "only %d sent", r.count())
	// Every member has seen the others' liveness locks.
	for _, n := range []string{"m1", "m2", "m3"} {
		wefttest.Eventually(t, 10*time.Second, func() bool { return watched(ports[n]) == 2 }, "%s never saw the others' liveness locks", n)
	}

	parts := r.ownedBy("m1")
	if err := procs["m1"].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = procs["m1"].Wait()
	death := r.moved(parts, "m1", killed, lease/2)
	t.Logf("m1 killed -9: its %d partitions owned again after %v (lease %v)", len(parts), death.Round(time.Millisecond), lease)

	// Stopped: its session stays, the signal never comes; the lease does.
	wefttest.Eventually(t, 10*time.Second, func() bool { return r.balanced("m2", "m3") }, "not balanced over m2 and m3: %v", r.owners())
	parts = r.ownedBy("m2")
	if err := procs["m2"].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	frozen := r.moved(parts, "m2", stopped, lease+time.Second)
	t.Logf("m2 stopped: its %d partitions owned again after %v (its lease)", len(parts), frozen.Round(time.Millisecond))
	if frozen < 2*lease/3 {
		t.Fatalf("m2's partitions moved %v after SIGSTOP, before its lease could have run out (renewed every %v)", frozen, lease/3)
	}
	if err := procs["m2"].Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return r.balanced("m2", "m3") }, "m2 never joined again: %v", r.owners())

	// A false signal: m3's liveness session ended and its lock kept
	// from it past the grace, while it runs: m2 takes it for dead and
	// ends its lease. (Whether its partitions then move is a race m3 may
	// win: it finds itself out of the group and joins again at once, and
	// a live member's partitions are not taken.) A round of m2's that
	// fails meanwhile (a host at load 40) forgets what it saw, and leaves
	// m3 to its lease: then the lock is given back and kept again.
	expired := metric(ports["m2"], "weft_group_members_expired_total{")
	for attempt := 1; ; attempt++ {
		wefttest.Eventually(t, 10*time.Second, func() bool { return watched(ports["m2"]) == 1 }, "m2 never saw m3's liveness lock")
		release := keepLock(t, r, "m3")
		taken := testenv.Poll(10*time.Second, func() bool { return metric(ports["m2"], "weft_group_members_expired_total{") > expired })
		release()
		if taken {
			break
		}
		if attempt == 3 {
			t.Fatalf("m3 was never taken for dead in %d attempts (owners %v)", attempt, r.owners())
		}
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return r.balanced("m2", "m3") }, "m3 never joined again: %v", r.owners())
	if procs["m3"].ProcessState != nil {
		t.Fatalf("m3 exited: %v", procs["m3"].ProcessState)
	}

	for _, w := range []*exec.Cmd{w1, w2} {
		if err := w.Wait(); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	by := r.check()
	t.Logf("%d notices sent once each, in order per user, by %v; kill -9: partitions owned again after %v; SIGSTOP (the lease): %v",
		r.count(), by, death.Round(time.Millisecond), frozen.Round(time.Millisecond))
}

// watched is weft_group_members_watched on the mailer serving port: the
// other members whose liveness lock it saw held at its last look; -1 if
// it cannot be read.
func watched(port int) int {
	return metric(port, "weft_group_members_watched{")
}

// metric is the value of the first series on the mailer serving port
// whose line starts with prefix; -1 if it cannot be read.
func metric(port int, prefix string) int {
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
		if strings.HasPrefix(l, prefix) {
			var n int
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &n); err == nil {
				return n
			}
		}
	}
	return -1
}

// keepLock ends the liveness session of mailer name and keeps its lock
// from it until release is called: a session of the test's queues a
// shared request for the lock first, which the server grants when the
// session ends, before the mailer's own new request.
func keepLock(t *testing.T, r *rig, name string) (release func()) {
	t.Helper()
	ctx := context.Background()
	var app string
	if err := r.Pool.QueryRow(ctx, `SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'weft member ' || $1 || '-% notices/mailer'`, name).Scan(&app); err != nil {
		t.Fatalf("%s's liveness session: %v", name, err)
	}
	member := strings.Fields(app)[2]
	conn, err := pgx.Connect(ctx, r.Pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	release = func() { _ = conn.Close(ctx) } // the lock goes with the session
	t.Cleanup(release)
	kept := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared(hashtextextended('weft member notices/mailer ' || $1, 0))`, member)
		kept <- err
	}()
	wefttest.Eventually(t, 10*time.Second, func() bool {
		var waiting bool
		_ = r.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' AND NOT granted)`).Scan(&waiting)
		return waiting
	}, "the test's request for %s's lock never queued", name)
	if _, err := r.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
		t.Fatal(err)
	}
	if err := <-kept; err != nil {
		t.Fatal(err)
	}
	return release
}
