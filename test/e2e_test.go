package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

type (
	event    = roomsapi.Event
	syncResp = roomsapi.SyncResponse
)

// history syncs from the beginning until nothing new comes, and returns
// every room's events in the order the instance returned them.
func history(ctx context.Context, t *testing.T, base string) map[string][]event {
	t.Helper()
	out := map[string][]event{}
	since := "m0"
	for range 1000 {
		var r syncResp
		if _, err := roomsapi.Call(ctx, "GET", base+"/v1/sync?timeout_ms=0&since="+url.QueryEscape(since), nil, &r); err != nil {
			t.Fatal(err)
		}
		n := 0
		for room, re := range r.Rooms {
			out[room] = append(out[room], re.Events...)
			n += len(re.Events)
		}
		since = r.NextBatch
		if n == 0 {
			return out
		}
	}
	t.Fatal("sync never ran dry")
	return nil
}

// The acceptance test of the binaries: master, two event writers and two
// workers on private Redis and PostgreSQL; 2,000 messages to random
// instances across 50 rooms; every instance returns all of them exactly
// once, in order per writer, with identical room state.
func TestEndToEnd(t *testing.T) {
	untimed(t)
	rds := testenv.StartRedis(t)
	pg := testenv.StartPostgres(t)
	c := newCluster(t, rds.URL(), pg.NewDatabase(t))
	master, ws := c.startFleet("persister1", "persister2", "sync1", "sync2")
	procs := append([]*proc{master}, ws...)

	ctx := context.Background()
	const messages, rooms = 2000, 50
	var mu sync.Mutex
	acked := map[string]event{} // txn -> the event the write returned
	var writers errgroup.Group
	for g := range 8 {
		writers.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := g; i < messages; i += 8 {
				room := fmt.Sprintf("!room%d:test", rng.IntN(rooms))
				txn := fmt.Sprintf("txn-%d", i)
				p := procs[rng.IntN(len(procs))]
				var resp struct {
					EventID   string `json:"event_id"`
					StreamPos int64  `json:"stream_pos"`
					Writer    string `json:"writer"`
					SyncToken string `json:"sync_token"`
				}
				body := map[string]string{"sender": fmt.Sprintf("@u%d:test", g), "body": fmt.Sprintf("message %d", i), "txn_id": txn}
				if _, err := roomsapi.Call(ctx, "POST", messagesURL(p.url, room), body, &resp); err != nil {
					return err
				}
				mu.Lock()
				acked[txn] = event{EventID: resp.EventID, Room: room, StreamPos: resp.StreamPos, Writer: resp.Writer}
				mu.Unlock()
			}
			return nil
		})
	}
	// State events on a few rooms, through different instances.
	for i := range 10 {
		room := fmt.Sprintf("!room%d:test", i)
		p := procs[i%len(procs)]
		if _, err := roomsapi.Call(ctx, "PUT", p.url+"/v1/rooms/"+url.PathEscape(room)+"/state/topic", map[string]any{"value": fmt.Sprintf("topic %d", i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := writers.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(acked) != messages {
		t.Fatalf("%d writes acknowledged, want %d", len(acked), messages)
	}

	// Every instance has every acknowledged event exactly once, in
	// stream order within its writer, and all instances agree.
	var first map[string][]event
	for _, p := range procs {
		h := history(ctx, t, p.url)
		seen := map[string]int{}
		msgs := 0
		for room, evs := range h {
			last := map[string]int64{}
			for _, e := range evs {
				seen[e.EventID]++
				if e.Room != room {
					t.Fatalf("%s: event %s of room %s listed under %s", p.name, e.EventID, e.Room, room)
				}
				if e.StreamPos <= last[e.Writer] {
					t.Fatalf("%s: room %s: %s at %d after %d (writer %s)", p.name, room, e.EventID, e.StreamPos, last[e.Writer], e.Writer)
				}
				last[e.Writer] = e.StreamPos
				if e.Kind == "message" {
					msgs++
				}
			}
		}
		for txn, a := range acked {
			if seen[a.EventID] != 1 {
				t.Fatalf("%s: acknowledged %s (%s at %d) seen %d times", p.name, txn, a.EventID, a.StreamPos, seen[a.EventID])
			}
		}
		if msgs != messages {
			t.Fatalf("%s: %d messages, want %d", p.name, msgs, messages)
		}
		if first == nil {
			first = h
		} else if !sameHistory(first, h) {
			t.Fatalf("%s returns a different history than %s", p.name, procs[0].name)
		}
	}
	// Identical room state everywhere, equal to what was set.
	for i := range 10 {
		room := fmt.Sprintf("!room%d:test", i)
		var want map[string]any
		for _, p := range procs {
			var st struct {
				State map[string]any `json:"state"`
			}
			if _, err := roomsapi.Call(ctx, "GET", p.url+"/v1/rooms/"+url.PathEscape(room)+"/state", nil, &st); err != nil {
				t.Fatal(err)
			}
			if st.State["topic"] != fmt.Sprintf("topic %d", i) {
				t.Fatalf("%s: room %s state %v", p.name, room, st.State)
			}
			if want == nil {
				want = st.State
			} else if !maps.Equal(want, st.State) {
				t.Fatalf("%s: room %s state %v, others %v", p.name, room, st.State, want)
			}
		}
	}

	// master status and /status: both writers, every instance, lag 0.
	testenv.Eventually(t, 10*time.Second, func() bool {
		out, err := exec.Command(filepath.Join(binDir, "master"), "status", "--json", "--url", master.url).Output()
		if err != nil {
			return false
		}
		var st struct {
			Peers   map[string]struct{ Name string } `json:"peers"`
			Streams []weft.StreamStatus              `json:"streams"`
			Writers []struct{ Name string }          `json:"writers"`
		}
		if json.Unmarshal(out, &st) != nil {
			return false
		}
		names := map[string]bool{}
		for _, p := range st.Peers {
			names[p.Name] = true
		}
		writers := map[string]bool{}
		for _, s := range views(st.Streams) {
			if s.Lag != 0 {
				return false
			}
			writers[s.Writer] = true
		}
		return names["persister1"] && names["persister2"] && names["sync1"] && names["sync2"] && writers["persister1"] && writers["persister2"]
	}, "master status does not show both writers and every worker with lag 0")
	for _, p := range procs {
		testenv.Eventually(t, 10*time.Second, func() bool {
			var st struct {
				Ready   bool                `json:"ready"`
				Streams []weft.StreamStatus `json:"streams"`
			}
			if _, err := roomsapi.Call(ctx, "GET", p.url+"/status", nil, &st); err != nil || !st.Ready {
				return false
			}
			for _, s := range views(st.Streams) {
				if s.Lag != 0 {
					return false
				}
			}
			return true
		}, "%s /status not ready with lag 0", p.name)
	}
}

func sameHistory(a, b map[string][]event) bool {
	if len(a) != len(b) {
		return false
	}
	for room, evs := range a {
		ids := func(es []event) []string {
			out := make([]string, len(es))
			for i, e := range es {
				out[i] = e.EventID
			}
			return out
		}
		if !slices.Equal(ids(evs), ids(b[room])) {
			return false
		}
	}
	return true
}
