package weft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// An Arrays stream: each position holds its rows as one array, written by
// Append or by a statement of one's own through Node.Write. Followers,
// live or caught up from the table, and consumers get one Row per
// position, its Data the array.
func TestArraysStream(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	batches := weft.Stream{Name: "batches", DataColumn: "rows", Arrays: true}
	cfg := streamConfig(db, rds, batches)
	w := wefttest.Open(t, writerConfig(db, rds, batches))
	live := wefttest.NewRecorder()
	lc := cfg("live")
	lc.Followers = []weft.Follower{{Stream: "batches", Handler: live}}
	wefttest.Open(t, lc)

	ctx := context.Background()
	if _, err := w.Append(ctx, "batches", job{N: 1}); err == nil || !strings.Contains(err.Error(), "not a JSON array") {
		t.Fatalf("Append of an object to an Arrays stream: %v, want refused", err)
	}
	if _, err := w.Append(ctx, "batches", []job{{1}, {2}}, []job{{3}}); err != nil {
		t.Fatal(err)
	}
	own := json.RawMessage(`[{"n":4},{"n":5}]`)
	if _, err := w.Write(ctx, "batches", 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		_, err := tx.Exec(ctx, `INSERT INTO batches (id, writer, rows) VALUES ($1, 'writer', $2)`, ids[0], own)
		return []json.RawMessage{own}, err
	}); err != nil {
		t.Fatal(err)
	}
	want := wefttest.Rows(t, db, batches)
	live.Check(t, want, 30*time.Second)

	late := wefttest.NewRecorder()
	c := cfg("late")
	c.Followers = []weft.Follower{{Stream: "batches", Handler: late, FromStart: true}}
	var mu sync.Mutex
	var consumed []weft.Row
	c.Consumers = []weft.Consumer{{Stream: "batches", Name: "sum", Apply: func(_ context.Context, _ pgx.Tx, rows []weft.Row) error {
		mu.Lock()
		defer mu.Unlock()
		consumed = append(consumed, rows...)
		return nil
	}}}
	wefttest.Open(t, c)
	late.Check(t, want, 30*time.Second)
	wefttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(consumed) >= len(want) },
		"consumed %d of %d positions", len(consumed), len(want))
	wantN := [][]int{{1, 2}, {3}, {4, 5}}
	mu.Lock()
	defer mu.Unlock()
	for what, rows := range map[string][]weft.Row{"live": live.Rows(), "caught up": late.Rows(), "consumed": consumed} {
		if got := arrays(t, rows); !slices.EqualFunc(got, wantN, slices.Equal) {
			t.Errorf("%s: %v, want %v", what, got, wantN)
		}
	}
}

func arrays(t *testing.T, rows []weft.Row) [][]int {
	t.Helper()
	slices.SortFunc(rows, func(a, b weft.Row) int { return int(a.Pos - b.Pos) })
	var out [][]int
	for _, r := range rows {
		var js []job
		if err := r.Decode(&js); err != nil {
			t.Fatalf("row at %d: %s: %v", r.Pos, r.Data, err)
		}
		var ns []int
		for _, j := range js {
			ns = append(ns, j.N)
		}
		out = append(out, ns)
	}
	return out
}

// resetRecorder keeps an ephemeral stream's latest rows per key, and the
// resets it is told of.
type resetRecorder struct {
	mu     sync.Mutex
	rows   []string // the Data given, in order
	resets []string // stream/writer
}

func (r *resetRecorder) Handle(_ context.Context, row weft.Row) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, string(row.Data))
	return nil
}

func (r *resetRecorder) Reset(stream, writer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets = append(r.resets, stream+"/"+writer)
}

func (r *resetRecorder) has(data string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.rows, data)
}

func (r *resetRecorder) resetCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.resets)
}

// An ephemeral stream: what its writer puts reaches a follower on another
// process, one that starts later from the writer's memory, and once the
// writer restarts the follower is told to reset and hears the new one.
func TestEphemeralStream(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	typing := weft.Stream{Name: "typing", Ephemeral: true}
	cfg := streamConfig(db, rds, typing)
	wc := cfg("typist")
	wc.Writes = []string{"typing"}
	wc.Listen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // the late follower fetches from the writer
	w := wefttest.Open(t, wc)
	ctx := context.Background()
	if _, err := w.Append(ctx, "typing", job{N: 1}); err == nil || !strings.Contains(err.Error(), "Node.Put") {
		t.Errorf("Append to an ephemeral stream: %v, want refused pointing at Node.Put", err)
	}
	if _, err := w.Put(ctx, "nope", "k", 1); err == nil || !strings.Contains(err.Error(), "not an ephemeral stream") {
		t.Errorf("Put to an undeclared stream: %v, want refused", err)
	}
	if _, err := w.Put(ctx, "typing", "k"); err == nil || !strings.Contains(err.Error(), "no rows") {
		t.Errorf("Put of no rows: %v, want refused", err)
	}
	put := func(n *weft.Node, key, data string) {
		t.Helper()
		var rows []json.RawMessage
		if err := json.Unmarshal([]byte(data), &rows); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Put(ctx, "typing", key, anys(rows)...); err != nil {
			t.Fatal(err)
		}
	}
	put(w, "r1", `[{"room":"r1","users":["a"]}]`)

	f := &resetRecorder{}
	fc := cfg("reader")
	fc.Followers = []weft.Follower{{Stream: "typing", Handler: f}}
	wefttest.Open(t, fc)
	wefttest.Eventually(t, 30*time.Second, func() bool { return f.has(`[{"room":"r1","users":["a"]}]`) }, "the state before the follower started never came")
	put(w, "r2", `[{"room":"r2","users":["b"]}]`)
	wefttest.Eventually(t, 30*time.Second, func() bool { return f.has(`[{"room":"r2","users":["b"]}]`) }, "a live put never came")
	if _, err := w.Remove(ctx, "typing", "r2", json.RawMessage(`{"room":"r2","users":[]}`)); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return f.has(`[{"room":"r2","users":[]}]`) }, "a removal never came")
	if n := f.resetCount(); n != 0 {
		t.Fatalf("%d resets before the writer restarted", n)
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w2 := wefttest.Open(t, wc)
	put(w2, "r3", `[{"room":"r3","users":["c"]}]`)
	wefttest.Eventually(t, 30*time.Second, func() bool { return f.has(`[{"room":"r3","users":["c"]}]`) && f.resetCount() > 0 },
		"after the writer restarted: the new put or the reset never came (resets %d)", f.resetCount())
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.resets {
		if r != "typing/typist" {
			t.Errorf("reset %s, want typing/typist", r)
		}
	}
}

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}
