package rooms

import (
	"cmp"
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

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/telemetry"
)

// maxBody bounds every client request body.
const maxBody = 64 << 10

// Service serves the client API of one instance.
type Service struct {
	pool         *pgxpool.Pool
	reads        *catchup.ReadRouter // nil: sync reads on pool
	events       *streams.Generator
	node         *fabric.Node
	live         *Live
	eventsFwd    Forwarder
	typingFwd    Forwarder
	typingWriter string
	admin        httpx.Secret // AdminRoutes' bearer
	log          *slog.Logger
	visible      time.Duration
	fwdTimeout   time.Duration   // forwardTimeout; shorter in tests
	closeCtx     context.Context // done after Close: long-polls answer now
	close        context.CancelFunc
	polls        pollGate
	answers      answerGate
	maxBytes     int
	writeTimeout time.Duration
}

// apiError is the JSON error body of every 4xx/5xx.
type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// writeJSON writes v as a JSON answer, not HTML-escaped: it is never
// served as HTML (nosniff), and escaping makes each "<" six bytes.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func badRequest(w http.ResponseWriter, field, format string, args ...any) {
	writeJSON(w, http.StatusBadRequest, apiError{Error: fmt.Sprintf(format, args...), Field: field})
}

// forwardTimeout bounds running a task on its owner, retries and a
// handover's wait included, before the client is answered 503 with
// Retry-After: a write takes well under a second, a handover of a live
// owner about as long, and a client is better told to retry than left
// waiting for a stalled owner's lease to run out.
const forwardTimeout = 5 * time.Second

// Forwarder runs a task on the owner of a key (shard.Forwarder).
type Forwarder interface {
	Do(ctx context.Context, key string, t shard.Task, idempotencyKey string) (shard.Result, error)
}

// Config wires a Service.
type Config struct {
	Pool *pgxpool.Pool
	// Reads sends sync's range reads to a read replica once it holds them;
	// nil reads them on Pool.
	Reads *catchup.ReadRouter
	// Events is the events stream, as writer or reader, one that Node
	// refreshes (a writer's, or in fabric.Config.Generators): sync tokens
	// cover the writers of its registry (streams.Registry).
	Events *streams.Generator
	Node   *fabric.Node
	Live   *Live // the node's Handler
	// EventsForwarder sends room tasks to the room's event writer;
	// TypingForwarder sends typing to the typing writer.
	EventsForwarder, TypingForwarder Forwarder
	// TypingWriter is the typing stream's writer name.
	TypingWriter string
	// VisibleTimeout bounds read-your-writes [5 s].
	VisibleTimeout time.Duration
	Logger         *slog.Logger
	// MaxLongPolls caps the syncs and state reads in progress at once,
	// waiting or not; beyond it one answers 503 with Retry-After
	// [DefaultMaxLongPolls].
	MaxLongPolls int
	// MaxAnswerBytes bounds a sync answer or state page, as written: it
	// stops there with a token to go on [DefaultMaxAnswerBytes].
	MaxAnswerBytes int
	// MaxAnswers caps the answers read from the database and written at
	// once; more wait for a slot [DefaultMaxAnswers].
	MaxAnswers int
	// WriteTimeout bounds each 64 KiB of an answer of a read route: a
	// client that reads none of it by then is disconnected; one that
	// reads slowly is not [DefaultWriteTimeout].
	WriteTimeout time.Duration
	// ForwardTimeout bounds a write (a message, a state event, typing, a
	// recompute) from its arrival to its owner's answer, queueing and a
	// hand-over's wait included: past it the client gets 503 and retries
	// with the same txn_id safely [5 s].
	ForwardTimeout time.Duration
	// AdminSecret is the secret whose bearer AdminRoutes require ("Authorization:
	// Bearer <keys.Bearer(AdminSecret)>"); empty: none (development only).
	AdminSecret string
}

