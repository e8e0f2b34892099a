package catchup

import (
	"net/http"
	"time"
)

// HTTPLimits bounds what a client can hold of a server built by
// NewHTTPServerWith. Zero values mean the defaults.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers [5 s].
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body
	// [15 s]. It does not bound a handler once the handler has read its
	// body to the end, or got none (see NewHTTPServerWith).
	ReadTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers [16 KiB].
	MaxHeaderBytes int
	// IdleTimeout bounds an idle keep-alive connection [2 min].
	IdleTimeout time.Duration
}

// Default HTTP limits.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultIdleTimeout       = 2 * time.Minute
)

// NewHTTPServer is NewHTTPServerWith the default limits.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return NewHTTPServerWith(addr, h, HTTPLimits{})
}

// NewHTTPServerWith returns an http.Server for h whose clients cannot hold
// a connection and a goroutine by sending slowly: the headers must arrive
// within ReadHeaderTimeout and fit MaxHeaderBytes, the whole request, body
// included, within ReadTimeout, or the connection is closed; an idle
// keep-alive connection is closed after IdleTimeout. A server that mounts
// the catch-up Server must bound requests like this: the Server bounds a
// body's size but cannot see headers before net/http reads them, nor time
// a body it is handed.
//
// Long-polls keep working with ReadTimeout set. Once a request has no body
// left to read (it had none, or its handler read it to the end), net/http
// reads the connection in the background to notice a client that leaves,
// and it clears the read deadline as it starts to (connReader's
// startBackgroundRead): a handler may then wait as long as it likes (a
// sync waits up to 120 s). A handler that waits without reading its whole
// body keeps the deadline, which only stops net/http from draining the
// rest once it answered; the connection is then closed. WriteTimeout stays
// zero: handlers bound their own time, and a long-poll writes nothing
// until it answers.
func NewHTTPServerWith(addr string, h http.Handler, l HTTPLimits) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: positiveOr(l.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       positiveOr(l.ReadTimeout, DefaultReadTimeout),
		MaxHeaderBytes:    positiveOr(l.MaxHeaderBytes, DefaultMaxHeaderBytes),
		IdleTimeout:       positiveOr(l.IdleTimeout, DefaultIdleTimeout),
	}
}

// positiveOr returns v, or def when v is not positive: the default of a
// config field whose zero (or negative) value means "the default".
func positiveOr[T time.Duration | int | int64](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
