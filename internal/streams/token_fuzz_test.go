package streams_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/streams"
)

// FuzzParseToken checks that ParseToken never panics and is strict: whatever
// it accepts is canonical, so formatting it gives back the input byte for
// byte. Tokens come from clients, so this is the package's attack surface.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{
		// valid
		"m0", "m56", "m56~2.58~3.59", "m0~1.1", "m10~1.20~7.11~2147483647.12",
		"m9223372036854775806~1.9223372036854775807",
		"m1~1.2~2.3~3.4~4.5~5.6~6.7~7.8~8.9",
		// invalid, one per reason
		"m5" + strings.Repeat("~1.6", streams.MaxTokenEntries+1),
		"", "x56", "M56", "56", "\xff", "m", "m01", "m00", "m-1", "m+1", "m 1",
		"m9223372036854775808", "m5x", "m5~2.6 ", "m5~", "m5~.6", "m5~0.6",
		"m5~-1.6", "m5~02.6", "m5~2147483648.6", "m5~2", "m5~2~3.6", "m5~2.",
		"m5~2.06", "m5~2.9223372036854775808", "m5~2.5", "m5~2.6~3.5",
		"m5~3.6~2.7", "m5~3.6~3.7", "m5~2.6.7", "m5~2.6~", "m5~~2.6", "m5%7E2.6",
		"m5~2.6\x00", "m٣", "m5~２.6",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tk, err := streams.ParseToken(s)
		if err != nil {
			if !errors.Is(err, streams.ErrBadToken) {
				t.Fatalf("ParseToken(%q): error %v does not wrap ErrBadToken", s, err)
			}
			if !tk.Equal(streams.Token{}) {
				t.Fatalf("ParseToken(%q) returned %v with error %v", s, tk, err)
			}
			return
		}
		if got := tk.String(); got != s {
			t.Fatalf("ParseToken(%q).String() = %q", s, got)
		}
		checkCanonical(t, "ParseToken("+s+")", tk)
		if len(tk.Entries()) > streams.MaxTokenEntries || len(s) > streams.MaxTokenLen {
			t.Fatalf("ParseToken accepted %q beyond the limits", s)
		}
		again, err := streams.ParseToken(tk.String())
		if err != nil || !again.Equal(tk) || again.Compare(tk) != streams.Equal {
			t.Fatalf("ParseToken(%q) = %v, %v; want %v", tk.String(), again, err, tk)
		}
	})
}
