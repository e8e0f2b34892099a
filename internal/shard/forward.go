package shard

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/telemetry"
)

// Forwarder defaults.
const (
	DefaultForwardRetries = 3
	DefaultForwardTimeout = 10 * time.Second
)

var (
	// ErrOwnerUnreachable: the owner could not be asked, or did not
	// answer, within the retries (no known URL, connection refused,
	// timeouts, 5xx, a full or closed queue). The task may or may not have
	// run; retrying with the same idempotency key is safe.
	ErrOwnerUnreachable = errors.New("shard: owner unreachable")
	// ErrNotOwner: the instance reached refused the key (409), twice.
	ErrNotOwner = errors.New("shard: not owner")
	// ErrBadKey: the key is empty, longer than MaxKeyLen or not UTF-8;
	// nothing was run.
	ErrBadKey = errors.New("shard: bad key")
	// ErrIdempotencyKeyReused: the owner already ran another request
	// under the idempotency key for this key (its 422). A *RejectedError
	// matches it.
	ErrIdempotencyKeyReused = errors.New("shard: idempotency key already used for a different request")
)

// RejectedError is a 4xx from the owner other than 409 "not owner": it
// refused the request, which did not run and would be refused again.
// Field is the request field the owner named ("" when it named none: a
// wrong secret, an unknown route), Message its error.
type RejectedError struct {
	Owner   string // writer name
	Code    int
	Message string
	Field   string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("shard: %s refused the request: %d: %s", e.Owner, e.Code, e.Message)
}

// Is matches ErrIdempotencyKeyReused for the owner's 422.
func (e *RejectedError) Is(target error) bool {
	return target == ErrIdempotencyKeyReused && e.Code == http.StatusUnprocessableEntity && e.Field == "idempotency_key"
}

// TaskError is a task's own failure on a remote owner (HTTP 500): the task
// ran and failed. It is the Result's Err, not Do's error.
type TaskError struct {
	Owner   string // writer name
	Message string
}

func (e *TaskError) Error() string { return "shard: task failed on " + e.Owner + ": " + e.Message }

// Resolver returns the base URL (scheme://host:port) of the instance that
// currently holds a writer name, as announced in HELLO; ok is false when
// none is known.
type Resolver func(writerName string) (url string, ok bool)

// ForwarderConfig configures a Forwarder. Zero values mean the documented
// defaults.
type ForwarderConfig struct {
	// Self is this instance's writer name; "" if it owns no keys.
	Self string
	// Map says which writer name owns a key, when the map is static.
	// Required unless Placement is set.
	Map *Map
	// Placement follows a map that changes at runtime
	// (membership.MapFollower); it must be Local's Placement too. A task
	// refused because the key moved is forwarded again to the new owner,
	// after reading the map when the refusal names a newer epoch. Set Map
	// or Placement, not both.
	Placement Placement
	// Holds, if set, reports whether this instance still holds Self (the
	// writer registry says so): an instance that lost its name to a newer
	// holder (two instances of a name during a rolling update) forwards
	// to that holder instead of running the task where nobody follows it.
	Holds func() bool
	// Local runs the keys Self owns. Required when Self is set.
	Local *Queue
	// Resolve finds the owner's current URL. Required.
	Resolve Resolver
	// Secret is sent as "Authorization: Bearer <Secret>"; empty sends
	// nothing (an owner in Insecure mode).
	Secret string
	// HTTPClient does the requests. Nil means a client of its own that
	// keeps up to 64 idle connections per owner and never follows
	// redirects; Close releases them.
	HTTPClient *http.Client
	// Retries is the number of HTTP attempts, the first included [3].
	// A 409 adds one more attempt, once.
	Retries int
	// Backoff is the delay between attempts.
	Backoff backoff.Config
	// Timeout bounds one HTTP attempt [10 s].
	Timeout time.Duration
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
}

