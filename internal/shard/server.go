package shard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/telemetry"
)

// ServerConfig configures a Server. Zero values mean the documented
// defaults.
type ServerConfig struct {
	// Self is this instance's writer name; "" if it owns no keys (then
	// every request is answered 409).
	Self string
	// Map says which writer name owns a key, when the map is static.
	// Required unless Placement is set.
	Map *Map
	// Placement follows a map that changes at runtime and fences the
	// handover of keys (membership.MapFollower); it must be the Queue's
	// Placement too. Set Map or Placement, not both.
	Placement Placement
	// Holds, if set, reports whether this instance still holds Self; when
	// it does not, every request is answered 409 (not owner), so that the
	// caller finds the name's current holder.
	Holds func() bool
	// Queue runs the tasks of the keys Self owns. Required.
	Queue *Queue
	// Secret is the shared bearer secret every request must carry.
	// Required unless Insecure.
	Secret string
	// PreviousSecret is accepted too, while a rotation of Secret lasts.
	PreviousSecret string
	// Insecure allows an empty Secret: every request is then accepted.
	// For development only. With a Secret set, Insecure changes nothing.
	Insecure bool
	// IdempotencyEntries bounds the successful answers remembered
	// [100000]. An entry holds digests of the keys and of the request, and
	// the task's value: tasks should answer with something small (a
	// stream position), not the data they wrote. An idempotency key is
	// scoped to its shard key.
	IdempotencyEntries int
	// IdempotencyTTL is how long a successful answer is remembered [10
	// min]. A retry after that runs the task again.
	IdempotencyTTL time.Duration
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger

	now func() time.Time // tests
}

// Validate names the first invalid field.
func (c *ServerConfig) Validate() error {
	if err := validOwners("server", c.Map, c.Placement, c.Queue, "the Queue's"); err != nil {
		return err
	}
	switch {
	case c.Queue == nil:
		return errors.New("shard: server config: Queue is nil")
	case c.Secret == "" && !c.Insecure:
		return errors.New("shard: server config: Secret is empty (set Insecure to serve without one, for development only)")
	case httpx.SecretProblem(c.Secret) != "":
		return fmt.Errorf("shard: server config: Secret %s", httpx.SecretProblem(c.Secret))
	case c.IdempotencyEntries < 0:
		return fmt.Errorf("shard: server config: IdempotencyEntries %d is negative", c.IdempotencyEntries)
	case c.IdempotencyTTL < 0:
		return fmt.Errorf("shard: server config: IdempotencyTTL %v is negative", c.IdempotencyTTL)
	}
	if c.Map != nil && c.Self != "" && !slices.Contains(c.Map.Writers(), c.Self) {
		return fmt.Errorf("shard: server config: Self %q is not a writer of the shard map %v", c.Self, c.Map.Writers())
	}
	return nil
}

// validOwners checks that the config of what (a server or a forwarder)
// names its owners one way, a static Map or a Placement, and that its
// queue q, named queue in the message, follows that same Placement.
func validOwners(what string, m *Map, p Placement, q *Queue, queue string) error {
	switch {
	case m == nil && p == nil:
		return fmt.Errorf("shard: %s config: Map and Placement are both nil", what)
	case m != nil && p != nil:
		return fmt.Errorf("shard: %s config: Map and Placement are both set", what)
	case p != nil && q != nil && q.cfg.Placement != p:
		return fmt.Errorf("shard: %s config: %s Placement is not the %s's", what, queue, what)
	}
	return nil
}

// Server is the owner's end of forwarding: it runs tasks for the keys its
// writer name owns on its Queue. Mount it at PathPrefix, on a server with
// bounded headers (catchup.NewHTTPServer).
type Server struct {
	cfg    ServerConfig
	log    *slog.Logger
	m      *serverMetrics
	secret httpx.Secret
	dedup  *dedup
}

// NewServer checks cfg and builds a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.IdempotencyEntries = positive(cfg.IdempotencyEntries, DefaultIdempotencyEntries)
	cfg.IdempotencyTTL = positive(cfg.IdempotencyTTL, DefaultIdempotencyTTL)
	if cfg.now == nil {
		cfg.now = time.Now
	}
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	if cfg.Secret != "" && len(cfg.Secret) < shortSecret {
		log.Warn("shard forwarding secret is short: use at least 16 random bytes", "length", len(cfg.Secret))
	}
	return &Server{cfg: cfg, log: log, m: newServerMetrics(reg), secret: httpx.NewSecrets(cfg.Secret, cfg.PreviousSecret),
		dedup: newDedup(cfg.IdempotencyEntries, cfg.IdempotencyTTL, cfg.now)}, nil
}

// ServeHTTP serves POST PathPrefix{key}.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, ok := s.serve(r)
	code := "aborted" // the caller left before a coalesced answer was ready
	if ok {
		a.write(w)
		code = strconv.Itoa(a.code)
	}
	s.m.requests.WithLabelValues(code).Inc()
}