// NewService builds the client API.
func NewService(cfg Config) *Service {
	if cfg.VisibleTimeout <= 0 {
		cfg.VisibleTimeout = 5 * time.Second
	}
	log := telemetry.Logger(cfg.Logger)
	if cfg.MaxLongPolls <= 0 {
		cfg.MaxLongPolls = DefaultMaxLongPolls
	}
	s := &Service{pool: cfg.Pool, reads: cfg.Reads, events: cfg.Events, node: cfg.Node, live: cfg.Live,
		eventsFwd: cfg.EventsForwarder, typingFwd: cfg.TypingForwarder, typingWriter: cfg.TypingWriter, admin: httpx.NewSecret(cfg.AdminSecret), log: log, visible: cfg.VisibleTimeout,
		fwdTimeout: forwardTimeout}
	s.closeCtx, s.close = context.WithCancel(context.Background())
	s.polls.max = int64(cfg.MaxLongPolls)
	s.answers = answerGate{slots: make(chan struct{}, cmp.Or(max(cfg.MaxAnswers, 0), DefaultMaxAnswers))}
	s.maxBytes = cmp.Or(max(cfg.MaxAnswerBytes, 0), DefaultMaxAnswerBytes)
	s.writeTimeout = cmp.Or(max(cfg.WriteTimeout, 0), DefaultWriteTimeout)
	s.fwdTimeout = cmp.Or(max(cfg.ForwardTimeout, 0), forwardTimeout)
	return s
}

// Close makes every long-poll waiting now, and every one that starts from
// now on, answer at once with what it has (a valid next_batch), so that a
// graceful stop is not held up by clients waiting for news.
func (s *Service) Close() { s.close() }

// Routes registers the client API on mux.
func (s *Service) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/rooms/{room}/messages", s.postMessage)
	mux.HandleFunc("PUT /v1/rooms/{room}/state/{key}", s.putState)
	mux.HandleFunc("GET /v1/rooms/{room}/state", s.getState)
	mux.HandleFunc("PUT /v1/rooms/{room}/typing/{user}", s.putTyping)
	mux.HandleFunc("GET /v1/sync", s.sync)
}

// AdminRoutes registers the operator's routes on mux, each behind the
// bearer derived from Config.AdminSecret: POST /v1/rooms/{room}/recompute, which
// rebuilds a room's state inside its writer's shared commit (looped on a
// big room, it slows every other room of that writer), so that a client
// cannot run it.
func (s *Service) AdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/rooms/{room}/recompute", s.recompute)
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

