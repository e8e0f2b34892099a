// Command auditlog is a second workload on weft's public API: an audit log
// written by several writer processes, each owning its keys, and followed
// by every process, which applies each entry exactly once, in order per
// key, prints it as a JSON line, and lets a client read its own write.
//
// -writer NAME writes -n entries to each of -keys and exits; without it
// the process only reads. See README.md.
package main

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/catchup"
	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/fabric/wire"
	"github.com/weft-dev/weft/instance"
	"github.com/weft-dev/weft/schema"
	"github.com/weft-dev/weft/streams"
)

//go:embed migrations/*.sql
var migrations embed.FS

// stream is the durable audit stream: IDs from one sequence shared by all
// writers, rows in one table with a writer column.
var stream = streams.Config{Name: "audit", Sequence: "audit_seq",
	Tables: []streams.Table{{Name: "audit", IDColumn: "stream_id", WriterColumn: "writer"}}}

// insert numbers the key's entry inside the fenced transaction. A key
// belongs to one writer name (-keys) and the lease lets one process hold
// that name, so max+1 is the next entry; UNIQUE (key, seq) refuses a
// second writer misconfigured with the same key.
const insert = `WITH next AS (SELECT coalesce(max(seq), 0) + 1 AS seq FROM audit WHERE key = $3)
INSERT INTO audit (stream_id, writer, key, seq, rows)
SELECT $1, $2, $3, seq, jsonb_build_array(jsonb_build_object('key', $3::text, 'seq', seq, 'what', $4::text)) FROM next
RETURNING rows::text, seq`

type entry struct {
	Key  string `json:"key"`
	Seq  int64  `json:"seq"`
	What string `json:"what"`
}