// Validate names the first invalid field.
func (c *ForwarderConfig) Validate() error {
	if err := validOwners("forwarder", c.Map, c.Placement, c.Local, "Local's"); err != nil {
		return err
	}
	switch {
	case c.Resolve == nil:
		return errors.New("shard: forwarder config: Resolve is nil")
	case httpx.SecretProblem(c.Secret) != "":
		return fmt.Errorf("shard: forwarder config: Secret %s", httpx.SecretProblem(c.Secret))
	case c.Self != "" && c.Local == nil:
		return fmt.Errorf("shard: forwarder config: Local is nil but Self is %q", c.Self)
	case c.Retries < 0:
		return fmt.Errorf("shard: forwarder config: Retries %d is negative", c.Retries)
	case c.Timeout < 0:
		return fmt.Errorf("shard: forwarder config: Timeout %v is negative", c.Timeout)
	}
	return nil
}

// Forwarder runs a task on the owner of its key: on the local queue when
// this instance owns the key, else over HTTP on the owner's Server.
type Forwarder struct {
	cfg ForwarderConfig
	log *slog.Logger
	m   *forwarderMetrics
	hc  *http.Client
	own bool // hc is ours to close
}

// NewForwarder checks cfg and builds a Forwarder.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Retries = positive(cfg.Retries, DefaultForwardRetries)
	cfg.Timeout = positive(cfg.Timeout, DefaultForwardTimeout)
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	f := &Forwarder{cfg: cfg, log: log, m: newForwarderMetrics(reg), hc: cfg.HTTPClient}
	if f.hc == nil {
		// Every write goes to one of a few owners: keep enough idle
		// connections that a burst does not open and close new ones.
		f.hc = httpx.NewClient(64)
		f.own = true
	}
	return f, nil
}

// Close releases the idle connections of the Forwarder's own HTTP client.
// Requests in flight are not affected; it may be called more than once.
func (f *Forwarder) Close() {
	if f.own {
		f.hc.CloseIdleConnections()
	}
}

// Do runs t for key on the key's owner and returns its result. A task's
// own failure is the Result's Err; Do's error means the task was not run,
// or its outcome is unknown.
//
// When this instance owns the key, t goes to the local queue (see
// Queue.Submit; nothing is retried, so idempotencyKey is not used). Else
// it is sent to the owner, retried under the same idempotencyKey on
// network errors, timeouts and 5xx, so that the owner runs it once; an
// empty idempotencyKey gets a random one. Pass the end client's own
// request ID where there is one, so that the client's retries are
// deduplicated too. A 409 (the instance reached does not own the key: the
// writer name moved to another instance, or the shard maps disagree)
// resolves the owner again and retries once. Any other 4xx is not retried:
// the error is a *RejectedError (matching ErrIdempotencyKeyReused for a
// reused key). A key the owner would refuse (empty, longer than MaxKeyLen,
// not UTF-8) fails with ErrBadKey before anything is queued or sent; any
// other key, "." and ".." included, reaches the owner's Server through any
// router (its path segment is escaped so that none cleans it away).
func (f *Forwarder) Do(ctx context.Context, key string, t Task, idempotencyKey string) (Result, error) {
	start := time.Now()
	if reason := keyProblem(key); reason != "" {
		return Result{}, fmt.Errorf("shard: forward %s for key %.64q: %w: %s", t.Kind, key, ErrBadKey, reason)
	}
	if idempotencyKey == "" {
		idempotencyKey = newIdempotencyKey()
	} else if reason := idempotencyKeyProblem(idempotencyKey); reason != "" {
		return Result{}, fmt.Errorf("shard: forward %s for key %q: idempotency key: %s", t.Kind, key, reason)
	}
	bo := f.cfg.Backoff.NewBackOff()
	for moves := 0; ; moves++ {
		owner, epoch := f.owner(key)
		if f.cfg.Self != "" && owner == f.cfg.Self && (f.cfg.Holds == nil || f.cfg.Holds()) {
			f.m.requests.WithLabelValues(fwdLocal).Inc()
			res, d, err := f.cfg.Local.SubmitAt(ctx, key, t, epoch)
			if err != nil || d.Verdict == handover.Accept {
				f.m.duration.WithLabelValues("local").Observe(time.Since(start).Seconds())
				return res, err
			}
			// The map moved under us between Owner and Admit, or the
			// key still drains an earlier ownership here.
			if err := f.moved(ctx, key, t.Kind, moves, d, bo); err != nil {
				return Result{}, err
			}
			continue
		}
		body, err := json.Marshal(request{Kind: t.Kind, Payload: t.Payload, IdempotencyKey: idempotencyKey, Batchable: t.Batchable, Epoch: epoch})
		if err != nil {
			return Result{}, fmt.Errorf("shard: forward %s for key %q: payload: %w", t.Kind, key, err)
		}
		res, err := f.remote(ctx, owner, key, t.Kind, body)
		var mv *movedError
		if errors.As(err, &mv) {
			if err := f.moved(ctx, key, t.Kind, moves, handover.Decision{Verdict: handover.Refuse, Owner: mv.owner, Epoch: mv.epoch}, bo); err != nil {
				return Result{}, fmt.Errorf("%w (last: %w)", err, mv.err)
			}
			continue
		}
		f.m.duration.WithLabelValues("remote").Observe(time.Since(start).Seconds())
		return res, err
	}
}

