package sqlident

import (
	"regexp"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"events": true, "_x": true, "weft_schema_version": true, "a1": true, strings.Repeat("a", 63): true,
		"": false, "1a": false, "Events": false, "a-b": false, "a.b": false, `a"b`: false, "a'b": false, "a b": false,
		"é": false, strings.Repeat("a", 64): false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

// Valid is the regular expression the packages used before, byte for byte.
func FuzzValid(f *testing.F) {
	re := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	for _, s := range []string{"events", "", "1a", "A", "a\n", strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Valid(s) != re.MatchString(s) {
			t.Fatalf("Valid(%q) = %v, the regexp says %v", s, Valid(s), re.MatchString(s))
		}
	})
}
