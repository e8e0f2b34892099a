package streams_test

import (
	"testing"

	"github.com/weft-dev/weft/internal/streams"
)

// Tokens with 4 writers, the size of a small cluster, at realistic
// positions. benchA and benchB are concurrent, so Merge has to build a new
// token rather than return one of its inputs.
const (
	benchA = "m1000000~1.1000005~2.1000010~3.1000020~4.1000042"
	benchB = "m1000001~1.1000007~2.1000009~3.1000020~4.1000040"
)

var (
	sinkToken streams.Token
	sinkStr   string
	sinkOrd   streams.Ordering
)

func BenchmarkParseToken(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		tk, err := streams.ParseToken(benchA)
		if err != nil {
			b.Fatal(err)
		}
		sinkToken = tk
	}
}

func BenchmarkTokenString(b *testing.B) {
	tk := mustParse(b, benchA)
	b.ReportAllocs()
	for b.Loop() {
		sinkStr = tk.String()
	}
}

func BenchmarkMerge(b *testing.B) {
	x, y := mustParse(b, benchA), mustParse(b, benchB)
	b.Run("concurrent", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkToken = streams.Merge(x, y)
		}
	})
	// The common case: merging an older token into a newer one.
	newer := streams.Merge(x, y)
	b.Run("dominated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkToken = streams.Merge(newer, x)
		}
	})
}

func BenchmarkCompare(b *testing.B) {
	x, y := mustParse(b, benchA), mustParse(b, benchB)
	b.ReportAllocs()
	for b.Loop() {
		sinkOrd = x.Compare(y)
	}
}