// maxMoves bounds how often one task follows a moving key: each move is a
// map change that raced it, so a handful means the map is flapping.
const maxMoves = 8

// moved handles a refusal with a Placement: read the map (a newer epoch
// was named, or ours is stale), or wait a little (the key still drains
// tasks of an earlier ownership), then let Do try again.
func (f *Forwarder) moved(ctx context.Context, key, kind string, moves int, d handover.Decision, bo cbackoff.BackOff) error {
	if moves >= maxMoves {
		return fmt.Errorf("shard: forward %s for key %q: %w: the key moved %d times (last: %s, owner %q at epoch %d)",
			kind, key, ErrNotOwner, moves, d.Verdict, d.Owner, d.Epoch)
	}
	f.m.requests.WithLabelValues(fwdMoved).Inc()
	if d.Verdict == handover.Wait {
		return sleep(ctx, bo.NextBackOff())
	}
	if _, epoch := f.owner(key); d.Epoch >= epoch {
		if err := f.cfg.Placement.Refresh(ctx); err != nil {
			f.log.Debug("reading the shard map after a refusal failed", "key", key, "err", err)
			return sleep(ctx, bo.NextBackOff())
		}
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// owner is key's owner and the map epoch (0 for a static Map).
func (f *Forwarder) owner(key string) (string, int64) {
	if f.cfg.Placement != nil {
		return f.cfg.Placement.Owner(key)
	}
	return f.cfg.Map.Owner(key), 0
}

// movedError is a 409 from an owner that names the map epoch: the key
// moved at runtime. Do reads the map and forwards again.
type movedError struct {
	owner string
	epoch int64
	err   error
}

func (e *movedError) Error() string { return e.err.Error() }

// remote sends body to owner with retries.
func (f *Forwarder) remote(ctx context.Context, owner, key, kind string, body []byte) (Result, error) {
	bo := f.cfg.Backoff.NewBackOff()
	movedOnce := false
	attempts := 0
	for {
		attempts++
		res, target, err := f.attempt(ctx, owner, key, body)
		if err == nil {
			return res, nil
		}
		ae := &attemptError{err: err}
		errors.As(err, &ae)
		switch {
		case ctx.Err() != nil:
			f.m.requests.WithLabelValues(fwdCanceled).Inc()
			return Result{}, fmt.Errorf("shard: forward %s for key %q to %s at %s: %w", kind, key, owner, target, err)
		case ae.notOwner != "" && f.cfg.Placement != nil && ae.epoch > 0:
			f.m.requests.WithLabelValues(fwdNotOwner).Inc()
			return Result{}, &movedError{owner: ae.notOwner, epoch: ae.epoch,
				err: fmt.Errorf("shard: forward %s for key %q to %s at %s: %w", kind, key, owner, target, err)}
		case ae.notOwner != "":
			f.m.requests.WithLabelValues(fwdNotOwner).Inc()
			if movedOnce {
				return Result{}, fmt.Errorf("shard: forward %s for key %q to %s at %s: %w: it says %s owns the key",
					kind, key, owner, target, ErrNotOwner, ae.notOwner)
			}
			movedOnce = true
			attempts--
			f.log.Info("owner refused the key, resolving it again", "key", key, "owner", owner, "url", target, "says", ae.notOwner)
			continue
		case !ae.retry:
			f.m.requests.WithLabelValues(fwdRejected).Inc()
			return Result{}, fmt.Errorf("shard: forward %s for key %q to %s at %s: %w", kind, key, owner, target, err)
		}
		f.m.requests.WithLabelValues(fwdRetry).Inc()
		if attempts >= f.cfg.Retries {
			return Result{}, fmt.Errorf("shard: forward %s for key %q to %s at %s: %d attempts: %w: %w",
				kind, key, owner, target, attempts, ErrOwnerUnreachable, err)
		}
		d := bo.NextBackOff()
		f.log.Debug("forward attempt failed, retrying", "key", key, "owner", owner, "url", target, "in", d, "err", err)
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			f.m.requests.WithLabelValues(fwdCanceled).Inc()
			return Result{}, fmt.Errorf("shard: forward %s for key %q to %s at %s: %w (after: %w)", kind, key, owner, target, ctx.Err(), err)
		case <-timer.C:
		}
	}
}

// attemptError classifies a failed attempt.
type attemptError struct {
	err      error
	retry    bool
	notOwner string // the owner a 409 named
	epoch    int64  // the map epoch it named
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// attempt is one HTTP request to owner's current URL. target is that URL,
// for messages. Every error is an *attemptError.
func (f *Forwarder) attempt(ctx context.Context, owner, key string, body []byte) (res Result, target string, err error) {
	base, ok := f.cfg.Resolve(owner)
	if !ok || base == "" {
		return Result{}, "(no URL)", &attemptError{err: fmt.Errorf("no instance known for writer %s", owner), retry: true}
	}
	target = strings.TrimRight(base, "/") + PathPrefix + httpx.PathSegment(key)
	actx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return Result{}, target, &attemptError{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	httpx.SetBearer(req.Header, f.cfg.Secret)
	resp, err := f.hc.Do(req)
	if err != nil {
		return Result{}, target, &attemptError{err: err, retry: true}
	}
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // reuse the connection
		resp.Body.Close()
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return Result{}, target, &attemptError{err: fmt.Errorf("reading the answer (%d): %w", resp.StatusCode, err), retry: true}
	}
	var ab answerBody
	jsonErr := json.Unmarshal(data, &ab)
	switch code := resp.StatusCode; {
	case code == http.StatusOK:
		if len(data) > maxResponseBody {
			return Result{}, target, &attemptError{err: fmt.Errorf("answer larger than %d bytes", maxResponseBody)}
		}
		if jsonErr != nil {
			return Result{}, target, &attemptError{err: fmt.Errorf("answer is not JSON: %w", jsonErr)}
		}
		f.m.requests.WithLabelValues(fwdOK).Inc()
		if string(ab.Value) == "null" {
			ab.Value = nil
		}
		return Result{Value: ab.Value}, target, nil
	case code == http.StatusInternalServerError && jsonErr == nil && ab.Error != "":
		f.m.requests.WithLabelValues(fwdTaskError).Inc()
		return Result{Err: &TaskError{Owner: owner, Message: ab.Error}}, target, nil
	case code == http.StatusConflict && jsonErr == nil && ab.Owner != "":
		return Result{}, target, &attemptError{err: fmt.Errorf("409: %s", ab.Error), notOwner: ab.Owner, epoch: ab.Epoch}
	case code == http.StatusTooManyRequests || code >= 500:
		return Result{}, target, &attemptError{err: fmt.Errorf("%d: %s", code, errorText(ab, data)), retry: true}
	default:
		rej := &RejectedError{Owner: owner, Code: code, Message: errorText(ab, data)}
		if jsonErr == nil {
			rej.Field = ab.Field
		}
		return Result{}, target, &attemptError{err: rej}
	}
}

// errorText is the error an answer carries, or the start of its body.
func errorText(ab answerBody, data []byte) string {
	if ab.Error != "" {
		return ab.Error
	}
	if len(data) > 200 {
		data = data[:200]
	}
	return strings.TrimSpace(string(data))
}

// DeriveIdempotencyKey derives a valid idempotency key from any strings
// (a client's user and request ID, say): base64url of the SHA-256 of the
// parts, each length-prefixed. It is 43 bytes whatever the parts hold
// (spaces, non-ASCII, 255-byte IDs), and distinct parts give distinct keys.
func DeriveIdempotencyKey(parts ...string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		io.WriteString(h, p)
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// newIdempotencyKey returns 128 random bits, URL-safe.
func newIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