// roomRequest reads a request to a room's named sub-resource: the room,
// the path parameter name (matching re, described by want) and the JSON
// body into req. On a bad one it answers 400 and returns false.
func (s *Service) roomRequest(w http.ResponseWriter, r *http.Request, name string, re *regexp.Regexp, want string, req any) (room, v string, ok bool) {
	if room, ok = s.room(w, r); !ok {
		return "", "", false
	}
	if v, ok = pathParam(w, r, name, re, want); !ok {
		return "", "", false
	}
	return room, v, decodeBody(w, r, req)
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
	case strings.ContainsRune(req.TxnID, 0):
		badRequest(w, "txn_id", "txn_id must not contain U+0000")
		return
	case strings.ContainsRune(*req.Body, 0):
		// PostgreSQL cannot store it: refuse it here, not as a failed write.
		badRequest(w, "body", "body must not contain U+0000")
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
	var req stateReq
	room, key, ok := s.roomRequest(w, r, "key", keyRE, "0-255 of [A-Za-z0-9:._-]", &req)
	if !ok {
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
	if p := jsonbProblem(req.Value); p != "" {
		badRequest(w, "value", "value: %s", p)
		return
	}
	switch {
	case len(req.TxnID) > 255:
		badRequest(w, "txn_id", "txn_id: want 1-255 bytes")
		return
	case strings.ContainsRune(req.TxnID, 0):
		badRequest(w, "txn_id", "txn_id must not contain U+0000")
		return
	case req.TxnID == "":
		req.TxnID = randomID()
	}
	content, _ := json.Marshal(map[string]json.RawMessage{"value": req.Value})
	s.persist(w, r, room, persistReq{Sender: req.Sender, TxnID: req.TxnID, Kind: "state", StateKey: &key, Content: content})
}

// forwarded is a task to run on its key's owner, and how to speak of it
// to the client.
type forwarded struct {
	key  string
	task shard.Task
	idem string
	// what is done and who does it, for messages: "writing the event",
	// "the owner of room R".
	what, owner string
	// reused is the answer when the idempotency key was used for another
	// request; nil where keys are random.
	reused *apiError
}

// forward runs t on its owner. On failure it answers the client and
// reports false. The answer never carries an internal address or a peer's
// error text (those are logged), and is the same whichever instance the
// client asked, the owner included:
//
//   - the owner refused the request with a 4xx naming a field of it: the
//     same code, error and field (a reused idempotency key: t.reused).
//   - the owner could not be asked or did not answer within
//     forwardTimeout (no known URL, refused, timeouts, 5xx after the
//     retries, its queue full or closed, a stalled owner), or the cluster
//     disagrees with itself (not the owner twice): 503 with Retry-After,
//     "<owner> is unavailable; retry".
//   - the owner refused this instance's secret (its 401 or 403): 502
//     naming it, without Retry-After: a misconfiguration.
//   - the owner's database is unavailable (the task's error wraps
//     shard.ErrUnavailable: the owner answers 503, or the local executor
//     says so): 503 with Retry-After.
//   - the task ran on the owner and failed (its 500, or the local
//     executor's error): 500, "<what> failed on <owner>; retrying is safe".
//     Safe because a failed persist rolled back, or its commit did land
//     and the retry finds it by (sender, txn_id); the owner remembers no
//     failure, so the retry runs again instead of replaying the 500.
func (s *Service) forward(w http.ResponseWriter, r *http.Request, f Forwarder, t forwarded) (json.RawMessage, bool) {
	// A stalled owner (SIGSTOP, a frozen VM) accepts connections and never
	// answers: without a bound its clients would wait for every attempt's
	// timeout, past its lease, and a room whose owner no instance runs
	// would wait until one does. The task may still run; the client's
	// retry with the same idempotency key finds it.
	ctx, cancel := context.WithTimeout(r.Context(), s.fwdTimeout)
	defer cancel()
	res, err := f.Do(ctx, t.key, t.task, t.idem)
	if err == nil && res.Err == nil {
		return res.Value, true
	}
	var rej *shard.RejectedError
	switch {
	case err == nil && errors.Is(res.Err, shard.ErrUnavailable):
		s.log.Debug("the owner's database is unavailable", "kind", t.task.Kind, "key", t.key, "err", res.Err)
		unavailable(w, t.owner+" cannot reach its database; retry")
	case err == nil:
		s.log.Warn("task failed on its owner", "kind", t.task.Kind, "key", t.key, "err", res.Err)
		writeJSON(w, http.StatusInternalServerError, apiError{Error: t.what + " failed on " + t.owner + "; retrying is safe"})
	case errors.Is(err, shard.ErrIdempotencyKeyReused) && t.reused != nil:
		writeJSON(w, http.StatusConflict, *t.reused)
	case errors.As(err, &rej) && (rej.Code == http.StatusUnauthorized || rej.Code == http.StatusForbidden):
		// The owner refused this instance's credentials: a misconfigured
		// --secret on one side, which no retry cures. Said as what it is,
		// without Retry-After, so neither client nor operator waits on it.
		s.log.Error("the owner refused this instance's secret: --secret differs from the owner's", "kind", t.task.Kind, "key", t.key, "err", err)
		writeJSON(w, http.StatusBadGateway, apiError{Error: fmt.Sprintf("%s refused this instance (%d %s): the instances' --secret differ, a misconfiguration; retrying does not help",
			t.owner, rej.Code, rej.Message)})
	case errors.As(err, &rej) && rej.Field != "":
		s.log.Info("the owner refused a forwarded task", "kind", t.task.Kind, "key", t.key, "err", err)
		writeJSON(w, rej.Code, apiError{Error: rej.Message, Field: rej.Field})
	default:
		level := slog.LevelWarn
		if r.Context().Err() != nil {
			level = slog.LevelDebug // the client left; nobody reads the answer
		}
		s.log.Log(r.Context(), level, "could not run a task on its owner", "kind", t.task.Kind, "key", t.key, "err", err)
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			unavailable(w, fmt.Sprintf("%s did not answer within %v; retry", t.owner, s.fwdTimeout))
			return nil, false
		}
		unavailable(w, t.owner+" is unavailable; retry")
	}
	return nil, false
}

