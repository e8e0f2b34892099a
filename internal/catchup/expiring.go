package catchup

import (
	"sync"
	"time"
)

// maxExpiring bounds each expiring set: sources cooling down, and
// fallback warnings being deduplicated. A cluster has far fewer live
// instances; the bound only matters when instances come and go faster
// than entries expire, and then losing the entry closest to expiry costs
// one more source timeout or one more log line, never a row.
const maxExpiring = 1024

// expiring is a set of keys that each expire at their own time, bounded at
// max entries. It is safe for concurrent use.
type expiring struct {
	max int
	now func() time.Time // time.Now; tests inject a clock

	mu sync.Mutex
	m  map[string]expEntry
}

type expEntry struct {
	until time.Time
	hits  int // calls to hit while the entry was live, the first excluded
}

func newExpiring(max int) *expiring {
	return &expiring{max: max, now: time.Now, m: map[string]expEntry{}}
}

// live reports whether key is in the set and not yet expired.
func (e *expiring) live(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.m[key]
	if ok && !e.now().Before(en.until) {
		delete(e.m, key)
		return false
	}
	return ok
}

// put adds key until d from now, or moves its expiry there.
func (e *expiring) put(key string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	en := e.m[key]
	en.until = now.Add(d)
	e.store(now, key, en)
}

// remove drops key.
func (e *expiring) remove(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, key)
}

// hit reports whether key is new (absent or expired) and, if so, adds it
// for d and returns the hits its previous entry absorbed; a live key only
// counts the hit. It is "once per d" with a count of what was skipped.
func (e *expiring) hit(key string, d time.Duration) (first bool, skipped int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	en, ok := e.m[key]
	if ok && now.Before(en.until) {
		en.hits++
		e.m[key] = en
		return false, 0
	}
	e.store(now, key, expEntry{until: now.Add(d)})
	return true, en.hits
}

// len is the number of entries held, expired or not.
func (e *expiring) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
}

// store sets key, making room first when the set is full: the expired
// entries go, and if none has, the one closest to expiry.
func (e *expiring) store(now time.Time, key string, en expEntry) {
	if _, ok := e.m[key]; !ok && len(e.m) >= e.max {
		for k, v := range e.m {
			if !now.Before(v.until) {
				delete(e.m, k)
			}
		}
		if len(e.m) >= e.max {
			var oldest string
			var at time.Time
			found := false
			for k, v := range e.m {
				if !found || v.until.Before(at) {
					oldest, at, found = k, v.until, true
				}
			}
			delete(e.m, oldest)
		}
	}
	e.m[key] = en
}
