package fabric_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// The examples need a PostgreSQL with weft's schema (schema.Migrate) and a
// ledger table, and a Redis: they compile in `make test`; docs/LIBRARY.md
// shows the same calls.

var ledger = streams.Config{
	Name:     "ledger",
	Sequence: "ledger_seq",
	Tables:   []streams.Table{{Name: "ledger", IDColumn: "stream_id", WriterColumn: "writer"}},
}

// printer is a Handler: each writer's rows once, in order.
type printer struct{}

func (printer) Apply(_ context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	log.Printf("%s at %d: %s", k, pos, rows)
	return nil
}

func (printer) Reset(core.Key) {}

// A writer of a durable stream: OpenWriter claims the writer name, the
// node owns it from then on (lease renewal, seal and BYE on a graceful
// stop), and Write is the whole write, in its one right order.
func ExampleOpenWriter() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	id, _ := instance.NewID("ledger1")
	w, err := fabric.OpenWriter(ctx, pool, fabric.WriterConfig{
		Instance: id, Name: "ledger1", Stream: ledger,
		Wait: true, // a second process with the name waits for the first to go
		URL:  "http://10.0.0.5:8080",
	})
	if err != nil {
		log.Fatal(err) // streams.ErrNameHeld without Wait; a *streams.CheckError for a bad sequence
	}
	sql := &catchup.SQLSource{Pool: pool, Table: "ledger", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: "s3cret", Fallback: map[string]catchup.Source{"ledger": sql}})
	if err != nil {
		log.Fatal(err)
	}
	node, err := fabric.New(fabric.Config{
		Instance: id, Cluster: "prod", RedisURL: "redis://127.0.0.1:6379/0", Secret: "s3cret",
		Hello:   wire.Hello{Name: "ledger1", URL: "http://10.0.0.5:8080"},
		Streams: []core.StreamSpec{{Name: "ledger", Start: w.Generator().StoredUpto()}},
		Writers: []*fabric.Writer{w},
		Handler: printer{}, Fetcher: fetcher,
	})
	if err != nil {
		log.Fatal(err)
	}
	go node.Run(ctx) // on ctx's end: seals the writer, announces it, says BYE

	ids, err := w.Write(ctx, 2, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		rows := make([]json.RawMessage, len(ids))
		for i, id := range ids {
			rows[i] = json.RawMessage(`[{"amount":10}]`)
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (stream_id, writer, rows) VALUES ($1, $2, $3)`, id, w.Name(), rows[i]); err != nil {
				return nil, err // rolls back; nothing reaches readers
			}
		}
		return rows, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Read your writes: this node's own view covers them at once.
	_ = node.WaitFor(ctx, core.Key{Stream: "ledger", Writer: "ledger1"}, ids[len(ids)-1])
}

// The one-statement write: the statement draws its IDs from the sequence
// and returns each with the index of its row. The rows go in as PerRow,
// so that the Inserts that group-commit together run as one statement.
func ExampleWriter_Insert() {
	ctx := context.Background()
	var w *fabric.Writer // from OpenWriter, bound to a node
	rows := []json.RawMessage{[]byte(`[{"amount":1}]`), []byte(`[{"amount":2}]`)}
	texts := []string{string(rows[0]), string(rows[1])}
	ids, err := w.Insert(ctx, rows, `WITH src AS MATERIALIZED (
			SELECT nextval('ledger_seq') AS id, r, i FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
		ins AS (INSERT INTO ledger (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src)
		SELECT id, i FROM src`, w.Name(), fabric.PerRow(texts))
	if err != nil {
		log.Fatal(err)
	}
	log.Println("written at", ids) // the ID of each row, in the order of rows
}

// An ephemeral stream (state in its writer's memory): Put and Remove are
// the whole write, and the Ephemeral serves the stream's catch-up.
func ExampleEphemeral() {
	ctx := context.Background()
	typing := fabric.NewEphemeral("typing")
	srv, err := catchup.NewServer(catchup.ServerConfig{Secret: "s3cret",
		Sources: map[string]catchup.Source{"typing": typing}})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle(catchup.PathPrefix, srv)
	id, _ := instance.NewID("master")
	node, err := fabric.New(fabric.Config{
		Instance: id, Cluster: "prod", RedisURL: "redis://127.0.0.1:6379/0", Secret: "s3cret",
		Hello:      wire.Hello{Name: "master", URL: "http://10.0.0.2:8080"},
		Ephemerals: []*fabric.Ephemeral{typing},
		Handler:    printer{},
	})
	if err != nil {
		log.Fatal(err)
	}
	go node.Run(ctx)
	if _, err := typing.Put(ctx, "!room:x", json.RawMessage(`[{"room":"!room:x","users":["@a:x"]}]`)); err != nil {
		log.Fatal(err)
	}
	// Nobody types any more: the room's tombstone tells readers.
	if _, err := typing.Remove(ctx, "!room:x", json.RawMessage(`[{"room":"!room:x","users":[]}]`)); err != nil {
		log.Fatal(err)
	}
}

// A reader follows a stream it does not write: every writer's rows reach
// its Handler exactly once, in each writer's order, whatever pub/sub
// loses; a token from a client is waited for before answering it.
func ExampleNode_WaitForToken() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	gen, err := streams.Open(ctx, pool, ledger, "") // "": a reader
	if err != nil {
		log.Fatal(err)
	}
	id, _ := instance.NewID("reader")
	sql := &catchup.SQLSource{Pool: pool, Table: "ledger", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: "s3cret", Fallback: map[string]catchup.Source{"ledger": sql}})
	if err != nil {
		log.Fatal(err)
	}
	node, err := fabric.New(fabric.Config{
		Instance: id, Cluster: "prod", RedisURL: "redis://127.0.0.1:6379/0", Secret: "s3cret",
		Streams:    []core.StreamSpec{{Name: "ledger", Start: gen.StoredUpto()}},
		Generators: []*streams.Generator{gen},
		Handler:    printer{},
		Fetcher:    fetcher,
	})
	if err != nil {
		log.Fatal(err)
	}
	go node.Run(ctx)

	tok, err := streams.ParseToken("m120~2.125") // from a client, say
	if err != nil {
		log.Fatal(err) // a 400
	}
	if err := node.WaitForToken(ctx, "ledger", tok); err != nil {
		log.Fatal(err) // ctx ended first
	}
	log.Println("everything up to", tok, "is applied here; persisted-upto is", gen.StoredUpto())
}

// Call a Writer from as many goroutines as you like (an HTTP handler per
// request, say): the calls that arrive while one transaction of the writer
// is in flight share the next one, each behind a savepoint, so one call's
// error fails only that call and the writer's position moves at every
// commit.
func ExampleWriter_Write_concurrent() {
	var w *fabric.Writer // from OpenWriter, bound to a node
	http.HandleFunc("POST /ledger", func(rw http.ResponseWriter, r *http.Request) {
		row := json.RawMessage(`[{"amount":1}]`)
		ids, err := w.Write(r.Context(), 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (stream_id, writer, rows) VALUES ($1, $2, $3)`, ids[0], w.Name(), row)
			return []json.RawMessage{row}, err // an error undoes this call's rows only
		})
		if err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(rw).Encode(map[string]int64{"stream_pos": ids[0]})
	})
}

// A reader on a Redis Cluster (7 or later) follows one stream only: it
// subscribes to the control channel and to weft:prod/typing, with sharded
// pub/sub (each channel on the master of its slot), and never receives a
// line of the cluster's other streams. A failover, a slot migration or a
// lost node is a gap it repairs.
func ExampleConfig_redisCluster() {
	ctx := context.Background()
	catchupClient, err := catchup.NewClient(catchup.ClientConfig{Secret: "s3cret"})
	if err != nil {
		log.Fatal(err)
	}
	id, _ := instance.NewID("typing-reader")
	node, err := fabric.New(fabric.Config{
		Instance: id, Cluster: "prod", Secret: "s3cret",
		// Seed nodes; the cluster's topology is read from them.
		RedisURL:     "redis://10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000",
		RedisCluster: true,
		Streams:      []core.StreamSpec{{Name: "typing", Ephemeral: true}},
		Handler:      printer{},
		Fetcher:      catchupClient,
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("following %s", fabric.StreamChannel("prod", "typing")) // weft:prod/typing
	_ = node.Run(ctx)
}