// unavailable answers 503: the client should retry shortly.
func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, apiError{Error: msg})
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

// txnReused is the 409 for a (sender, txn_id) already used by another
// request: the same from every instance, whichever layer notices.
func txnReused(req persistReq) *apiError {
	return &apiError{Error: fmt.Sprintf("txn_id %q was already used by sender %q for a different request", req.TxnID, req.Sender), Field: "txn_id"}
}

// persist forwards the event to the room's owner, then waits until this
// instance sees it (read your writes). The forwarding idempotency key is
// derived from (sender, txn_id), so any txn_id the API accepts can be
// forwarded, and a client's retry through any instance runs once.
func (s *Service) persist(w http.ResponseWriter, r *http.Request, room string, req persistReq) {
	payload, _ := json.Marshal(req)
	value, ok := s.forward(w, r, s.eventsFwd, forwarded{key: room, task: shard.Task{Kind: KindPersist, Payload: payload, Batchable: true},
		idem: shard.DeriveIdempotencyKey(req.Sender, req.TxnID), what: "writing the event", owner: "the owner of room " + room, reused: txnReused(req)})
	if !ok {
		return
	}
	var ans persistAns
	if err := json.Unmarshal(value, &ans); err != nil || (!ans.TxnReused && ans.EventID == "") {
		s.log.Error("the owner's answer to a persist is not one", "room", room, "answer", string(value), "err", err)
		writeJSON(w, http.StatusBadGateway, apiError{Error: "the owner of room " + room + " answered something that is not a write's result"})
		return
	}
	if ans.TxnReused {
		writeJSON(w, http.StatusConflict, txnReused(req))
		return
	}
	if !s.visibleAt(w, r, core.Key{Stream: EventsStream, Writer: ans.Writer}, ans.StreamPos) {
		return
	}
	if err := s.listWriter(r.Context(), ans.Writer, ans.StreamPos); err != nil {
		s.log.Warn("reading the writer registry after a write", "room", room, "writer", ans.Writer, "err", err)
		unavailable(w, "the write succeeded but this instance could not read its writer registry; retry with the same txn_id")
		return
	}
	tok, err := s.writeToken(r.Context(), ans.Writer)
	if err != nil {
		s.log.Warn("reading the sync token after a write", "room", room, "err", err)
		unavailable(w, "the write succeeded but its sync token could not be read; retry with the same txn_id")
		return
	}
	writeJSON(w, http.StatusOK, writeResp{EventID: ans.EventID, StreamPos: ans.StreamPos, Writer: ans.Writer, SyncToken: tok.String()})
}

// listWriter makes sure this instance's registry lists writer, which
// wrote at pos: a sync reads the writers its registry lists, and a writer
// that registered since the last read of it (one started a moment ago,
// the refresh behind on a loaded host) would be left out of the syncs
// after a write this instance has just answered as visible.
func (s *Service) listWriter(ctx context.Context, writer string, pos int64) error {
	id, err := s.events.WriterID(ctx, writer)
	if err != nil {
		return err
	}
	if s.events.Registry().Lists(id) {
		return nil
	}
	// Not listed: it registered after the last read, so above its cap
	// (a Registry's contract), and pos lies above ComputedUpto.
	return s.events.RaiseCap(ctx, pos)
}

