package test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// ack is one acknowledged write.
type ack struct {
	txn     string
	eventID string
	writer  string
	pos     int64
	at      time.Time
}

// workload writes messages and state events through random instances.
// A failed write is retried with the same transaction ID until it is
// acknowledged, so the oracle can hold the cluster to exactly once.
type workload struct {
	o         *oracle
	mu        sync.Mutex
	acked     map[string]ack
	attempted map[string]bool
	// failedOnce: the writes an attempt of which failed (an error or a
	// timeout): each may have committed all the same.
	failedOnce map[string]bool
	failures   atomic.Int64
	statuses   sync.Map // "503" -> *atomic.Int64
	rooms      int
	// slowest is the longest a write took from its first attempt to its
	// acknowledgement, in nanoseconds (retries included): the longest
	// stall a client saw.
	slowest atomic.Int64
}

func newWorkload(o *oracle, rooms int) *workload {
	return &workload{o: o, acked: map[string]ack{}, attempted: map[string]bool{}, failedOnce: map[string]bool{}, rooms: rooms}
}

const chaosRooms = 30

func (w *workload) writer(ctx context.Context, t *testing.T, g int, targets func() []*proc) {
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	sender := fmt.Sprintf("@load%d:test", g)
	for i := 0; ctx.Err() == nil; i++ {
		if !w.write(ctx, t, rng, sender, fmt.Sprintf("g%d-%d", g, i), targets) {
			return
		}
	}
}

// write sends one message (or, one time in ten, a state event) as txn to
// a random room through random targets until it is acknowledged or ctx
// ends; it reports false after a 4xx (a bug, already reported).
func (w *workload) write(ctx context.Context, t *testing.T, rng *rand.Rand, sender, txn string, targets func() []*proc) bool {
	return w.writeRoom(ctx, t, rng, fmt.Sprintf("!chaos%d:test", rng.IntN(w.rooms)), sender, txn, targets)
}

// writeRoom is write to the given room.
func (w *workload) writeRoom(ctx context.Context, t *testing.T, rng *rand.Rand, roomID, sender, txn string, targets func() []*proc) bool {
	room := url.PathEscape(roomID)
	method, path := "POST", "/v1/rooms/"+room+"/messages"
	var body any = map[string]string{"sender": sender, "body": txn, "txn_id": txn}
	if rng.IntN(10) == 0 {
		method, path = "PUT", fmt.Sprintf("/v1/rooms/%s/state/k%d", room, rng.IntN(3))
		body = map[string]any{"sender": sender, "txn_id": txn, "value": map[string]any{"txn": txn}}
	}
	w.mu.Lock()
	w.attempted[txn] = false
	w.mu.Unlock()
	start := time.Now()
	for ctx.Err() == nil {
		procs := targets()
		p := procs[rng.IntN(len(procs))]
		var resp writeAck
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		code, err := roomsapi.Call(rctx, method, p.url+path, body, &resp)
		cancel()
		if err == nil {
			w.mu.Lock()
			w.acked[txn] = ack{txn: txn, eventID: resp.EventID, writer: resp.Writer, pos: resp.StreamPos, at: time.Now()}
			w.attempted[txn] = true
			w.mu.Unlock()
			w.o.acked(resp.Writer, resp.StreamPos)
			took := int64(time.Since(start))
			for s := w.slowest.Load(); took > s && !w.slowest.CompareAndSwap(s, took); s = w.slowest.Load() {
			}
			break
		}
		if code/100 == 4 {
			t.Errorf("write %s to %s answered %d: %v", txn, p.name, code, err)
			return false
		}
		if ctx.Err() != nil {
			break // the load stopped: not a failure of the cluster
		}
		w.failures.Add(1)
		w.mu.Lock()
		w.failedOnce[txn] = true
		w.mu.Unlock()
		c, _ := w.statuses.LoadOrStore(fmt.Sprint(code), new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
		select { // pacing after a failure, not synchronisation
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// openLoop adds writes at rate per second on top of the closed-loop
// writers, through workers goroutines, each retried until acknowledged as
// the closed-loop ones are. A tick with every worker busy is skipped and
// counted: the client could not keep up.
func (w *workload) openLoop(ctx context.Context, t *testing.T, rate, workers int, targets func() []*proc) (skipped *atomic.Int64) {
	skipped = new(atomic.Int64)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(100+g), uint64(time.Now().UnixNano())))
			for i := range jobs {
				w.write(ctx, t, rng, fmt.Sprintf("@open%d:test", g), fmt.Sprintf("o%d-%d", g, i), targets)
			}
		})
	}
	go func() {
		defer func() { close(jobs); wg.Wait() }()
		i := 0
		testenv.Every(ctx, time.Second/time.Duration(rate), func() {
			select {
			case jobs <- i:
			default:
				skipped.Add(1)
			}
			i++
		})
	}()
	return skipped
}

func (w *workload) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *workload) ackedSnapshot() map[string]ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.acked)
}