// badInput is a 400 naming the field at fault.
func badInput(field, reason string) answer {
	return errorAnswer(http.StatusBadRequest, answerBody{Error: field + ": " + reason, Field: field})
}

// serve answers r; ok is false when the caller went away while waiting for
// a duplicate's answer.
func (s *Server) serve(r *http.Request) (a answer, ok bool) {
	if !s.secret.Allows(r) {
		return errorAnswer(http.StatusUnauthorized, answerBody{Error: "missing or wrong bearer secret"}), true
	}
	if r.Method != http.MethodPost {
		return errorAnswer(http.StatusMethodNotAllowed, answerBody{Error: "method not allowed: use POST"}), true
	}
	key, bad, found := parseKey(r.URL)
	if !found {
		return errorAnswer(http.StatusNotFound, answerBody{Error: "no such route"}), true
	}
	if bad != "" {
		return badInput("key", bad), true
	}
	if owner, epoch := s.owner(key); (s.cfg.Placement == nil && owner != s.cfg.Self) || s.cfg.Self == "" || (s.cfg.Holds != nil && !s.cfg.Holds()) {
		return errorAnswer(http.StatusConflict, answerBody{Error: "not owner", Owner: owner, Epoch: epoch}), true
	}
	req, errAns := readRequest(r)
	if errAns != nil {
		return *errAns, true
	}
	return s.run(r.Context(), key, req)
}

// parseKey extracts the key from the escaped path. found is false when the
// path is not PathPrefix plus one segment.
func parseKey(u *url.URL) (key, bad string, found bool) {
	esc := u.EscapedPath()
	if !strings.HasPrefix(esc, PathPrefix) {
		return "", "", false
	}
	esc = esc[len(PathPrefix):]
	if strings.Contains(esc, "/") {
		return "", "", false
	}
	key, err := url.PathUnescape(esc)
	if err != nil {
		return "", "bad escape: " + err.Error(), true
	}
	if reason := keyProblem(key); reason != "" {
		return "", reason, true
	}
	return key, "", true
}

// keyProblem says why key cannot be a key, or "" when it can: what the
// owner refuses, the Forwarder refuses before it looks for the owner, so
// that a key is refused alike wherever it is sent.
func keyProblem(key string) string {
	switch {
	case key == "":
		return "empty"
	case len(key) > MaxKeyLen:
		return fmt.Sprintf("longer than %d bytes", MaxKeyLen)
	case !utf8.ValidString(key):
		return "not UTF-8"
	}
	return ""
}

// readRequest reads and checks the body.
func readRequest(r *http.Request) (request, *answer) {
	tooLarge := errorAnswer(http.StatusRequestEntityTooLarge,
		answerBody{Error: fmt.Sprintf("body: larger than %d bytes", MaxRequestBody), Field: "body"})
	if r.ContentLength > MaxRequestBody {
		return request{}, &tooLarge
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBody+1))
	if err != nil {
		a := badInput("body", "unreadable: "+err.Error())
		return request{}, &a
	}
	if len(body) > MaxRequestBody {
		return request{}, &tooLarge
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			a := badInput(typeErr.Field, "want "+typeErr.Type.String()+", got "+typeErr.Value)
			return request{}, &a
		}
		a := badInput("body", "not a JSON object: "+err.Error())
		return request{}, &a
	}
	if bytes.TrimSpace(body)[0] != '{' { // null, say: Unmarshal accepts it
		a := badInput("body", "not a JSON object")
		return request{}, &a
	}
	if !wire.ValidName(req.Kind) {
		a := badInput("kind", "want 1-128 of [A-Za-z0-9_.:-]")
		return request{}, &a
	}
	if reason := idempotencyKeyProblem(req.IdempotencyKey); reason != "" {
		a := badInput("idempotency_key", reason)
		return request{}, &a
	}
	if req.Epoch < 0 {
		a := badInput("epoch", "negative")
		return request{}, &a
	}
	return req, nil
}

// idempotencyKeyProblem returns why k is not a valid idempotency key.
func idempotencyKeyProblem(k string) string {
	if k == "" {
		return "missing"
	}
	if len(k) > MaxIdempotencyKeyLen {
		return fmt.Sprintf("longer than %d bytes", MaxIdempotencyKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "byte outside printable ASCII"
		}
	}
	return ""
}

