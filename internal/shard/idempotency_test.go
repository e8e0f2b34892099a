package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestDedupModel checks the table against a naive list of entries: the
// same lookups, whatever the order of inserts, expiries and evictions
// (the ring wraps, grows past minRing and shrinks again).
func TestDedupModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const ttl = 10 * time.Second
		maxEntries := rapid.IntRange(1, 300).Draw(t, "max")
		now := time.Unix(1000, 0)
		d := newDedup(maxEntries, ttl, func() time.Time { return now })
		type entry struct {
			key, fp int
			at      time.Time
		}
		var model []entry // oldest first
		fresh := 1000     // keys above the drawn ones
		expire := func() {
			for len(model) > 0 && now.Sub(model[0].at) >= ttl {
				model = model[1:]
			}
		}
		key := func(i int) dedupKey { return dedupKeyOf("k", fmt.Sprint(i)) }
		fpOf := func(i int) fingerprint { return fingerprint{byte(i)} }
		t.Repeat(map[string]func(*rapid.T){
			"request": func(t *rapid.T) {
				k := rapid.IntRange(0, 500).Draw(t, "key")
				fp := rapid.IntRange(0, 1).Draw(t, "fp")
				expire()
				want := lookupLead
				if i := slices.IndexFunc(model, func(e entry) bool { return e.key == k }); i >= 0 {
					want = lookupCached
					if model[i].fp != fp {
						want = lookupConflict
					}
				}
				how, f, ans := d.begin(key(k), fpOf(fp))
				if how != want {
					t.Fatalf("key %d fp %d: %v, want %v", k, fp, how, want)
				}
				switch how {
				case lookupCached:
					if ans.code != 200 || ans.body != fmt.Sprint(k) {
						t.Fatalf("key %d: replayed %d %q", k, ans.code, ans.body)
					}
				case lookupLead:
					d.finish(key(k), f, answer{code: 200, body: fmt.Sprint(k)}, true)
					if len(model) == maxEntries {
						model = model[1:]
					}
					model = append(model, entry{k, fp, now})
				}
			},
			"burst": func(t *rapid.T) {
				// Fresh keys, enough to grow the ring past minRing.
				for range rapid.IntRange(1, 200).Draw(t, "n") {
					fresh++
					how, f, _ := d.begin(key(fresh), fpOf(0))
					if how != lookupLead {
						t.Fatalf("fresh key %d: %v", fresh, how)
					}
					d.finish(key(fresh), f, answer{code: 200, body: fmt.Sprint(fresh)}, true)
					expire()
					if len(model) == maxEntries {
						model = model[1:]
					}
					model = append(model, entry{fresh, 0, now})
				}
			},
			"wait": func(t *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(0, 12).Draw(t, "seconds")) * time.Second)
			},
			"": func(t *rapid.T) {
				if n := d.len(); n > len(model) || n > maxEntries {
					// The table expires lazily, on the next request: it
					// may hold more than the model, never more than max
					// or than was inserted and not yet evicted.
					t.Fatalf("%d entries, model %d, max %d", n, len(model), maxEntries)
				}
			},
		})
	})
}

func TestDedupKeyIsScoped(t *testing.T) {
	if dedupKeyOf("ab", "c") == dedupKeyOf("a", "bc") {
		t.Error("(ab, c) and (a, bc) share a dedup key")
	}
	if a, b := dedupKeyOf("a", "b"), dedupKeyOf("a", "b"); a != b {
		t.Error("a dedup key is not deterministic")
	}
}

func TestDeriveIdempotencyKey(t *testing.T) {
	long := strings.Repeat("é", 127) + "x" // 255 bytes
	seen := map[string][]string{}
	for _, parts := range [][]string{
		{"@a:x", "1"}, {"@a:x", "my txn"}, {"@a:x", "tx ✓ ü"}, {"@a:x", long},
		{"@a:x", "\x00\x01\n"}, {"@a:x", ""}, {"@a:x1", ""}, {"@a", ":x1"}, {"@a:x"}, {},
	} {
		k := DeriveIdempotencyKey(parts...)
		if p := idempotencyKeyProblem(k); p != "" || len(k) != 43 {
			t.Errorf("%q: key %q (%d bytes): %s", parts, k, len(k), p)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("%q and %q derive the same key", prev, parts)
		}
		seen[k] = parts
		if DeriveIdempotencyKey(parts...) != k {
			t.Errorf("%q: not deterministic", parts)
		}
	}
}

// TestForwardDerivedKeys: request IDs no idempotency key may hold are
// forwarded under derived keys, and a retry still runs once.
func TestForwardDerivedKeys(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w2", "!derived")
	f := c.forwarder(t, "", nil)
	for i, txn := range []string{"my txn", "tx ✓ ü", strings.Repeat("é", 127) + "x"} {
		payload := json.RawMessage(fmt.Sprint(i))
		var first json.RawMessage
		for range 2 {
			res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: payload}, DeriveIdempotencyKey("@a:x", txn))
			if err != nil || res.Err != nil {
				t.Fatalf("txn %q: %v, %v", txn, err, res.Err)
			}
			if first != nil && string(first) != string(res.Value) {
				t.Errorf("txn %q: answers %s then %s", txn, first, res.Value)
			}
			first = res.Value
		}
		if n := rec.count(key, "persist", string(payload)); n != 1 {
			t.Errorf("txn %q ran %d times for a request and its retry, want 1", txn, n)
		}
	}
	// The raw ID is refused, not sent.
	if _, err := f.Do(context.Background(), key, Task{Kind: "persist"}, "my txn"); err == nil || !strings.Contains(err.Error(), "printable ASCII") {
		t.Errorf("raw id with a space: %v", err)
	}
}

