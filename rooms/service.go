package rooms

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/shard"
	"github.com/weft-dev/weft/streams"
)

// maxBody bounds every client request body.
const maxBody = 64 << 10

// Service serves the client API of one instance.
type Service struct {
	pool         *pgxpool.Pool
	events       *streams.Generator
	node         *fabric.Node
	live         *Live
	eventsFwd    Forwarder
	typingFwd    Forwarder
	eventWriters []string
	typingWriter string
	log          *slog.Logger
	visible      time.Duration
	polls        pollGate
}

// apiError is the JSON error body of every 4xx/5xx.
type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func badRequest(w http.ResponseWriter, field, format string, args ...any) {
	writeJSON(w, http.StatusBadRequest, apiError{Error: fmt.Sprintf(format, args...), Field: field})
}

// Forwarder runs a task on the owner of a key (shard.Forwarder).
type Forwarder interface {
	Do(ctx context.Context, key string, t shard.Task, idempotencyKey string) (shard.Result, error)
}

// Config wires a Service.
type Config struct {
	Pool   *pgxpool.Pool
	Events *streams.Generator // the events stream, as writer or reader
	Node   *fabric.Node
	Live   *Live // the node's Handler
	// EventsForwarder sends room tasks to the room's event writer;
	// TypingForwarder sends typing to the typing writer.
	EventsForwarder, TypingForwarder Forwarder
	EventWriters                     []string
	TypingWriter                     string
	// VisibleTimeout bounds read-your-writes [5 s].
	VisibleTimeout time.Duration
	Logger         *slog.Logger
	// MaxLongPolls caps the syncs waiting at once (since given, timeout_ms
	// > 0); beyond it a sync answers 503 with Retry-After
	// [DefaultMaxLongPolls].
	MaxLongPolls int
}

// NewService builds the client API.
func NewService(cfg Config) *Service {
	if cfg.VisibleTimeout <= 0 {
		cfg.VisibleTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxLongPolls <= 0 {
		cfg.MaxLongPolls = DefaultMaxLongPolls
	}
	s := &Service{pool: cfg.Pool, events: cfg.Events, node: cfg.Node, live: cfg.Live,
		eventsFwd: cfg.EventsForwarder, typingFwd: cfg.TypingForwarder, eventWriters: cfg.EventWriters,
		typingWriter: cfg.TypingWriter, log: log, visible: cfg.VisibleTimeout}
	s.polls.max = int64(cfg.MaxLongPolls)
	return s
}

// Routes registers the client API on mux.
func (s *Service) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/rooms/{room}/messages", s.postMessage)
	mux.HandleFunc("PUT /v1/rooms/{room}/state/{key}", s.putState)
	mux.HandleFunc("POST /v1/rooms/{room}/recompute", s.recompute)
	mux.HandleFunc("GET /v1/rooms/{room}/state", s.getState)
	mux.HandleFunc("PUT /v1/rooms/{room}/typing/{user}", s.putTyping)
	mux.HandleFunc("GET /v1/sync", s.sync)
}

// pathParam reads a path parameter and answers 400 naming it when it does
// not match re; want describes the valid form.
func pathParam(w http.ResponseWriter, r *http.Request, name string, re *regexp.Regexp, want string) (string, bool) {
	v := r.PathValue(name)
	if !re.MatchString(v) {
		badRequest(w, name, "%s %.64q: want %s", name, v, want)
		return "", false
	}
	return v, true
}

func (s *Service) room(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathParam(w, r, "room", roomRE, "1-255 of [A-Za-z0-9!:._@#-]")
}

// decodeBody reads a size-limited JSON object into v, rejecting unknown
// fields and anything after the object; the error names the field when it
// can.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// A second value or stray bytes after the first are bad input, not
		// something to ignore: the client meant something else.
		if _, err = dec.Token(); err == io.EOF {
			return true
		} else if err == nil {
			err = errors.New("data after the JSON object")
		}
	}
	field := "body"
	var te *json.UnmarshalTypeError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &te) && te.Field != "":
		field = te.Field
	case errors.As(err, &mbe):
		writeJSON(w, http.StatusRequestEntityTooLarge, apiError{Error: fmt.Sprintf("body over %d bytes", maxBody), Field: "body"})
		return false
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// The key as sent (the error quotes it); an empty key is the body's.
		if name, uerr := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field ")); uerr == nil && name != "" {
			field = name
		}
	}
	badRequest(w, field, "invalid JSON body: %v", err)
	return false
}

type messageReq struct {
	Sender string  `json:"sender"`
	Body   *string `json:"body"`
	TxnID  string  `json:"txn_id"`
}

type writeResp struct {
	EventID   string `json:"event_id"`
	StreamPos int64  `json:"stream_pos"`
	Writer    string `json:"writer"`
	SyncToken string `json:"sync_token"`
}

func (s *Service) postMessage(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	var req messageReq
	if !decodeBody(w, r, &req) {
		return
	}
	switch {
	case !userRE.MatchString(req.Sender):
		badRequest(w, "sender", "sender %.64q: want 1-255 of [A-Za-z0-9@:._=-]", req.Sender)
		return
	case req.Body == nil:
		badRequest(w, "body", "body is required")
		return
	case req.TxnID == "" || len(req.TxnID) > 255:
		badRequest(w, "txn_id", "txn_id is required (1-255 bytes)")
		return
	}
	content, _ := json.Marshal(map[string]string{"body": *req.Body})
	s.persist(w, r, room, persistReq{Sender: req.Sender, TxnID: req.TxnID, Kind: "message", Content: content})
}

