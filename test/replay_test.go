package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// Valid but stale input: every line published on the channel during 5 s
// of load (60 s under WEFT_CHAOS=long) is recorded, every instance is restarted, and the recording is
// replayed, in order and then shuffled. Every replayed line is refused and
// counted by every instance, /readyz stays 200 everywhere, forwarding and
// typing keep working, and the chaos oracle finds nothing lost, duplicated
// or reordered.
func TestReplayedChannel(t *testing.T) {
	ch := newChaos(t, chaosOpts{env: []string{"WEFT_HEARTBEAT_INTERVAL=" + heartbeat.String()}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	channel := recordChannel(ctx, t, ch.rds.Addr(), &wg)
	typing := startTyping(ctx, ch, &wg)
	ch.run("replayed-channel", func(ch *chaos) {
		time.Sleep(pick(5*time.Second, 60*time.Second)) // the recording: load, typing, 5 heartbeats of each instance or more
		frames := channel.framesOn()
		lines := 0 // each line of a replayed frame is refused on its own
		for _, f := range frames {
			lines += strings.Count(f.line, "\n") + 1
		}
		for _, name := range chaosNames {
			ch.surgeRestart(name)
		}
		refusals := func() map[string]float64 {
			out := map[string]float64{}
			for _, name := range chaosNames {
				u := ch.get(name).url
				out[name] = metricSum(t, u, `weft_fabric_invalid_commands_total{reason="replayed"}`) +
					metricSum(t, u, `weft_fabric_invalid_commands_total{reason="stale_instance"}`)
			}
			return out
		}
		before := refusals()
		rdb := redis.NewClient(&redis.Options{Addr: ch.rds.Addr()})
		defer rdb.Close()
		shuffled := slices.Clone(frames)
		rand.New(rand.NewPCG(3, 3)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		typedBefore := typing.ok.Load()
		start := time.Now()
		for _, batch := range [][]published{frames, shuffled} {
			// 2,000 lines/s, several times the cluster's own: a replay,
			// not a flood that would starve two cores (a different test).
			pace := time.NewTicker(50 * time.Millisecond)
			for i := 0; i < len(batch); i += 100 {
				<-pace.C
				pipe := rdb.Pipeline()
				for _, p := range batch[i:min(i+100, len(batch))] {
					pipe.Publish(context.Background(), p.channel, p.line)
				}
				if _, err := pipe.Exec(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			pace.Stop()
		}
		end := time.Now()
		t.Logf("replayed %d recorded frames (%d lines) twice in %v", len(frames), lines, end.Sub(start).Round(time.Millisecond))
		for _, name := range chaosNames {
			testenv.Eventually(t, 30*time.Second, func() bool { return refusals()[name]-before[name] >= float64(2*lines) },
				"%s refused %v of the %d replayed lines", name, refusals()[name]-before[name], 2*lines)
			// Live lines sent meanwhile are fresh: refusing one of them
			// would be a lost write, so the count is exact.
			if got := refusals()[name] - before[name]; got != float64(2*lines) {
				t.Errorf("%s refused %v lines, want exactly the %d replayed", name, got, 2*lines)
			}
		}
		notReady, why := ch.o.notReadyIn(start, end.Add(time.Second))
		// A replayed line must not make an instance not ready. On a
		// starved host (load 38 under .ci/run) a live row's RDATA can
		// come after the refresh read it stored, and the instance catches
		// that one row up for a sample or two: that is not the replay.
		live := true
		for _, w := range why {
			live = live && strings.Contains(w, "catching up")
		}
		for name, k := range notReady {
			if live && k <= 3 {
				t.Logf("%s: /readyz not 200 in %d samples during the replay, each catching up a live row", name, k)
				continue
			}
			t.Errorf("%s: /readyz not 200 in %d samples during the replay", name, k)
		}
		for _, w := range why {
			t.Log("not ready: " + w)
		}
		if typing.ok.Load() == typedBefore {
			t.Error("no typing write succeeded during the replay")
		}
		if n := typing.failed.Load(); n > 0 {
			t.Errorf("%d typing writes failed", n)
		}
		ch.loadFor(200)
	})
}

// typingLoad writes typing through random instances until ctx ends.
type typingLoad struct{ ok, failed atomic.Int64 }

func startTyping(ctx context.Context, ch *chaos, wg *sync.WaitGroup) *typingLoad {
	tl := &typingLoad{}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(5, 5))
		for i := 0; ctx.Err() == nil; i++ {
			ts := ch.targets()
			p := ts[rng.IntN(len(ts))]
			room := url.PathEscape(fmt.Sprintf("!chaos%d:test", rng.IntN(chaosRooms)))
			code, err := roomsapi.Call(ctx, "PUT", p.url+"/v1/rooms/"+room+"/typing/@t"+fmt.Sprint(rng.IntN(4))+":test",
				map[string]any{"typing": rng.IntN(2) == 0, "timeout_ms": 5000}, nil)
			switch {
			case err == nil:
				tl.ok.Add(1)
			case ctx.Err() != nil:
				return
			case code == 0 || code == 503:
				// An instance going down or not serving yet: retried.
			default:
				tl.failed.Add(1)
				ch.t.Logf("typing through %s: %v", p.name, err)
			}
			select { // the typing rate, not synchronisation
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return tl
}
