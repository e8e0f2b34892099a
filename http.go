package weft

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the process's HTTP endpoints: /_weft/ (catch-up for the
// other processes, behind Secret), /healthz (the process runs), /readyz
// (200 once it serves fresh data, else 503 and why), /metrics (when
// Config.Registerer is nil: the process's own registry) and /status (a
// JSON summary: streams, writers, consumers and groups, and their lag). Open serves it
// on Config.Listen; mount it on a server of your own otherwise (its paths
// are absolute), and set Config.Advertise to that server's URL.
func (n *Node) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*n.http.Load()).ServeHTTP(w, r)
	})
}

func (n *Node) setHandler(h http.Handler) { n.http.Store(&h) }

func (n *Node) handler(catchup http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/_weft/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := n.Err(); err != nil { // its view may be stale: the others read elsewhere
			http.Error(w, "weft: the process failed: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		catchup.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := n.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	if n.gather != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(n.gather, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /status", n.serveStatus)
	return mux
}

// serveStatus writes Status with Config.StatusSections spliced in at the
// top level: one document, weft's fields first, the application's after
// them in key order.
func (n *Node) serveStatus(w http.ResponseWriter, r *http.Request) {
	doc, err := json.MarshalIndent(n.Status(), "", "  ")
	if err != nil {
		http.Error(w, "weft: status: "+err.Error(), http.StatusInternalServerError)
		return
	}
	var own map[string]json.RawMessage
	_ = json.Unmarshal(doc, &own)
	var extra map[string]any
	if n.cfg.StatusSections != nil {
		extra = n.cfg.StatusSections(r.Context())
	}
	doc = bytes.TrimSuffix(doc, []byte("\n}"))
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if _, ok := own[k]; ok {
			continue
		}
		v, err := json.MarshalIndent(extra[k], "  ", "  ")
		if err != nil {
			http.Error(w, fmt.Sprintf("weft: status section %q: %v", k, err), http.StatusInternalServerError)
			return
		}
		name, _ := json.Marshal(k)
		doc = append(append(append(append(doc, ",\n  "...), name...), ": "...), v...)
	}
	doc = append(doc, "\n}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(doc)
}

// Status is a summary of the process, as /status serves it (with
// Config.StatusSections beside it).
type Status struct {
	Instance string `json:"instance"`
	Name     string `json:"name"`
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
	// Established: the process has subscribed on Redis, asked every
	// writer for its position and caught up with the answers at least
	// once since it started.
	Established bool `json:"established"`
	// Degraded: Redis is unreachable now (or being subscribed to again);
	// positions are followed from PostgreSQL, and Ready says whether that
	// keeps the process fresh.
	Degraded bool `json:"degraded"`
	// Deaf: lines of other processes arrive and none can be opened (their
	// Secret differs from this one's): not ready.
	Deaf      bool             `json:"deaf"`
	Streams   []StreamStatus   `json:"streams"`
	Consumers []ConsumerStatus `json:"consumers,omitempty"`
	Groups    []GroupStatus    `json:"groups,omitempty"`
}

// StreamStatus is one stream as this process sees it.
type StreamStatus struct {
	Name string `json:"name"`
	// PersistedUpto: every position at or below it is committed or
	// rolled back, on every writer (0 for an ephemeral stream). It is the
	// value stored and handed out (Generator.PersistedUpto), which never
	// goes backwards, across restarts too; the stream's consumers may
	// read a little past it (Generator.ComputedUpto).
	PersistedUpto int64 `json:"persisted_upto"`
	// Writes: this process writes the stream.
	Writes bool `json:"writes"`
	// Writers are the stream's writers this process follows, by name.
	Writers []StreamWriter `json:"writers,omitempty"`
}

// StreamWriter is one writer of a stream as this process follows it.
type StreamWriter struct {
	Writer string `json:"writer"`
	// Instance is the writer's instance last heard ("" before any).
	Instance string `json:"instance,omitempty"`
	// Position: this process has seen every row of the writer up to it.
	Position int64 `json:"position"`
	// Announced is the highest position the writer said it reached;
	// Lag is Announced - Position.
	Announced  int64 `json:"announced"`
	Lag        int64 `json:"lag"`
	CatchingUp bool  `json:"catching_up"`
}

// ConsumerStatus is one consumer's progress.
type ConsumerStatus struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Pos is the cursor: every row at or below it is applied.
	Pos int64 `json:"pos"`
	// LagPositions is how far the cursor is behind the stream's
	// persisted-upto, in positions.
	LagPositions int64 `json:"lag_positions"`
	// LagSeconds is how long the oldest row not applied yet has been
	// waiting, 0 when caught up.
	LagSeconds float64 `json:"lag_seconds"`
	// Paused: an operator paused the consumer (PauseConsumer); it
	// applies nothing until it is resumed.
	Paused bool `json:"paused"`
	// FailingPos is the position the consumer's function fails on and
	// which waits for its next attempt (0: none), and Attempts how many
	// failed so far.
	FailingPos int64 `json:"failing_pos,omitempty"`
	Attempts   int   `json:"attempts,omitempty"`
	// DeadLetters is how many dead letters the consumer has, as last
	// read (about every AnnounceInterval).
	DeadLetters int64 `json:"dead_letters,omitempty"`
}

// Status summarises the process now.
func (n *Node) Status() Status {
	// Ready is of the moment the views were taken, and still true now
	// (fabric.Node.Status): a live "ready" beside views from before a
	// stall would say the process was fresh while they were behind.
	fs := n.fab.Status()
	s := Status{Instance: n.inst, Name: n.cfg.Name, Established: fs.Established, Degraded: fs.Degraded, Deaf: fs.Deaf}
	switch err := n.Err(); {
	case err != nil:
		s.NotReady = fmt.Sprintf("weft: not ready: the process failed: %v", err)
	case !fs.Ready:
		s.NotReady = "weft: not ready: " + fs.NotReady
	default:
		s.Ready = true
	}
	writers := map[string][]StreamWriter{}
	for _, v := range fs.Views {
		writers[v.Key.Stream] = append(writers[v.Key.Stream], StreamWriter{Writer: v.Key.Writer, Instance: v.Instance,
			Position: v.Pos, Announced: v.Announced, Lag: v.Announced - v.Pos, CatchingUp: v.Catching})
	}
	for _, st := range n.sorted() {
		ss := StreamStatus{Name: st.Name, Writes: st.w != nil || st.eph != nil, Writers: writers[st.Name]}
		if st.gen != nil {
			ss.PersistedUpto = st.gen.StoredUpto()
		}
		s.Streams = append(s.Streams, ss)
	}
	for _, c := range n.consumer {
		s.Consumers = append(s.Consumers, c.status())
	}
	for _, g := range n.groups {
		s.Groups = append(s.Groups, g.status())
	}
	return s
}