// run runs the task once per idempotency key.
func (s *Server) run(ctx context.Context, key string, req request) (answer, bool) {
	fp := requestFingerprint(req)
	dk := dedupKeyOf(key, req.IdempotencyKey)
	how, f, cached := s.dedup.begin(dk, fp)
	switch how {
	case lookupConflict:
		return errorAnswer(http.StatusUnprocessableEntity, answerBody{Field: "idempotency_key",
			Error: "idempotency_key: already used for a different request on this key"}), true
	case lookupCached:
		s.m.dedup.WithLabelValues("cached").Inc()
		return cached, true
	case lookupFollow:
		select {
		case <-f.done:
			s.m.dedup.WithLabelValues("coalesced").Inc()
			return f.ans, true
		case <-ctx.Done():
			return answer{}, false
		}
	}

	// The leader. It waits for the task even when its caller goes away:
	// the task runs anyway once queued, and its outcome must be
	// remembered for the retry that is surely coming.
	finished := false
	defer func() {
		if !finished { // a panic below: release the followers
			s.dedup.finish(dk, f, errorAnswer(http.StatusInternalServerError, answerBody{Error: "internal error"}), false)
		}
	}()
	a := s.submit(context.WithoutCancel(ctx), key, req)
	// Only a success is remembered. A task that did not run (queue full or
	// closed) must run on the retry; one that ran and failed is run again
	// too, so the retry that is surely coming gets its chance to succeed,
	// and gets the same answer whichever instance it comes through (the
	// owner's own writes never pass through this table). An executor's
	// failure must therefore leave nothing a second run would repeat (roll
	// back, or deduplicate on its own, as rooms does per (sender, txn_id)).
	s.dedup.finish(dk, f, a, a.code == http.StatusOK)
	finished = true
	return a, true
}

// owner is key's owner and the map epoch it is the owner at (0 for a
// static Map).
func (s *Server) owner(key string) (string, int64) {
	if s.cfg.Placement != nil {
		return s.cfg.Placement.Owner(key)
	}
	return s.cfg.Map.Owner(key), 0
}

// submit runs the task when the queue admits it, and renders the
// outcome. With a Placement, a sender ahead of this owner's map makes it
// read the map first; a key that is not this owner's any more is a 409
// naming the owner and epoch; a key still draining tasks of an earlier
// ownership here is a 503 (retry).
func (s *Server) submit(ctx context.Context, key string, req request) answer {
	t := Task{Kind: req.Kind, Payload: req.Payload, Batchable: req.Batchable}
	for refreshed := false; ; refreshed = true {
		res, d, err := s.cfg.Queue.SubmitAt(ctx, key, t, req.Epoch)
		switch {
		case err != nil || d.Verdict == handover.Accept:
			return s.render(key, req, res, err)
		case d.Verdict == handover.Behind && !refreshed:
			if rerr := s.cfg.Placement.Refresh(ctx); rerr != nil {
				s.log.Warn("shard: reading the map for a sender ahead of it failed", "key", key, "epoch", req.Epoch, "err", rerr)
			}
		case d.Verdict == handover.Refuse:
			return errorAnswer(http.StatusConflict, answerBody{Error: "not owner", Owner: d.Owner, Epoch: d.Epoch})
		case d.Verdict == handover.Wait:
			return errorAnswer(http.StatusServiceUnavailable, answerBody{Error: "the key's earlier tasks are still finishing here; retry"})
		default: // still behind after reading the map
			return errorAnswer(http.StatusServiceUnavailable, answerBody{Error: fmt.Sprintf("this owner has not reached map epoch %d yet; retry", d.Epoch)})
		}
	}
}

// render turns a task's outcome into an answer.
func (s *Server) render(key string, req request, res Result, err error) answer {
	switch {
	case errors.Is(err, ErrQueueFull), errors.Is(err, ErrClosed):
		return errorAnswer(http.StatusServiceUnavailable, answerBody{Error: err.Error()})
	case errors.Is(res.Err, ErrUnavailable):
		return errorAnswer(http.StatusServiceUnavailable, answerBody{Error: res.Err.Error()})
	case err != nil:
		return errorAnswer(http.StatusInternalServerError, answerBody{Error: err.Error()})
	case res.Err != nil:
		return errorAnswer(http.StatusInternalServerError, answerBody{Error: res.Err.Error()})
	}
	v := res.Value
	if len(v) == 0 {
		v = json.RawMessage("null")
	}
	body, mErr := json.Marshal(answerBody{Value: v})
	if mErr != nil {
		s.log.Error("shard task returned a value that is not JSON", "key", key, "kind", req.Kind, "err", mErr)
		return errorAnswer(http.StatusInternalServerError, answerBody{Error: "task value is not JSON: " + mErr.Error()})
	}
	return answer{code: http.StatusOK, body: string(append(body, '\n'))}
}

// requestFingerprint digests what the task is, not how it was encoded
// around it.
func requestFingerprint(req request) fingerprint {
	h := sha256.New()
	h.Write([]byte(req.Kind))
	if req.Batchable {
		h.Write([]byte{0, 1})
	} else {
		h.Write([]byte{0, 0})
	}
	h.Write(req.Payload)
	var fp fingerprint
	h.Sum(fp[:0])
	return fp
}
