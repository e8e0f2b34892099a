package main_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/wefttest"
)

// Issue 34's acceptance: four mailers over a stream that two writers
// append to at a steady rate; one mailer is killed -9, one stopped
// (SIGSTOP) for longer than its lease and then continued, one added, one
// stopped gracefully. Every notice is sent once, each user's in order
// (checked against the outbox table); the partitions of a dead mailer are
// owned again within its lease + 1 s, a leaving one's within its lease
// (the 1 s a leave promises is the group simulation's, on simulated time).
//
// WEFT_CHAOS=long runs four rounds of the four faults, on mailers picked
// at random (each round starts with four), over writers that run four
// times as long.
func TestMailerChaos(t *testing.T) {
	rounds := 1
	if os.Getenv("WEFT_CHAOS") == "long" {
		rounds = 4
	}
	const lease = 2 * time.Second
	r := newRig(t, 3*time.Millisecond)
	running := map[string]*exec.Cmd{}
	next := 0
	add := func() string {
		next++
		name := fmt.Sprintf("m%d", next)
		running[name] = r.Start("-name", name, "-lease", lease.String())
		return name
	}
	names := func() []string { return slices.Sorted(maps.Keys(running)) }
	perWriter := fmt.Sprint(150 * 25 * rounds)
	var writers []*exec.Cmd
	rng := rand.New(rand.NewPCG(34, 34))
	pick := func() string { ns := names(); return ns[rng.IntN(len(ns))] }
	signal := func(name string, sig syscall.Signal) {
		if err := running[name].Process.Signal(sig); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var worstDeath, worstLeave time.Duration
	for round := range rounds {
		for len(running) < 4 {
			add()
		}
		wefttest.Eventually(t, 30*time.Second, func() bool { return r.balanced(names()...) }, "not balanced: %v", r.owners())
		if round == 0 {
			writers = []*exec.Cmd{
				r.Start("-write", perWriter, "-rate", "150", "-name", "w1", "-users", "200"),
				r.Start("-write", perWriter, "-rate", "150", "-name", "w2", "-users", "200"),
			}
		}
		wefttest.Eventually(t, 30*time.Second, func() bool { return r.count() > 300*(round+1) }, "only %d sent", r.count())

		victim := pick()
		parts := r.ownedBy(victim)
		signal(victim, syscall.SIGKILL)
		killed := time.Now()
		_ = running[victim].Wait()
		delete(running, victim)
		took := r.moved(parts, victim, killed, lease+time.Second)
		t.Logf("round %d: %s killed -9: its %d partitions owned again after %v", round, victim, len(parts), took)
		worstDeath = max(worstDeath, took)

		zombie := pick()
		parts = r.ownedBy(zombie)
		signal(zombie, syscall.SIGSTOP)
		stopped := time.Now()
		took = r.moved(parts, zombie, stopped, lease+time.Second)
		t.Logf("round %d: %s stopped: its %d partitions owned again after %v", round, zombie, len(parts), took)
		worstDeath = max(worstDeath, took)
		time.Sleep(time.Until(stopped.Add(lease + 1500*time.Millisecond))) // the fault's length, not a synchronisation
		signal(zombie, syscall.SIGCONT)

		added := add()
		// A joiner's first partitions: what is checked is that it gets
		// some, not how fast a starved host starts a process (CI at load
		// 35: a member stalled 3.6 s, and the joiner had logged nothing
		// after 10 s).
		wefttest.Eventually(t, 30*time.Second, func() bool { return len(r.ownedBy(added)) > 0 }, "%s owns nothing: %v", added, r.owners())
		wefttest.Eventually(t, 10*time.Second, func() bool { return r.balanced(names()...) }, "not balanced after %s joined: %v", added, r.owners())
		t.Logf("round %d: %s added; %s continued; balanced over %d", round, added, zombie, len(running))

		leaver := pick()
		parts = r.ownedBy(leaver)
		signal(leaver, syscall.SIGTERM)
		left := time.Now()
		// The leave's 1 s is the group simulation's bound (on simulated
		// time); a process on a host loaded as make test loads it (a 3.6 s
		// stall seen in .ci/run) is held to less than its lease, which tells
		// a release apart from a lease run out.
		took = r.moved(parts, leaver, left, lease)
		t.Logf("round %d: %s stopped gracefully: its %d partitions owned again after %v", round, leaver, len(parts), took)
		worstLeave = max(worstLeave, took)
		if err := running[leaver].Wait(); err != nil {
			t.Fatalf("%s on SIGTERM: %v", leaver, err)
		}
		delete(running, leaver)
	}
	for _, w := range writers {
		if err := w.Wait(); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	by := r.check()
	t.Logf("%d notices sent once each, in order per user, by %v; partitions owned again after a death within %v (bound %v), after a leave within %v (bound %v)",
		r.count(), by, worstDeath, lease+time.Second, worstLeave, lease)
}
