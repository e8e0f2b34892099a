package shard

import (
	"slices"
	"strings"
	"testing"
)

func TestNewMapErrors(t *testing.T) {
	tests := []struct {
		writers []string
		wantErr string
	}{
		{nil, "at least one writer"},
		{[]string{}, "at least one writer"},
		{[]string{"w1", "W2"}, `writer 1: instance: invalid name "W2"`},
		{[]string{"w1", ""}, "writer 1: instance: invalid name: empty"},
		{[]string{"w1", "w2", "w1"}, `"w1" listed twice (at 0 and 2)`},
	}
	for _, tt := range tests {
		_, err := NewMap(tt.writers)
		if err == nil || !strings.HasPrefix(err.Error(), "shard: ") || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewMap(%q) error = %v, want one containing %q", tt.writers, err, tt.wantErr)
		}
	}
}

func TestMapCopiesWriters(t *testing.T) {
	in := []string{"worker1", "worker2"}
	m, err := NewMap(in)
	if err != nil {
		t.Fatal(err)
	}
	in[0] = "changed"
	out := m.Writers()
	out[1] = "changed"
	if got := m.Writers(); !slices.Equal(got, []string{"worker1", "worker2"}) {
		t.Errorf("Writers() = %q after callers modified their slices", got)
	}
	if got := m.Owner("!foo:test"); got != "worker1" {
		t.Errorf("Owner = %q, want worker1", got)
	}
}

// The map gives each key to rendezvous.Owner's name, and Owns agrees.
func TestMapOwnerIsRendezvous(t *testing.T) {
	ws := []string{"worker1", "worker2", "persister1"}
	m, err := NewMap(ws)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		key := "!room" + strings.Repeat("x", i%7) + ":test"
		want := Owner(key, ws)
		if got := m.Owner(key); got != want || !m.Owns(want, key) {
			t.Fatalf("key %s: Map.Owner %q, Owner %q", key, got, want)
		}
	}
}
