package rooms

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/testenv"
)

const testSecret = "rooms-test-secret-0123456789"

// writers is one event writer ("w1", owning every room) in-process, and
// two client APIs in front of it: the owner's, whose writes go to its
// local queue, and a worker's, whose writes are forwarded over HTTP to the
// owner's shard.Server, as between two instances. Both share the owner's
// node, so a forwarded write is visible to the worker at once.
type writers struct {
	pool          *pgxpool.Pool
	owner, worker http.Handler
	workerFwd     *shard.Forwarder
	srv           *httptest.Server
	exec          shard.Exec // the owner's, called directly

	mu       sync.Mutex
	ownerURL string // what the worker resolves w1 to; "" for none
}

func newWriters(t *testing.T) *writers {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last
	log := slog.New(slog.DiscardHandler)
	pool, _ := testenv.NewPool(t)
	redisURL := testenv.SharedRedisURL(t)
	ctx := context.Background()
	if err := Migrate(ctx, pool, log); err != nil {
		t.Fatal(err)
	}
	inst, err := instance.NewID("w1")
	if err != nil {
		t.Fatal(err)
	}
	ew, err := fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: inst, Name: "w1", Stream: Events()})
	if err != nil {
		t.Fatal(err)
	}
	gen := ew.Generator()
	var b [6]byte
	_, _ = rand.Read(b[:])
	sql := &catchup.SQLSource{Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: testSecret, Fallback: map[string]catchup.Source{EventsStream: sql}})
	if err != nil {
		t.Fatal(err)
	}
	live := NewLive()
	node, err := fabric.New(fabric.Config{
		Instance: inst, Cluster: "rooms-test-" + hex.EncodeToString(b[:]), RedisURL: redisURL, Secret: testSecret,
		Hello:   wire.Hello{Name: "w1", Role: "worker", Version: "test"},
		Streams: []core.StreamSpec{{Name: EventsStream, Start: gen.StoredUpto()}},
		Writers: []*fabric.Writer{ew}, Handler: fabricLive{live}, Fetcher: fetcher,
		AnnounceInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := shard.NewMap([]string{"w1"})
	q, err := shard.NewQueue(shard.QueueConfig{Exec: OwnerExec(ew)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := shard.NewServer(shard.ServerConfig{Self: "w1", Map: m, Queue: q, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = node.Run(runCtx) })
	wg.Go(func() { _ = q.Run(runCtx) })
	w := &writers{pool: pool, srv: httptest.NewServer(srv), exec: OwnerExec(ew)}
	w.ownerURL = w.srv.URL
	ownerFwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: "w1", Map: m, Local: q,
		Resolve: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	w.workerFwd, err = shard.NewForwarder(shard.ForwarderConfig{Map: m, Resolve: w.resolve, Secret: testSecret,
		Backoff: backoff.Config{Initial: time.Millisecond, Max: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.srv.Close()
		ownerFwd.Close()
		w.workerFwd.Close()
		stop()
		wg.Wait()
		fetcher.Close()
	})
	service := func(f Forwarder) http.Handler {
		mux := http.NewServeMux()
		NewService(Config{Pool: pool, Events: gen, Node: node, Live: live, EventsForwarder: f,
			TypingWriter: "w1", VisibleTimeout: 10 * time.Second, Logger: log}).Routes(mux)
		return mux
	}
	w.owner, w.worker = service(ownerFwd), service(w.workerFwd)
	testenv.Eventually(t, 10*time.Second, node.Ready, "the node never became ready")
	return w
}

// fabricLive hands a fabric node's deliveries to Live as weft does.
type fabricLive struct{ *Live }

func (f fabricLive) Apply(ctx context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	return f.Handle(ctx, row(k, pos, rows))
}

func (f fabricLive) Reset(k core.Key) { f.Live.Reset(k.Stream, k.Writer) }

func (w *writers) resolve(string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ownerURL, w.ownerURL != ""
}

// ownerAt makes the worker resolve w1 to url ("" for none).
func (w *writers) ownerAt(url string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ownerURL = url
}

// do sends one request to h.
func do(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), method, path, bytes.NewReader([]byte(body))))
	return rec
}
