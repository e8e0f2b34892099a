// Command auditlog is an audit log on weft. "auditlog -writer w1 a b" appends entries to keys a
// and b, which w1 owns; "auditlog" follows the log: it applies each entry once, in order per key,
// prints it and serves /log/{key}, where a client reads its own write. See README.md.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/weft-dev/weft"
)

// entry is one entry of the log: a row of the stream holds Key, Seq (1, 2, 3... per key) and What.
type entry struct {
	Writer string `json:"writer,omitempty"`
	Pos    int64  `json:"pos,omitempty"`
	Key    string `json:"key"`
	Seq    int64  `json:"seq"`
	What   string `json:"what"`
}

func main() {
	writer := flag.String("writer", "", "write as this name to the keys given as arguments, then exit")
	n := flag.Int("n", 100, "entries to write per key")
	addr := flag.String("http", "127.0.0.1:8480", "host:port to serve on, as the other processes reach it")
	announce := flag.Duration("announce", 0, "weft's Config.AnnounceInterval (0: its default)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	view := &logView{keys: map[string][]entry{}}
	cfg := weft.Config{Name: "reader", DatabaseURL: os.Getenv("DATABASE_URL"), RedisURL: os.Getenv("REDIS_URL"), Secret: os.Getenv("WEFT_SECRET"),
		Advertise: "http://" + *addr, AnnounceInterval: *announce, Streams: []weft.Stream{{Name: "audit"}},
		Followers: []weft.Follower{{Stream: "audit", Handler: view, FromStart: true}}} // a reader replays the whole log
	if *writer != "" {
		cfg.Name, cfg.Writes, cfg.Followers = *writer, []string{"audit"}, nil
	}
	node, err := weft.Open(ctx, cfg) // a writer waits here while a live process holds its name
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/", node.Handler()) // catch-up for the other processes, /readyz, /metrics, /status
	http.HandleFunc("GET /log/{key}", view.serve(node))
	go func() { log.Fatal(http.ListenAndServe(*addr, nil)) }()
	_, err = node.DB().Exec(ctx, `SELECT pg_advisory_xact_lock(7274); -- one process at a time
		CREATE UNIQUE INDEX IF NOT EXISTS audit_key_seq ON audit ((data->>'key'), ((data->>'seq')::bigint))`) // a key's second writer fails
	// A writer's keys (round robin) are its alone, as its name (Open): their last entries are in the table.
	keys, pos := flag.Args(), []int64(nil)
	for i := 0; err == nil && i < *n*len(keys); i++ {
		e := entry{Key: keys[i%len(keys)], What: fmt.Sprintf("%s change %d", *writer, i/len(keys))}
		err = node.DB().QueryRow(ctx, `SELECT coalesce(max((data->>'seq')::bigint), 0) + 1 FROM audit WHERE data->>'key' = $1`, e.Key).Scan(&e.Seq)
		if err == nil {
			pos, err = node.Append(ctx, "audit", e)
		}
		if err == nil { // what it wrote, as a reader prints it: a client reads it back from one by writer and pos
			e.Writer, e.Pos = *writer, pos[0]
			_ = json.NewEncoder(os.Stdout).Encode(e)
		}
	}
	if err == nil && *writer == "" {
		err = node.Wait(ctx)
	}
	if err = errors.Join(err, node.Close()); err != nil { // a writer seals its name: a successor takes it at once
		log.Fatal(err)
	}
}

// logView is the process's copy of the log: each key's entries in order.
type logView struct {
	mu   sync.Mutex
	keys map[string][]entry
}

// Handle is given each entry once, in its writer's order (so in its key's:
// one writer owns a key), live or read back after a gap.
func (v *logView) Handle(_ context.Context, r weft.Row) error {
	e := entry{Writer: r.Writer, Pos: r.Pos}
	if err := r.Decode(&e); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.keys[e.Key] = append(v.keys[e.Key], e)
	_ = json.NewEncoder(os.Stdout).Encode(e) // one JSON line
	return nil
}

// serve answers a key's log; with ?writer=W&pos=N, once this process has
// handled W's entries up to position N: a client reads its own write.
func (v *logView) serve(node *weft.Node) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		pos, err := strconv.ParseInt(cmp.Or(q.Get("pos"), "0"), 10, 64)
		if err != nil || pos > 0 && q.Get("writer") == "" {
			http.Error(w, "auditlog: want ?writer=NAME&pos=N", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
		defer cancel()
		if err := node.WaitFor(ctx, "audit", q.Get("writer"), pos); err != nil {
			http.Error(w, err.Error(), http.StatusGatewayTimeout)
			return
		}
		v.mu.Lock()
		es := append([]entry{}, v.keys[r.PathValue("key")]...)
		v.mu.Unlock()
		_ = json.NewEncoder(w).Encode(es)
	}
}
