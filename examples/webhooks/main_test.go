package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/control"
	"github.com/weft-dev/weft/internal/exampletest"
	"github.com/weft-dev/weft/wefttest"
)

// receipt is one request the receiver accepted.
type receipt struct {
	key      string // Idempotency-Key
	customer string
	order    int
}

// receiver is a flaky webhook endpoint: it fails 20% of requests, hangs
// 2 s on 3%, and refuses order 13 (422) until fixed.
type receiver struct {
	mu       sync.Mutex
	got      []receipt
	fixed    atomic.Bool
	requests atomic.Int64
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.requests.Add(1)
	var o struct {
		Customer string `json:"customer"`
		Order    int    `json:"order"`
	}
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || r.Header.Get("Idempotency-Key") == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	switch x := rand.Float64(); {
	case o.Order == 13 && !rc.fixed.Load():
		http.Error(w, "order 13 is malformed", http.StatusUnprocessableEntity)
		return
	case x < 0.2:
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	case x < 0.23:
		select {
		case <-r.Context().Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
	rc.mu.Lock()
	rc.got = append(rc.got, receipt{key: r.Header.Get("Idempotency-Key"), customer: o.Customer, order: o.Order})
	rc.mu.Unlock()
}

// check reports whether every order up to n was received, the
// duplicates (receipts of a key received before), and fails if a
// customer's orders arrived out of order (a duplicate aside) or an
// order's key changed.
func (rc *receiver) check(t *testing.T, n int) (all bool, dups int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	keys, last := map[int]string{}, map[string]int{}
	for _, r := range rc.got {
		if k, seen := keys[r.order]; seen {
			if k != r.key {
				t.Fatalf("order %d received with keys %s and %s", r.order, k, r.key)
			}
			dups++
			continue
		}
		keys[r.order] = r.key
		if r.order == 13 { // dead-lettered, re-driven after its customer's later orders
			continue
		}
		if l, ok := last[r.customer]; ok && r.order < l {
			t.Fatalf("customer %s: order %d received after order %d", r.customer, r.order, l)
		}
		last[r.customer] = r.order
	}
	return len(keys) == n, dups
}

// Three webhooks processes deliver 600 orders to a receiver that fails
// 20% of requests and hangs 2 s on 3%; mid-run one is killed -9 and
// another stopped past its lease (and let go again). Every order is
// received at least once, each customer's first receipts in order (order
// 13 aside: refused, it is dead-lettered, and received once re-driven);
// the duplicates, rows in flight at the crash and the freeze, are
// counted.
func TestWebhooks(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	r := exampletest.New(t, "webhooks", "unused", "x int", 0)
	m1 := r.Start("-name", "m1", "-url", srv.URL, "-lease", "2s")
	m2 := r.Start("-name", "m2", "-url", srv.URL, "-lease", "2s")
	r.Start("-name", "m3", "-url", srv.URL, "-lease", "2s")
	ctx := context.Background()
	owners := func() int {
		var n int
		_ = r.Pool.QueryRow(ctx, `SELECT count(DISTINCT owner) FROM weft_group_partitions WHERE name = 'webhooks'`).Scan(&n)
		return n
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return owners() == 3 }, "not all three own partitions")
	const orders = 600
	w := r.Start("-write", "600", "-rate", "100", "-name", "w1")
	received := func(n int) func() bool {
		return func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.got) >= n }
	}
	wefttest.Eventually(t, time.Minute, received(100), "no 100 orders received")
	if err := m1.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, time.Minute, received(200), "no 200 orders received")
	var m2Parts []int
	if err := r.Pool.QueryRow(ctx, `SELECT array_agg(partition) FROM weft_group_partitions WHERE name = 'webhooks' AND owner LIKE 'm2-%'`).Scan(&m2Parts); err != nil {
		t.Fatal(err)
	}
	if err := m2.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Stopped until the others own its partitions: past its lease.
	wefttest.Eventually(t, time.Minute, func() bool {
		var n int
		_ = r.Pool.QueryRow(ctx, `SELECT count(*) FROM weft_group_partitions WHERE name = 'webhooks' AND partition = ANY($1)
			AND owner LIKE 'm3-%'`, m2Parts).Scan(&n)
		return n == len(m2Parts)
	}, "m2's partitions %v not taken over while it is stopped", m2Parts)
	if err := m2.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	var pos13 int64
	wefttest.Eventually(t, 2*time.Minute, func() bool {
		dls, err := control.DeadLetters(ctx, r.Pool, "orders", "webhooks")
		if err != nil || len(dls) != 1 {
			return false
		}
		pos13 = dls[0].Pos
		return true
	}, "order 13 not dead-lettered")
	wefttest.Eventually(t, 2*time.Minute, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		n := map[int]bool{}
		for _, x := range rc.got {
			n[x.order] = true
		}
		return len(n) == orders-1
	}, "not every order but 13 received")
	rc.fixed.Store(true)
	var dups int
	wefttest.Eventually(t, time.Minute, func() bool {
		var all bool
		if all, dups = rc.check(t, orders); all {
			return true
		}
		// A re-drive is one attempt, and the receiver still fails 20%:
		// asked again until it lands.
		err := control.RetryDeadLetter(ctx, r.Pool, "orders", "webhooks", pos13)
		if err != nil && !errors.Is(err, control.ErrNoDeadLetter) {
			t.Fatal(err)
		}
		return false
	}, "order 13 not received after its re-drive")
	t.Logf("%d orders, %d requests, %d duplicates (in flight at the kill or the freeze)", orders, rc.requests.Load(), dups)
	if dups > orders/5 {
		t.Fatalf("%d duplicates: more than the rows in flight at two failures could be", dups)
	}
}