type stateReq struct {
	Value  json.RawMessage `json:"value"`
	Sender string          `json:"sender"`
	TxnID  string          `json:"txn_id"`
}

func (s *Service) putState(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	key, ok := pathParam(w, r, "key", keyRE, "0-255 of [A-Za-z0-9:._-]")
	if !ok {
		return
	}
	var req stateReq
	if !decodeBody(w, r, &req) {
		return
	}
	if len(req.Value) == 0 {
		badRequest(w, "value", "value is required")
		return
	}
	if req.Sender == "" {
		req.Sender = "state"
	}
	if !userRE.MatchString(req.Sender) {
		badRequest(w, "sender", "sender %.64q: want 1-255 of [A-Za-z0-9@:._=-]", req.Sender)
		return
	}
	if req.TxnID == "" {
		req.TxnID = randomID()
	}
	content, _ := json.Marshal(map[string]json.RawMessage{"value": req.Value})
	s.persist(w, r, room, persistReq{Sender: req.Sender, TxnID: req.TxnID, Kind: "state", StateKey: &key, Content: content})
}

// forward runs a task on the key's owner; on failure it answers 503 and
// reports false.
func (s *Service) forward(w http.ResponseWriter, r *http.Request, f Forwarder, key string, t shard.Task, idem string) (json.RawMessage, bool) {
	res, err := f.Do(r.Context(), key, t, idem)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		s.log.Warn("forwarded task failed", "kind", t.Kind, "key", key, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return nil, false
	}
	return res.Value, true
}

// visibleAt waits until this instance has seen key at pos (read your
// writes); on timeout it answers 504, saying the write itself succeeded.
func (s *Service) visibleAt(w http.ResponseWriter, r *http.Request, key core.Key, pos int64) bool {
	err := shard.WaitVisible(r.Context(), func(ctx context.Context) error { return s.node.WaitFor(ctx, key, pos) }, s.visible)
	if err != nil {
		writeJSON(w, http.StatusGatewayTimeout, apiError{Error: fmt.Sprintf("%s/%s at %d: %v", key.Stream, key.Writer, pos, err)})
		return false
	}
	return true
}

// persist forwards the event to the room's owner, then waits until this
// instance sees it (read your writes).
func (s *Service) persist(w http.ResponseWriter, r *http.Request, room string, req persistReq) {
	payload, _ := json.Marshal(req)
	value, ok := s.forward(w, r, s.eventsFwd, room, shard.Task{Kind: KindPersist, Payload: payload, Batchable: true}, req.Sender+"/"+req.TxnID)
	if !ok {
		return
	}
	var ev Event
	if err := json.Unmarshal(value, &ev); err != nil {
		writeJSON(w, http.StatusBadGateway, apiError{Error: "owner answered: " + err.Error()})
		return
	}
	if !s.visibleAt(w, r, core.Key{Stream: EventsStream, Writer: ev.Writer}, ev.StreamPos) {
		return
	}
	tok, err := s.currentToken(r.Context())
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, writeResp{EventID: ev.EventID, StreamPos: ev.StreamPos, Writer: ev.Writer, SyncToken: tok.String()})
}

func (s *Service) recompute(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	if value, ok := s.forward(w, r, s.eventsFwd, room, shard.Task{Kind: KindRecompute}, "recompute/"+randomID()); ok {
		writeJSON(w, http.StatusOK, value)
	}
}

func (s *Service) getState(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	rows, err := s.pool.Query(r.Context(), `SELECT key, value FROM room_state WHERE room = $1 ORDER BY key`, room)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	state := map[string]json.RawMessage{}
	var k string
	var v json.RawMessage
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { state[k] = append(json.RawMessage(nil), v...); return nil }); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"room": room, "state": state})
}

type typingBody struct {
	Typing    *bool `json:"typing"`
	TimeoutMS int64 `json:"timeout_ms"`
}

func (s *Service) putTyping(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	user, ok := pathParam(w, r, "user", userRE, "1-255 of [A-Za-z0-9@:._=-]")
	if !ok {
		return
	}
	var req typingBody
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Typing == nil {
		badRequest(w, "typing", "typing is required (true or false)")
		return
	}
	if req.TimeoutMS == 0 {
		req.TimeoutMS = 30000
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > 600000 {
		badRequest(w, "timeout_ms", "timeout_ms %d: want 1..600000", req.TimeoutMS)
		return
	}
	payload, _ := json.Marshal(typingReq{User: user, Typing: *req.Typing, TimeoutMS: req.TimeoutMS})
	value, ok := s.forward(w, r, s.typingFwd, room, shard.Task{Kind: KindTyping, Payload: payload}, "typing/"+randomID())
	if !ok {
		return
	}
	var out struct {
		StreamPos int64 `json:"stream_pos"`
	}
	_ = json.Unmarshal(value, &out)
	if !s.visibleAt(w, r, core.Key{Stream: TypingStream, Writer: s.typingWriter}, out.StreamPos) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"stream_pos": out.StreamPos})
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// parseTimeout parses sync's timeout_ms ("" means 0).
func parseTimeout(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > 120000 {
		return 0, fmt.Errorf("timeout_ms %.32q: want 0..120000", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