type options struct {
	db, redis, addr, secret, writer, keys, check string
	n                                            int
	announce                                     time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.db, "db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	flag.StringVar(&o.redis, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.StringVar(&o.addr, "http", "127.0.0.1:8480", "host:port to serve on (catch-up, /log/{key}, /readyz), as the other processes reach it")
	flag.StringVar(&o.secret, "secret", "auditlog-example-secret", "shared secret: signs the channel, guards catch-up")
	flag.StringVar(&o.writer, "writer", "", "writer name to write as; empty only reads")
	flag.StringVar(&o.keys, "keys", "a,b", "keys this writer owns, comma-separated")
	flag.IntVar(&o.n, "n", 100, "entries to write per key before exiting")
	flag.StringVar(&o.check, "check", "", "a reader's URL: read each write back from it before the next")
	flag.DurationVar(&o.announce, "announce", 0, "fabric announce interval (0: weft's default, 1s)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, o, log); err != nil {
		log.Error("auditlog failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	keys := strings.Split(o.keys, ",")
	if slices.Contains(keys, "") {
		return fmt.Errorf("auditlog: -keys %q: a key is empty", o.keys)
	}
	pool, err := pgxpool.New(ctx, o.db)
	if err != nil {
		return fmt.Errorf("auditlog: -db: %w", err)
	}
	defer pool.Close()
	own, _ := fs.Sub(migrations, "migrations") // fixed at build time
	if _, err := schema.Migrate(ctx, pool, log); err != nil {
		return err
	} else if _, err := schema.MigrateFS(ctx, pool, own, "auditlog_schema_version", log); err != nil {
		return err
	}
	name := cmp.Or(o.writer, "reader")
	inst, err := instance.NewID(name)
	if err != nil {
		return err
	}
	self := "http://" + o.addr // where the others fetch this writer's rows
	view := &logView{keys: map[string][]entry{}}
	// Any instance serves any writer's range from the table, and falls
	// back to it when the writer's instance does not answer.
	sources := map[string]catchup.Source{stream.Name: &catchup.SQLSource{Pool: pool, Table: "audit", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}}
	client, err := catchup.NewClient(catchup.ClientConfig{Secret: o.secret, Fallback: sources, Logger: log})
	if err != nil {
		return err
	}
	defer client.Close()
	// Start 0: the process replays the whole log through catch-up. A
	// real reader would load a snapshot and start at its PersistedUpto.
	cfg := fabric.Config{Instance: inst, Cluster: "auditlog", RedisURL: o.redis, Secret: o.secret, Hello: wire.Hello{Name: name, URL: self},
		Streams: []core.StreamSpec{{Name: stream.Name}}, Handler: view, Fetcher: client, AnnounceInterval: o.announce, Logger: log}
	var w *fabric.Writer
	if o.writer != "" {
		// Claims the name with a lease, waiting for a live holder to go.
		if w, err = fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: inst, Name: o.writer, Stream: stream, Wait: true, URL: self}); err != nil {
			return err
		}
		cfg.Writers = []*fabric.Writer{w}
	} else {
		gen, err := streams.Open(ctx, pool, stream, "")
		if err != nil {
			return err
		}
		cfg.Generators = []*streams.Generator{gen}
	}
	node, err := fabric.New(cfg)
	if err != nil {
		return err
	}
	cu, err := catchup.NewServer(catchup.ServerConfig{Secret: o.secret, Sources: sources, Logger: log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(catchup.PathPrefix, cu)
	mux.HandleFunc("GET /log/{key}", view.serve(node))
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !node.Ready() {
			rw.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	srv := catchup.NewHTTPServer(o.addr, mux)

	// Whichever of the writes, the node and the server ends first ends the
	// run. On its way out the node seals the writer name (a successor need
	// not wait for the lease) and says BYE.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var nodeErr, serveErr error
	wg.Go(func() { nodeErr = node.Run(ctx); cancel() })
	wg.Go(func() { serveErr = srv.ListenAndServe(); cancel() })
	if w != nil {
		err = write(ctx, w, keys, o.n, o.check)
		cancel()
	}
	<-ctx.Done()
	sctx, stopServe := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer stopServe()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return errors.Join(err, nodeErr, serveErr)
}

// write appends n entries to each key, round robin. With check, each one
// is read back from that reader before the next: read-your-writes.
func write(ctx context.Context, w *fabric.Writer, keys []string, n int, check string) error {
	hc := &http.Client{Timeout: 30 * time.Second}
	for i := range n * len(keys) {
		key, seq := keys[i%len(keys)], int64(0)
		ids, err := w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			var rows string
			err := tx.QueryRow(ctx, insert, ids[0], w.Name(), key, fmt.Sprintf("%s change %d", w.Name(), i/len(keys))).Scan(&rows, &seq)
			return []json.RawMessage{json.RawMessage(rows)}, err
		})
		if err != nil {
			return fmt.Errorf("auditlog: write %s: %w", key, err)
		}
		if check == "" {
			continue
		}
		u := fmt.Sprintf("%s/log/%s?writer=%s&pos=%d", check, url.PathEscape(key), w.Name(), ids[0])
		var es []entry
		if err := getJSON(ctx, hc, u, &es); err != nil {
			return fmt.Errorf("auditlog: read back %s#%d: %w", key, seq, err)
		} else if len(es) == 0 || es[len(es)-1].Seq != seq {
			return fmt.Errorf("auditlog: read back %s#%d: the reader's log of it ends at %v", key, seq, es[max(len(es)-1, 0):])
		}
	}
	return nil
}

func getJSON(ctx context.Context, hc *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// logView is the process's copy of the log: every key's entries in order.
type logView struct {
	mu   sync.Mutex
	keys map[string][]entry
}

// Apply runs on the node's loop, exactly once per position of each writer,
// in that writer's order: live, or fetched after a gap.
func (v *logView) Apply(_ context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	var es []entry
	if err := json.Unmarshal(rows, &es); err != nil {
		return fmt.Errorf("auditlog: %s at %d: %w", k, pos, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range es {
		v.keys[e.Key] = append(v.keys[e.Key], e)
		fmt.Printf("{\"writer\":%q,\"pos\":%d,\"key\":%q,\"seq\":%d}\n", k.Writer, pos, e.Key, e.Seq)
	}
	return nil
}

// Reset is for an ephemeral stream whose writer restarted; this one is durable.
func (v *logView) Reset(core.Key) {}

// serve answers a key's log; with ?writer=&pos=, once this process has
// applied that writer up to pos (a client reading its own write).
func (v *logView) serve(node *fabric.Node) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("pos") {
			pos, err := strconv.ParseInt(q.Get("pos"), 10, 64)
			if err != nil || q.Get("writer") == "" {
				http.Error(rw, "auditlog: want ?writer=NAME&pos=N", http.StatusBadRequest)
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
			defer cancel()
			if err := node.WaitFor(ctx, core.Key{Stream: stream.Name, Writer: q.Get("writer")}, pos); err != nil {
				http.Error(rw, "auditlog: position not reached: "+err.Error(), http.StatusGatewayTimeout)
				return
			}
		}
		v.mu.Lock()
		es := slices.Clone(v.keys[r.PathValue("key")])
		v.mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(es)
	}
}
