package catchup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/fabrictest"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

var lcEvents = fabrictest.Events()

func lcDB(t *testing.T) *pgxpool.Pool { return fabrictest.EventsDB(t) }

// lcMember is an instance with a node, its catch-up endpoint and a
// recorder.
type lcMember struct {
	node     *fabric.Node
	w        *fabric.Writer
	gen      *streams.Generator
	rec      *fabrictest.Recorder
	http     *httptest.Server
	requests atomic.Int64 // catch-up requests this instance served
	stop     func()
}

type lcOpts struct {
	instance  string
	follow    []core.StreamSpec
	ephemeral []*fabric.Ephemeral // ephemeral streams written here
	listener  net.Listener
}

func startInstance(t *testing.T, pool *pgxpool.Pool, redisURL, writer string, o lcOpts) *lcMember {
	t.Helper()
	ctx := context.Background()
	m := &lcMember{rec: fabrictest.NewRecorder()}
	sql := &SQLSource{Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	sources := map[string]Source{"events": sql}
	for _, e := range o.ephemeral {
		sources[e.Stream()] = e
	}
	srv, err := NewServer(ServerConfig{Secret: testSecret, Sources: sources})
	if err != nil {
		t.Fatal(err)
	}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.requests.Add(1)
		srv.ServeHTTP(w, r)
	})
	m.http = httptest.NewUnstartedServer(counted)
	if o.listener != nil {
		m.http.Listener.Close()
		m.http.Listener = o.listener
	}
	m.http.Start()
	inst := o.instance
	if inst == "" {
		inst = writer + "-aaaaaaaa"
		if writer == "" {
			inst = "reader-aaaaaaaa"
		}
	}
	var gens []*streams.Generator
	var writers []*fabric.Writer
	follow := o.follow
	if follow == nil {
		if writer == "" {
			m.gen, err = streams.Open(ctx, pool, lcEvents, "")
			gens = []*streams.Generator{m.gen}
		} else {
			m.w, err = fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: inst, Name: writer, Stream: lcEvents, NoLease: true})
			if m.w != nil {
				m.gen = m.w.Generator()
				writers = []*fabric.Writer{m.w}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		// A reader's state is at 0: it was offline for everything written so far.
		follow = []core.StreamSpec{{Name: "events", Start: 0}}
	}
	client, err := NewClient(ClientConfig{Secret: testSecret, Fallback: map[string]Source{"events": sql}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := fabric.New(fabric.Config{
		Instance:         inst,
		Cluster:          "lifecycle",
		RedisURL:         redisURL,
		Hello:            fabricHello(inst, m.http.URL),
		Streams:          follow,
		Generators:       gens,
		Writers:          writers,
		Ephemerals:       o.ephemeral,
		Handler:          m.rec,
		Fetcher:          client,
		AnnounceInterval: 100 * time.Millisecond,
		ReplicateWait:    200 * time.Millisecond,
		Backoff:          backoff.Config{Initial: 50 * time.Millisecond, Max: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.node = n
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.Run(runCtx); err != nil {
			t.Errorf("node %s: %v", inst, err)
		}
	}()
	var once sync.Once
	m.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			m.http.Close()
			client.Close()
		})
	}
	t.Cleanup(m.stop)
	return m
}

