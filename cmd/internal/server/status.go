package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/streams"
)

// statusPage serves /readyz and /status.
type statusPage struct {
	cfg    Config
	inst   string
	role   string
	node   *fabric.Node
	pool   *pgxpool.Pool
	gen    *streams.Generator
	queues map[string]*shard.Queue
	shards *membership.MapFollower
}

func (s *statusPage) readyz(w http.ResponseWriter, _ *http.Request) {
	ns := s.node.Status()
	if why := notReady(ns); why != "" {
		http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
		return
	}
	if ns.Degraded {
		_, _ = w.Write([]byte("ready (degraded: following positions from PostgreSQL)\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Status is the binaries' /status document: the library's (weft.Status,
// served by weft.Node.Handler) with the binaries' sections beside it
// (sections). The waiting page serves the same shape.
type Status struct {
	weft.Status
	Role     string `json:"role"`
	Version  string `json:"version"`
	Revision string `json:"revision"` // with Version: which build answers (BuildInfo)
	URL      string `json:"url"`
	// PersistedUpto is the events stream's, as stored: never below one
	// any instance handed out before the request (a predecessor still
	// running beside this one included).
	PersistedUpto int64                  `json:"persisted_upto"`
	Token         string                 `json:"token"`
	Peers         map[string]fabric.Peer `json:"peers"`
	Writers       []WriterStatus         `json:"writers,omitempty"`
	QueueDepth    map[string]int         `json:"queue_depth"`
	// ShardMap is the rooms' writer map this instance follows.
	ShardMap *ShardMapStatus `json:"shard_map,omitempty"`
	// Waiting is set while the instance waits for its writer name.
	Waiting *WaitingStatus `json:"waiting,omitempty"`
}

// Views lists every writer of every stream the instance follows, in the
// stream's order.
func (s Status) Views() []StreamView {
	var out []StreamView
	for _, st := range s.Streams {
		for _, w := range st.Writers {
			out = append(out, StreamView{Stream: st.Name, StreamWriter: w})
		}
	}
	return out
}

// ShardMapStatus is the shard map as one instance follows it.
type ShardMapStatus struct {
	Epoch   int64    `json:"epoch"`
	Writers []string `json:"writers"`
	// Settled: every handover up to this epoch has finished, as far as
	// this instance knows (Settled == Epoch: none in progress).
	Settled int64 `json:"settled"`
}

// StreamView is one writer of one stream as this instance sees it.
type StreamView struct {
	Stream string
	weft.StreamWriter
}

// WriterStatus is a writer name's registration.
type WriterStatus struct {
	Name       string    `json:"name"`
	Instance   string    `json:"instance"`
	URL        string    `json:"url,omitempty"`
	LeaseUntil time.Time `json:"lease_until"`
	Sealed     bool      `json:"sealed"`
	Epoch      int64     `json:"epoch"`
}

// notReady is the node's reason in the operator's words: the library
// speaks of its Config.Secret, an operator of the --secret flag.
func notReady(ns fabric.Status) string {
	if ns.NotReady != "" && ns.Deaf {
		return "every line of the other instances is refused: is --secret the same everywhere?"
	}
	return ns.NotReady
}

// sections are the binaries' part of /status (weft.Config.StatusSections).
func (s *statusPage) sections(ctx context.Context) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// Read, not this instance's copy: another instance may have handed out
	// more since this one last stored (a read that fails gives the copy).
	puto, _ := s.gen.LoadPersisted(ctx)
	out := map[string]any{"role": s.role, "version": Version, "revision": Build().Revision, "url": s.cfg.Advertise(),
		"persisted_upto": puto, "token": s.gen.Token().String(), "peers": s.node.Status().Peers}
	if s.shards != nil {
		v := s.shards.Version()
		out["shard_map"] = ShardMapStatus{Epoch: v.Epoch, Writers: v.Writers, Settled: s.shards.Settled()}
	}
	if rows, err := streams.Writers(ctx, s.pool); err == nil {
		var ws []WriterStatus
		for _, row := range rows {
			ws = append(ws, WriterStatus{Name: row.Name, Instance: row.Instance, URL: row.URL, LeaseUntil: row.LeaseUntil, Sealed: row.Sealed, Epoch: row.Epoch})
		}
		if len(ws) > 0 {
			out["writers"] = ws
		}
	}
	depth := map[string]int{}
	for name, q := range s.queues {
		if q != nil {
			depth[name] = q.Depth()
		}
	}
	out["queue_depth"] = depth
	return out
}

func writeStatus(w http.ResponseWriter, code int, st Status) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st)
}

// WaitingStatus says what a process that waits for its writer name waits
// for: a second process started with a name another instance holds.
type WaitingStatus struct {
	Instance string    `json:"-"` // on Status.Instance
	Name     string    `json:"name"`
	Holder   string    `json:"holder"`
	Epoch    int64     `json:"epoch"`
	Until    time.Time `json:"lease_until"`
	Since    time.Time `json:"since"`
}

func (w WaitingStatus) String() string {
	return fmt.Sprintf("waiting for writer name %s held by instance %s (epoch %d, lease until %s) since %s",
		w.Name, w.Holder, w.Epoch, w.Until.UTC().Format(time.RFC3339), w.Since.UTC().Format(time.RFC3339))
}

// waitingPage is what the HTTP server answers until the instance holds its
// writer name and runs: alive, not ready, and saying why.
type waitingPage struct {
	cfg  Config
	role string

	mu sync.Mutex
	w  *WaitingStatus // nil before the name was found held
}

func (p *waitingPage) set(self, holder string, epoch int64, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil || p.w.Holder != holder || p.w.Epoch != epoch {
		p.w = &WaitingStatus{Instance: self, Name: p.cfg.Name, Holder: holder, Epoch: epoch, Since: time.Now()}
	}
	p.w.Until = until
}

func (p *waitingPage) get() *WaitingStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil {
		return nil
	}
	w := *p.w
	return &w
}

func (p *waitingPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	why := "starting"
	if ws := p.get(); ws != nil {
		why = ws.String()
	}
	switch r.URL.Path {
	case "/healthz":
		_, _ = w.Write([]byte("ok\n"))
	case "/readyz":
		http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
	case "/status":
		inst := ""
		if ws := p.get(); ws != nil {
			inst = ws.Instance // the instance that waits, named before it serves
		}
		writeStatus(w, http.StatusOK, Status{Status: weft.Status{Instance: inst, Name: p.cfg.Name}, Role: p.role, Version: Version, Revision: Build().Revision,
			URL: p.cfg.Advertise(), Waiting: p.get(), Peers: map[string]fabric.Peer{}, QueueDepth: map[string]int{}})
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "instance not serving yet: " + why})
	}
}
