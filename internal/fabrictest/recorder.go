// Package fabrictest holds test helpers shared by the packages built on the
// fabric: a Handler that records what it is given and checks the fabric's
// delivery promise (every writer's rows exactly once, in order).
package fabrictest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/weft-dev/weft/internal/fabric/core"
)

// Recorder is a fabric.Handler that keeps the positions it was given per
// writer and notes every duplicate or reordered delivery.
type Recorder struct {
	mu     sync.Mutex
	rows   map[core.Key][]int64
	bodies map[core.Key][]json.RawMessage
	errs   []string
	resets int
	// Reject, when set, may refuse rows (a poisoned backlog).
	Reject func(core.Key, int64) error
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{rows: map[core.Key][]int64{}, bodies: map[core.Key][]json.RawMessage{}}
}

// Apply implements fabric.Handler.
func (r *Recorder) Apply(_ context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Reject != nil {
		if err := r.Reject(k, pos); err != nil {
			return err
		}
	}
	if !json.Valid(rows) {
		r.errs = append(r.errs, fmt.Sprintf("%s at %d: invalid rows %q", k, pos, rows))
	}
	got := r.rows[k]
	if n := len(got); n > 0 && got[n-1] >= pos {
		r.errs = append(r.errs, fmt.Sprintf("%s: %d after %d (duplicate or reordered)", k, pos, got[n-1]))
	}
	r.rows[k] = append(got, pos)
	r.bodies[k] = append(r.bodies[k], slices.Clone(rows))
	return nil
}

// Reset implements fabric.Handler.
func (r *Recorder) Reset(k core.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rows, k)
	delete(r.bodies, k)
	r.resets++
}

// Positions is what was applied for k since its last reset.
func (r *Recorder) Positions(k core.Key) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rows[k])
}

// Bodies is the rows applied for k since its last reset.
func (r *Recorder) Bodies(k core.Key) []json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bodies[k])
}

// Resets counts Reset calls.
func (r *Recorder) Resets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resets
}

// Problems lists duplicate, reordered or invalid deliveries.
func (r *Recorder) Problems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}
