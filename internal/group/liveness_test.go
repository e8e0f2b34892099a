package group

import (
	"slices"
	"testing"
	"time"
)

// The watch takes a member for dead only once its lock was seen held and
// then absent at every look for the grace, with no server restart or
// failed look in between.
func TestWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	boot := time.Unix(1, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	look := func(ms int, server time.Time, held map[string]bool) Look {
		return Look{At: at(ms), Server: server, Held: held}
	}
	type step struct {
		look   Look
		failed bool
		dead   []string
	}
	for name, steps := range map[string][]step{
		"seen, then gone for the grace": {
			{look: look(0, boot, map[string]bool{"a": true, "b": true})},
			{look: look(250, boot, map[string]bool{"a": false, "b": true})},
			{look: look(500, boot, map[string]bool{"a": false, "b": true})},
			{look: look(750, boot, map[string]bool{"a": false, "b": true}), dead: []string{"a"}},
			{look: look(1000, boot, map[string]bool{"a": false, "b": true}), dead: []string{"a"}}, // until expired
			{look: look(1250, boot, map[string]bool{"b": true})},
		},
		"never seen held: the lease's": {
			{look: look(0, boot, map[string]bool{"a": false})},
			{look: look(1000, boot, map[string]bool{"a": false})},
		},
		"back within the grace": {
			{look: look(0, boot, map[string]bool{"a": true})},
			{look: look(250, boot, map[string]bool{"a": false})},
			{look: look(500, boot, map[string]bool{"a": true})},
			{look: look(750, boot, map[string]bool{"a": false})},
			{look: look(1000, boot, map[string]bool{"a": false})},
		},
		"a server restart forgets": {
			{look: look(0, boot, map[string]bool{"a": true})},
			{look: look(250, time.Unix(2, 0), map[string]bool{"a": false})},
			{look: look(1000, time.Unix(2, 0), map[string]bool{"a": false})},
		},
		"a failed look forgets": {
			{look: look(0, boot, map[string]bool{"a": true})},
			{look: look(250, boot, map[string]bool{"a": false})},
			{failed: true},
			{look: look(1000, boot, map[string]bool{"a": false})},
		},
		"gone from the looks (expired), then back without its lock": {
			{look: look(0, boot, map[string]bool{"a": true})},
			{look: look(250, boot, map[string]bool{})},
			{look: look(1000, boot, map[string]bool{"a": false})},
			{look: look(2000, boot, map[string]bool{"a": false})},
		},
	} {
		t.Run(name, func(t *testing.T) {
			w := NewWatch(500 * time.Millisecond)
			for i, s := range steps {
				if s.failed {
					w.Failed()
					continue
				}
				if got := w.Observe(s.look); !slices.Equal(got, s.dead) {
					t.Fatalf("look %d: dead %v; want %v", i, got, s.dead)
				}
			}
		})
	}
}
