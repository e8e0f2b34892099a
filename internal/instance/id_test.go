package instance

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

var idPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}-[a-z2-7]{8}$`)

func TestValidName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string // substring of the error; "" means valid
	}{
		{"a", ""},
		{"persister1", ""},
		{"sync", ""},
		{"event_persister-2", ""},
		{"a-", ""},
		{"w" + strings.Repeat("x", 63), ""},
		{"", "empty"},
		{"w" + strings.Repeat("x", 64), "at most 64"},
		{"1worker", "must start with a letter"},
		{"-worker", "must start with a letter"},
		{"_worker", "must start with a letter"},
		{"Worker", "must start with a letter"},
		{"workEr", "index 4"},
		{"worker 1", "index 6"},
		{"worker.1", "index 6"},
		{"wörker", "index 1"},
		{"worker\n", "index 6"},
	}
	for _, tt := range tests {
		err := ValidName(tt.name)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("ValidName(%q) = %v, want nil", tt.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("ValidName(%q) = nil, want error containing %q", tt.name, tt.wantErr)
			continue
		}
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidName(%q) = %v, does not wrap ErrInvalidName", tt.name, err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "instance: ") || !strings.Contains(msg, tt.wantErr) {
			t.Errorf("ValidName(%q) = %q, want prefix %q and %q inside", tt.name, msg, "instance: ", tt.wantErr)
		}
	}
}

func TestNewIDFromDeterministic(t *testing.T) {
	tests := []struct {
		name string
		raw  []byte
		want string
	}{
		// 40 zero bits encode as eight 'a's, 40 one bits as eight '7's.
		{"persister1", []byte{0, 0, 0, 0, 0}, "persister1-aaaaaaaa"},
		{"persister1", []byte{0xff, 0xff, 0xff, 0xff, 0xff}, "persister1-77777777"},
		// "hello" in RFC 4648 base32 is NBSWY3DP.
		{"sync", []byte("hello"), "sync-nbswy3dp"},
		{"a-b", []byte("hello"), "a-b-nbswy3dp"},
	}
	for _, tt := range tests {
		got, err := NewIDFrom(tt.name, bytes.NewReader(tt.raw))
		if err != nil {
			t.Fatalf("NewIDFrom(%q, %x): %v", tt.name, tt.raw, err)
		}
		if got != tt.want {
			t.Errorf("NewIDFrom(%q, %x) = %q, want %q", tt.name, tt.raw, got, tt.want)
		}
		if name, ok := NameOf(got); !ok || name != tt.name {
			t.Errorf("NameOf(%q) = %q, %v, want %q, true", got, name, ok, tt.name)
		}
	}
}

func TestNewIDErrors(t *testing.T) {
	if _, err := NewID("Bad"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("NewID(%q) error = %v, want ErrInvalidName", "Bad", err)
	}
	// A short read must fail rather than produce a low-entropy ID.
	_, err := NewIDFrom("sync", bytes.NewReader([]byte{1, 2, 3}))
	if err == nil || !strings.HasPrefix(err.Error(), "instance: ") {
		t.Errorf("NewIDFrom with 3 random bytes: err = %v, want an instance: error", err)
	}
	_, err = NewIDFrom("sync", iotest.ErrReader(errors.New("boom")))
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("NewIDFrom with failing reader: err = %v, want it to wrap boom", err)
	}
}

func TestNewIDFormatAndUniqueness(t *testing.T) {
	const n = 10_000
	seen := make(map[string]struct{}, n)
	for i := 0; i < n; i++ {
		id, err := NewID("persister1")
		if err != nil {
			t.Fatal(err)
		}
		if !idPattern.MatchString(id) {
			t.Fatalf("NewID = %q, does not match %s", id, idPattern)
		}
		if _, dup := seen[id]; dup {
			t.Fatalf("NewID returned %q twice within %d IDs", id, i+1)
		}
		seen[id] = struct{}{}
		if name, ok := NameOf(id); !ok || name != "persister1" {
			t.Fatalf("NameOf(%q) = %q, %v", id, name, ok)
		}
	}
}

func TestNameOf(t *testing.T) {
	tests := []struct {
		id   string
		want string // "" means not an instance ID
	}{
		{"persister1-k3jqx2qa", "persister1"},
		{"event-persister-2-abcdefgh", "event-persister-2"},
		{"a-22222222", "a"},
		{"persister1", ""},
		{"-abcdefgh", ""},          // empty name
		{"persister1-abcdefg", ""}, // suffix too short
		{"persister1-abcdefghi", ""},
		{"persister1-ABCDEFGH", ""}, // upper case is not the alphabet
		{"persister1-abcdefg1", ""}, // 0, 1, 8, 9 are not base32
		{"persister1-k3j9x2qa", ""},
		{"Persister1-abcdefgh", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, ok := NameOf(tt.id)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("NameOf(%q) = %q, %v, want %q, %v", tt.id, got, ok, tt.want, tt.want != "")
		}
	}
}

func BenchmarkNewID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewID("persister1"); err != nil {
			b.Fatal(err)
		}
	}
}