// TestForwarderRejections: an owner's 4xx comes back as a *RejectedError
// with its code and field, not retried; a reused key matches
// ErrIdempotencyKeyReused.
func TestForwarderRejections(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w1", "!rejected")
	f := c.forwarder(t, "", nil)
	if _, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`1`)}, "reused"); err != nil {
		t.Fatal(err)
	}
	_, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`2`)}, "reused")
	var rej *RejectedError
	if !errors.Is(err, ErrIdempotencyKeyReused) || !errors.As(err, &rej) || rej.Code != http.StatusUnprocessableEntity ||
		rej.Field != "idempotency_key" || rej.Owner != "w1" {
		t.Errorf("reused key: %v (%+v)", err, rej)
	}
	if n := rec.count(key, "persist", "2"); n != 0 {
		t.Errorf("the refused request ran %d times", n)
	}

	huge := json.RawMessage(`"` + strings.Repeat("x", MaxRequestBody) + `"`)
	_, err = f.Do(context.Background(), key, Task{Kind: "persist", Payload: huge}, "huge")
	if !errors.As(err, &rej) || rej.Code != http.StatusRequestEntityTooLarge || rej.Field != "body" || errors.Is(err, ErrIdempotencyKeyReused) {
		t.Errorf("huge payload: %v (%+v)", err, rej)
	}

	wrong := c.forwarder(t, "", func(cfg *ForwarderConfig) { cfg.Secret = "wrong" })
	_, err = wrong.Do(context.Background(), key, Task{Kind: "persist"}, "")
	if !errors.As(err, &rej) || rej.Code != http.StatusUnauthorized || rej.Field != "" || strings.Contains(rej.Error(), "http://") {
		t.Errorf("wrong secret: %v (%+v)", err, rej)
	}
}

// rooms-like answer: what an event writer returns for a persist.
const persistAnswer = `{"event_id":"$abcdefghijklmnopqrstuvwxyz","stream_pos":1234567,"writer":"persister1"}`

// TestDedupEntryBytes measures the heap an entry holds, with the longest
// keys there are and a persist's answer: it must not grow with the keys.
func TestDedupEntryBytes(t *testing.T) {
	const n = DefaultIdempotencyEntries
	d := newDedup(n, time.Hour, time.Now)
	key := strings.Repeat("k", MaxKeyLen)
	idem := strings.Repeat("i", MaxIdempotencyKeyLen-8)
	body := `{"value":` + persistAnswer + "}\n"
	keys := make([]dedupKey, n) // before the baseline: not the table's
	for i := range keys {
		keys[i] = dedupKeyOf(key, fmt.Sprintf("%s%08d", idem, i))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, k := range keys {
		_, f, _ := d.begin(k, fingerprint{byte(i)})
		// The body as the server renders it: a fresh allocation per answer.
		d.finish(k, f, answer{code: 200, body: strings.Clone(body)}, true)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if d.len() != n {
		t.Fatalf("%d entries, want %d", d.len(), n)
	}
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per idempotency entry (%d entries, %d-byte body)", per, n, len(body))
	if per > 256 {
		t.Errorf("%.0f bytes per entry, want at most 256", per)
	}
	runtime.KeepAlive(keys)
}

// TestDedupShrinks: after a burst expires, the ring and the map give the
// memory back, and the entries left are still found.
func TestDedupShrinks(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newDedup(10_000, time.Minute, func() time.Time { return now })
	add := func(name string) {
		k := dedupKeyOf("k", name)
		how, f, _ := d.begin(k, fingerprint{})
		if how != lookupLead {
			t.Fatalf("%s: %v", name, how)
		}
		d.finish(k, f, answer{code: 200, body: name}, true)
	}
	for i := range 5000 {
		add(fmt.Sprint("burst", i))
	}
	burst := len(d.ring)
	now = now.Add(30 * time.Second)
	for i := range 10 {
		add(fmt.Sprint("late", i))
	}
	now = now.Add(40 * time.Second) // the burst expires, the late ones not
	for i := range 10 {
		how, _, ans := d.begin(dedupKeyOf("k", fmt.Sprint("late", i)), fingerprint{})
		if how != lookupCached || ans.body != fmt.Sprint("late", i) {
			t.Fatalf("late%d after the burst expired: %v %q", i, how, ans.body)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n != 10 || len(d.index) != 10 || len(d.ring) >= burst/4 {
		t.Errorf("after the burst: %d entries, %d indexed, ring %d (was %d)", d.n, len(d.index), len(d.ring), burst)
	}
}
