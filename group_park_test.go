package weft_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	grp "github.com/weft-dev/weft/internal/group"
	"github.com/weft-dev/weft/wefttest"
)

// Under DeadLetterPark (a group of 2 members), a key whose row is
// dead-lettered is parked: every other key goes on, those of its
// partition included, while none of its later rows is applied, and they
// are stored as dead letters parked behind it; a restart of the member
// that runs it keeps it parked (its later rows still park); a retry
// while the function still fails leaves every letter, one more attempt
// on the first; a retry of its first letter with the function fixed
// applies every row of the key once, in position order, and the key goes
// on. Discarding the first instead drops it and lets a retry of the next
// re-drive the rest. Both with one batch at a time and with MaxInFlight
// (a transaction per partition).
func TestGroupParkKeepsKeyOrder(t *testing.T) {
	t.Run("retry", func(t *testing.T) { testGroupPark(t, 0, false, false) })
	t.Run("discard/MaxInFlight", func(t *testing.T) { testGroupPark(t, 4, true, false) })
	t.Run("retry/Deliver", func(t *testing.T) { testGroupPark(t, 0, false, true) })
}

func testGroupPark(t *testing.T, maxInFlight int, discard, deliver bool) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `CREATE TABLE got (pos bigint PRIMARY KEY, usr text NOT NULL, n int NOT NULL, seq bigserial)`)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	const users, rows, poisonN, parts = 20, 200, 103, 16 // user u3
	var fixed atomic.Bool
	apply := intoGot(func(n notice) error {
		if n.N == poisonN && !fixed.Load() {
			return weft.Permanent(errors.New("notice 103 is malformed"))
		}
		return nil
	})
	// delivered records a row's effect outside any transaction, at least
	// once (a second delivery of a row records nothing).
	delivered := func(ctx context.Context, r weft.Row) error {
		var n notice
		if err := r.Decode(&n); err != nil {
			return err
		}
		if n.N == poisonN && !fixed.Load() {
			return weft.Permanent(errors.New("notice 103 is malformed"))
		}
		_, err := pool.Exec(ctx, `INSERT INTO got (pos, usr, n) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, r.Pos, n.User, n.N)
		return err
	}
	cfgOf := func(name string) weft.Config {
		cfg := noticesGroup(name, db, rds, 2*time.Second, weft.Consumer{Name: "mailer", Key: "user", Partitions: parts, Apply: apply, MaxBatch: 20, MaxInFlight: maxInFlight,
			OnDeadLetter: weft.DeadLetterPark, Retry: weft.RetryPolicy{MaxAttempts: 2, Initial: 10 * time.Millisecond}})
		if deliver {
			cfg.Consumers[0].Apply, cfg.Consumers[0].Deliver = nil, delivered
		}
		return cfg
	}
	ms := openGroup(t, 2, cfgOf)
	appendNotices(t, w, 0, rows, users)

	// split is the rows of the stream: the poison's position, u3's rows
	// after it, and every other row (u3's before it included).
	split := func() (poison int64, parked, others []int64) {
		all := wefttest.Rows(t, db, notices)
		ns := noticesOf(t, all)
		poison = positionOf(t, all, ns, poisonN)
		for i, r := range all {
			switch {
			case r.Pos == poison:
			case ns[i].User == "u3" && r.Pos > poison:
				parked = append(parked, r.Pos)
			default:
				others = append(others, r.Pos)
			}
		}
		return poison, parked, others
	}
	noneApplied := func(ps []int64) {
		t.Helper()
		got := gotPositions(t, pool)
		for _, p := range ps {
			if got[p] {
				t.Fatalf("row %d of the parked key applied", p)
			}
		}
	}
	// letters waits until the group holds want dead letters, and checks
	// the first is the poison's, the rest parked behind it.
	letters := func(poison int64, want int) {
		t.Helper()
		var dls []weft.DeadLetter
		wefttest.Eventually(t, 30*time.Second, func() bool {
			dls, _ = ms[1].DeadLetters(context.Background(), "notices", "mailer")
			return len(dls) == want
		}, "dead letters %+v; want %d", dls, want)
		for i, d := range dls {
			if d.Key != "u3" || d.Partition != grp.Partition("u3", parts) {
				t.Fatalf("dead letter %+v: want u3's", d)
			}
			switch {
			case i == 0 && (d.Pos != poison || d.Attempts < 1):
				t.Fatalf("first dead letter %+v; want the poison %d after its attempts", d, poison)
			case i > 0 && (d.Attempts != 0 || d.Error != fmt.Sprintf("parked behind position %d", poison)):
				t.Fatalf("dead letter %+v; want it parked behind %d, never tried", d, poison)
			}
		}
	}

	poison, parked, others := split()
	if len(parked) == 0 {
		t.Fatal("no row of u3 after the poison: the test shows nothing")
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, others) }, "the other keys' rows not all applied")
	letters(poison, 1+len(parked))
	noneApplied(append(parked, poison))

	// Restart the member that runs u3's partition: the key stays parked
	// (the dead letters say so), its new rows park, the others go on.
	owner := -1
	wefttest.Eventually(t, 10*time.Second, func() bool {
		for _, gm := range ms[0].Status().Groups[0].Members {
			for i, m := range ms {
				if gm.Member == m.Instance() && slices.Contains(gm.Partitions, grp.Partition("u3", parts)) {
					owner = i
				}
			}
		}
		return owner >= 0
	}, "no member owns u3's partition: %+v (members %s, %s)", ms[0].Status().Groups[0], ms[0].Instance(), ms[1].Instance())
	if err := ms[owner].Close(); err != nil {
		t.Fatal(err)
	}
	ms[owner] = wefttest.Open(t, cfgOf(fmt.Sprintf("m%d", owner)))
	appendNotices(t, w, rows, 100, users)
	poison, parked, others = split()
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, others) }, "the other keys' rows not all applied after the restart")
	letters(poison, 1+len(parked))
	noneApplied(append(parked, poison))

	// A retry while the function still fails: every letter stays.
	dls, err := ms[0].DeadLetters(context.Background(), "notices", "mailer")
	if err != nil {
		t.Fatal(err)
	}
	if err := ms[0].RetryDeadLetter(context.Background(), "notices", "mailer", parked[0]); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool {
		now, _ := ms[0].DeadLetters(context.Background(), "notices", "mailer")
		return len(now) == len(dls) && now[0].Attempts == dls[0].Attempts+1 && now[0].RetryRequestedAt.IsZero()
	}, "the failed retry not recorded on the first letter")
	letters(poison, 1+len(parked))
	noneApplied(append(parked, poison))

	want := append([]int64{poison}, parked...) // the first letter, then the rest
	if discard {
		if err := ms[1].DiscardDeadLetter(context.Background(), "notices", "mailer", poison); err != nil {
			t.Fatal(err)
		}
		want = parked
	} else {
		fixed.Store(true)
	}
	if err := ms[0].RetryDeadLetter(context.Background(), "notices", "mailer", want[0]); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, want) }, "the parked key's rows not applied after the retry")
	letters(poison, 0)
	if got, all := gotPositions(t, pool), wefttest.Rows(t, db, notices); len(got) != len(all)-1-len(parked)+len(want) {
		t.Fatalf("%d rows applied of %d", len(got), len(all))
	}
	// Every key's rows in position order, the parked key's included.
	checkKeyOrder(t, pool, 0)
	// The key goes on: a new row of it is applied.
	appendNotices(t, w, 300, 20, users)
	all := wefttest.Rows(t, db, notices)
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(gotPositions(t, pool)) == len(all)-1-len(parked)+len(want) },
		"the key's new rows not applied after its letters")
	letters(poison, 0)
}

// DeadLetterPark is refused for a single consumer, naming the field.
func TestDeadLetterParkValidated(t *testing.T) {
	for name, c := range map[string]weft.Consumer{
		"no key":  {Stream: "notices", Name: "c", Apply: sent("x"), OnDeadLetter: weft.DeadLetterPark},
		"unknown": {Stream: "notices", Name: "c", Key: "user", Apply: sent("x"), OnDeadLetter: 7},
	} {
		cfg := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{notices},
			Consumers: []weft.Consumer{c}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Consumers[0].OnDeadLetter") {
			t.Errorf("%s: %v; want an error naming Consumers[0].OnDeadLetter", name, err)
		}
	}
	ok := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{notices},
		Consumers: []weft.Consumer{{Stream: "notices", Name: "c", Key: "user", Apply: sent("x"), OnDeadLetter: weft.DeadLetterPark}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a group that parks: %v", err)
	}
}
