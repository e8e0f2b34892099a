package enginetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
)

// workload writes messages and state events, as test/chaos_load_test.go's
// does, through random instances among those a client can reach (the
// published ones). A failed write is retried with the same transaction ID
// until it is acknowledged, so the oracle can hold the cluster to exactly
// once.
type workload struct {
	targets func() []string // base URLs to write through, as they are now

	mu        sync.Mutex
	acked     map[string]bool
	attempted map[string]bool
	statuses  map[string]int // failed tries by status ("503", "conn" for no answer)
	rejected  []string       // 4xx answers: a bug
	count     atomic.Int64
}

// loadSender prefixes the workload's senders: the oracle counts only its rows.
const loadSender = "@load"

func newWorkload(targets func() []string) *workload {
	return &workload{targets: targets, acked: map[string]bool{}, attempted: map[string]bool{}, statuses: map[string]int{}}
}

// writer writes one transaction after another, pause apart, to random
// rooms until ctx ends.
func (w *workload) writer(ctx context.Context, g int, pause time.Duration) {
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	sender := fmt.Sprintf("%s%d:test", loadSender, g)
	for i := 0; ctx.Err() == nil; i++ {
		w.write(ctx, rng, sender, fmt.Sprintf("g%d-%d", g, i))
		select { // the load's pace
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

type writeAck struct {
	EventID   string `json:"event_id"`
	StreamPos int64  `json:"stream_pos"`
	Writer    string `json:"writer"`
}

// write sends txn (a message, or one time in ten a state event) to a
// random room through random targets until it is acknowledged or ctx ends.
func (w *workload) write(ctx context.Context, rng *rand.Rand, sender, txn string) {
	room := url.PathEscape(fmt.Sprintf("!compose%d:test", rng.IntN(20)))
	method, path := http.MethodPost, "/v1/rooms/"+room+"/messages"
	var body any = map[string]string{"sender": sender, "body": txn, "txn_id": txn}
	if rng.IntN(10) == 0 {
		method, path = http.MethodPut, fmt.Sprintf("/v1/rooms/%s/state/k%d", room, rng.IntN(3))
		body = map[string]any{"sender": sender, "txn_id": txn, "value": map[string]any{"txn": txn}}
	}
	w.mu.Lock()
	w.attempted[txn] = true
	w.mu.Unlock()
	for ctx.Err() == nil {
		ts := w.targets()
		if len(ts) == 0 {
			return
		}
		base := ts[rng.IntN(len(ts))]
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		code, err := send(rctx, method, base+path, body)
		cancel()
		if err == nil {
			w.mu.Lock()
			w.acked[txn] = true
			w.mu.Unlock()
			w.count.Add(1)
			return
		}
		if ctx.Err() != nil {
			return // the load stopped: the outcome is the table's to say
		}
		w.mu.Lock()
		if code/100 == 4 {
			w.rejected = append(w.rejected, fmt.Sprintf("%s %s: %v", method, base+path, err))
			w.mu.Unlock()
			return
		}
		status := "conn"
		if code != 0 {
			status = fmt.Sprint(code)
		}
		w.statuses[status]++
		w.mu.Unlock()
		select { // pacing after a failure, not synchronisation
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// send writes body and checks that the answer acknowledges it.
func send(ctx context.Context, method, u string, body any) (int, error) {
	var a writeAck
	code, err := roomsapi.Call(ctx, method, u, body, &a)
	if err == nil && a.EventID == "" {
		err = fmt.Errorf("%s %s: acknowledgement without an event ID", method, u)
	}
	return code, err
}

// outcome is the acknowledged transactions and those whose reply never
// came (the table says whether they committed), sorted.
func (w *workload) outcome() (acked, unknown []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for txn := range w.attempted {
		if w.acked[txn] {
			acked = append(acked, txn)
		} else {
			unknown = append(unknown, txn)
		}
	}
	slices.Sort(acked)
	slices.Sort(unknown)
	return acked, unknown
}

func (w *workload) failures() (map[string]int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.statuses {
		out[k] = v
	}
	return out, slices.Clone(w.rejected)
}