// writeToken is currentToken after a write by writer, which it covers
// even when this instance's registry does not list writer yet.
func (s *Service) writeToken(ctx context.Context, writer string) (streams.Token, error) {
	id, err := s.events.WriterID(ctx, writer)
	if err != nil {
		return streams.Token{}, err
	}
	reg := s.events.Registry()
	views := s.views(reg)
	views[id] = max(views[id], s.node.View(core.Key{Stream: EventsStream, Writer: writer}))
	return reg.Token(views), nil
}

func (s *Service) recompute(w http.ResponseWriter, r *http.Request) {
	if !s.admin.Allows(r) {
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or wrong bearer secret: recompute is an operator's route"})
		return
	}
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	if value, ok := s.forward(w, r, s.eventsFwd, forwarded{key: room, task: shard.Task{Kind: KindRecompute}, idem: "recompute/" + randomID(),
		what: "recomputing the state", owner: "the owner of room " + room}); ok {
		writeJSON(w, http.StatusOK, value)
	}
}

// maxStatePage bounds the keys of one state page, besides its bytes.
const maxStatePage = 1000

// stateEnvelope bounds a state page without its keys:
// `{"room":"","state":{},"next":""}`, a room and a key of 255 bytes.
const stateEnvelope = 600

type stateResp struct {
	Room  string                     `json:"room"`
	State map[string]json.RawMessage `json:"state"`
	// Next is set when more keys follow: the next page is ?after=Next.
	Next *string `json:"next,omitempty"`
}

// getState answers a page of the room's state: its keys in order after
// ?after= (from the first without it), up to maxStatePage keys and the
// answer's byte budget (at least one key), and next when more follow.
// Pages are read one at a time: a key written between two pages shows
// its value at the time of the page that holds it.
func (s *Service) getState(w http.ResponseWriter, r *http.Request) {
	room, ok := s.room(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	if len(q["after"]) > 1 {
		badRequest(w, "after", "given more than once")
		return
	}
	after, hasAfter := q.Get("after"), q.Has("after")
	if !keyRE.MatchString(after) {
		badRequest(w, "after", "after %.64q: want a state key, 0-255 of [A-Za-z0-9:._-]", after)
		return
	}
	if !s.polls.acquire() {
		s.busy(w)
		return
	}
	defer s.polls.release()
	if !s.answers.acquire(r.Context()) {
		return // the client left
	}
	defer s.answers.release()
	var rows pgx.Rows
	var err error
	if hasAfter {
		rows, err = s.pool.Query(r.Context(), `SELECT key, value FROM room_state WHERE room = $1 AND key > $2 ORDER BY key LIMIT $3`, room, after, maxStatePage+1)
	} else {
		rows, err = s.pool.Query(r.Context(), `SELECT key, value FROM room_state WHERE room = $1 ORDER BY key LIMIT $2`, room, maxStatePage+1)
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	resp := stateResp{Room: room, State: map[string]json.RawMessage{}}
	var k, last string
	var v json.RawMessage
	size := stateEnvelope
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
		ev := compactEvent(v)
		n := len(k) + 4 + len(ev) // "key":value,
		if len(resp.State) == maxStatePage || (len(resp.State) > 0 && size+n > s.maxBytes) {
			next := last
			resp.Next = &next
			return errPageFull
		}
		size += n
		resp.State[k], last = ev, k
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	s.writeAnswer(w, resp)
}

type typingBody struct {
	Typing    *bool `json:"typing"`
	TimeoutMS int64 `json:"timeout_ms"`
}

func (s *Service) putTyping(w http.ResponseWriter, r *http.Request) {
	var req typingBody
	room, user, ok := s.roomRequest(w, r, "user", userRE, "1-255 of [A-Za-z0-9@:._=-]", &req)
	if !ok {
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
	value, ok := s.forward(w, r, s.typingFwd, forwarded{key: room, task: shard.Task{Kind: KindTyping, Payload: payload}, idem: "typing/" + randomID(),
		what: "setting typing", owner: "the typing writer"})
	if !ok {
		return
	}
	var out typingAns
	_ = json.Unmarshal(value, &out)
	if out.Refused != "" {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, apiError{Error: out.Refused})
		return
	}
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
