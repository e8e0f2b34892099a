package rooms

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"testing"
)

// A sync's limit bounds the events of its answer, whatever the number of
// rooms: paging with limit=10 from before 45 events in 3 rooms gives
// pages of at most 10, limited while more follow, and every event once,
// in stream order. A bad limit is a 400 naming it.
func TestSyncLimitPages(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := e.token(t)
	var want []int64
	for i := range 45 {
		want = append(want, e.post(t, []string{"!a:x", "!b:x", "!c:x"}[i%3]))
	}
	e.seen(t, want[len(want)-1])
	var got []int64
	tok := since
	for page := 0; ; page++ {
		if page > len(want) {
			t.Fatal("paging does not end")
		}
		w := e.call(context.Background(), "since="+url.QueryEscape(tok)+"&timeout_ms=0&limit=10")
		if w.Code != 200 {
			t.Fatalf("page %d: %d %s", page, w.Code, w.Body)
		}
		r := decodeSync(t, w)
		evs := syncEvents(t, r)
		if len(evs) > 10 {
			t.Fatalf("page %d: %d events, limit 10", page, len(evs))
		}
		var pos []int64
		for _, ev := range evs {
			pos = append(pos, ev.StreamPos)
		}
		slices.Sort(pos)
		got = append(got, pos...)
		if more := len(got) < len(want); r.Limited != more {
			t.Fatalf("page %d (%d events, %d of %d so far): limited %v", page, len(evs), len(got), len(want), r.Limited)
		}
		tok = r.NextBatch
		if len(evs) == 0 {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paging gave %v, want %v (each once, in stream order)", got, want)
	}
	for _, bad := range []string{"0", "-1", "501", "ten", "1e1", ""} {
		q := "since=" + url.QueryEscape(since) + "&limit=" + bad
		if bad == "" {
			q += "&limit=5" // given twice
		}
		w := e.call(context.Background(), q)
		var ae apiError
		if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil || w.Code != 400 || ae.Field != "limit" || ae.Error == "" {
			t.Errorf("limit=%q: %d %s; want 400 naming limit", bad, w.Code, w.Body)
		}
	}
}