// write commits one row as m's writer and hands it to the node.
func (m *lcMember) write(ctx context.Context, _ *pgxpool.Pool, i int) error {
	_, err := m.w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		rows := json.RawMessage(fmt.Sprintf(`[{"n":%d}]`, i))
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3)`, ids[0], m.w.Name(), rows)
		return []json.RawMessage{rows}, err
	})
	return err
}

func writeN(t *testing.T, pool *pgxpool.Pool, n int, from int, writers ...*lcMember) {
	t.Helper()
	var g errgroup.Group
	for _, w := range writers {
		g.Go(func() error {
			for i := from; i < from+n; i++ {
				if err := w.write(context.Background(), pool, i); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

func committedIDs(t *testing.T, pool *pgxpool.Pool, writer string) []int64 {
	return fabrictest.Committed(t, pool, writer)
}

func convergedOn(t *testing.T, pool *pgxpool.Pool, reader *lcMember, writers ...string) {
	t.Helper()
	for _, w := range writers {
		want := committedIDs(t, pool, w)
		k := core.Key{Stream: "events", Writer: w}
		testenv.Eventually(t, 60*time.Second, func() bool { return len(reader.rec.Positions(k)) >= len(want) },
			"reader has %d of %d rows of %s", len(reader.rec.Positions(k)), len(want), w)
		if got := reader.rec.Positions(k); !slices.Equal(got, want) {
			t.Fatalf("%s: reader got %d rows, want %d (exactly once, in order)", w, len(got), len(want))
		}
	}
	if p := reader.rec.Problems(); len(p) > 0 {
		t.Fatalf("delivery problems: %v", p)
	}
}

// A reader that was offline while two writers wrote 10,000 rows catches up
// over HTTP, exactly, while new rows keep arriving during the catch-up.
func TestOfflineReaderCatchesUpWhileWritesContinue(t *testing.T) {
	pool := lcDB(t)
	rds := testenv.StartRedis(t)
	w1 := startInstance(t, pool, rds.URL(), "persister1", lcOpts{})
	w2 := startInstance(t, pool, rds.URL(), "persister2", lcOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return w1.node.Ready() && w2.node.Ready() }, "writers not ready")
	writeN(t, pool, 5000, 0, w1, w2)

	reader := startInstance(t, pool, rds.URL(), "", lcOpts{})
	writeN(t, pool, 500, 5000, w1, w2) // during the catch-up
	convergedOn(t, pool, reader, "persister1", "persister2")
	testenv.Eventually(t, 10*time.Second, reader.node.Ready, "reader not ready after catching up")
	if served := w1.requests.Load() + w2.requests.Load(); served == 0 {
		t.Fatal("the catch-up did not go over HTTP")
	}
}

// When the instance that announced a position cannot serve it, a durable
// stream catches up from PostgreSQL.
func TestCatchupFallsBackToDatabase(t *testing.T) {
	pool := lcDB(t)
	rds := testenv.StartRedis(t)
	w1 := startInstance(t, pool, rds.URL(), "persister1", lcOpts{})
	testenv.Eventually(t, 10*time.Second, w1.node.Ready, "writer not ready")
	writeN(t, pool, 2000, 0, w1)
	w1.http.Close() // its endpoint is gone; the node still announces
	reader := startInstance(t, pool, rds.URL(), "", lcOpts{})
	convergedOn(t, pool, reader, "persister1")
	testenv.Eventually(t, 10*time.Second, reader.node.Ready, "reader not ready")
}

// An ephemeral writer restarts as a new instance on the same URL: the
// reader drops the old state and ends with exactly the new one.
func TestEphemeralWriterRestart(t *testing.T) {
	pool := lcDB(t)
	rds := testenv.StartRedis(t)
	typing := []core.StreamSpec{{Name: "typing", Ephemeral: true}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()

	s1 := fabric.NewEphemeral("typing")
	t1 := startInstance(t, pool, rds.URL(), "typist", lcOpts{instance: "typist-aaaaaaaa", follow: typing,
		ephemeral: []*fabric.Ephemeral{s1}, listener: ln})
	reader := startInstance(t, pool, rds.URL(), "", lcOpts{follow: typing})
	testenv.Eventually(t, 10*time.Second, func() bool { return t1.node.Ready() && reader.node.Ready() }, "not ready")

	put := func(s *fabric.Ephemeral, room, users string) {
		rows := json.RawMessage(fmt.Sprintf(`[{"room":%q,"users":%s}]`, room, users))
		if _, err := s.Put(context.Background(), room, rows); err != nil {
			t.Fatal(err)
		}
	}
	put(s1, "r1", `["a"]`)
	put(s1, "r2", `["b"]`)
	put(s1, "r1", `["a","c"]`)
	k := core.Key{Stream: "typing", Writer: "typist"}
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Equal(reader.rec.Positions(k), []int64{1, 2, 3}) },
		"reader has %v of the first instance", reader.rec.Positions(k))

	// The writer restarts on the same address: a new instance, with new
	// state from 0.
	t1.stop()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s2 := fabric.NewEphemeral("typing")
	t2 := startInstance(t, pool, rds.URL(), "typist", lcOpts{instance: "typist-bbbbbbbb", follow: typing,
		ephemeral: []*fabric.Ephemeral{s2}, listener: ln2})
	testenv.Eventually(t, 10*time.Second, t2.node.Ready, "new writer not ready")
	put(s2, "r3", `["d"]`)
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Equal(reader.rec.Positions(k), []int64{1}) && reader.node.Ready() },
		"reader has %v after the restart, want only the new instance's row", reader.rec.Positions(k))
	if got := string(reader.rec.Bodies(k)[0]); got != `[{"room":"r3","users":["d"]}]` {
		t.Fatalf("reader state %s, want the new instance's", got)
	}
	if reader.rec.Resets() == 0 {
		t.Fatal("no reset on the writer's restart")
	}

	// A request for the old instance's range answers 410 -> ErrGone.
	client, err := NewClient(ClientConfig{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	_, err = client.FetchPage(context.Background(), core.Fetch{Key: k, Instance: "typist-aaaaaaaa", URL: t2.http.URL, Ephemeral: true, From: 0, To: 3})
	if !errors.Is(err, fabric.ErrGone) {
		t.Fatalf("fetch of the old instance's range: %v, want ErrGone", err)
	}
}

func fabricHello(inst, url string) wire.Hello {
	name, _, _ := strings.Cut(inst, "-")
	return wire.Hello{Name: name, Role: "test", URL: url, Version: "test"}
}
