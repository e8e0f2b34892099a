package wefttest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// A test whose subject is not Redis runs its nodes on an in-process
// Redis: no redis-server to install or start, and nothing left running
// once the test ends.
func ExampleMemoryRedis() {
	inTest(func(t testing.TB) { // in a test: func TestGreetings(t *testing.T)
		rds := wefttest.MemoryRedis(t)
		cfg := wefttest.Config("greeter", databaseURL, rds) // in a test: wefttest.Database(t)
		rec := wefttest.NewRecorder()
		cfg.Streams, cfg.Writes = []weft.Stream{{Name: "greetings"}}, []string{"greetings"}
		cfg.Followers = []weft.Follower{{Stream: "greetings", Handler: rec}}
		node := wefttest.Open(t, cfg)

		if _, err := node.Append(context.Background(), "greetings", "hello", "world"); err != nil {
			t.Fatalf("append: %v", err)
		}
		wefttest.Eventually(t, 30*time.Second, func() bool { return len(rec.Rows()) == 2 }, "%d rows followed", len(rec.Rows()))
		for _, r := range rec.Rows() {
			fmt.Printf("%s wrote %s\n", r.Writer, r.Data)
		}
	})
	// Output:
	// greeter wrote "hello"
	// greeter wrote "world"
}

// exampleT stands in for a test's t in an example, which has none: its
// cleanups run when inTest returns, and a failure panics. A method not
// below panics too (the embedded TB is nil): the examples use no other.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (t *exampleT) Helper()          {}
func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Log(args ...any)  { fmt.Fprintln(os.Stderr, args...) }
func (t *exampleT) Errorf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (t *exampleT) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// inTest runs f as a test would, then its cleanups, last first.
func inTest(f func(t testing.TB)) {
	t := &exampleT{}
	defer func() {
		for i := len(t.cleanups) - 1; i >= 0; i-- {
			t.cleanups[i]()
		}
	}()
	f(t)
}
