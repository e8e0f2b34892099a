// Package exampletest runs an example under examples/ as its users run
// it, for the example's own tests: its binary, built from the package
// directory, started as real processes against the test's own database
// and Redis, with the example's effects in a table the test reads.
package exampletest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// Rig is one built example and the servers its processes share.
type Rig struct {
	T    *testing.T
	Bin  string
	Env  []string // the processes' environment
	Pool *pgxpool.Pool
}

// New builds the example in the current directory as the binary name
// (or takes $WEFT_TEST_BIN/name, testenv.BinEnv),
// gives it a database and a redis-server of its own (DATABASE_URL, REDIS_URL,
// and WEFT_SECRET in Env) and creates its effects table with columns,
// before any process starts: with no primary key, so an effect made twice
// shows, and with every insert slowed by perRow, so that kills and
// signals land inside batches.
func New(t *testing.T, name, table, columns string, perRow time.Duration) *Rig {
	t.Helper()
	return NewOn(t, wefttest.Redis(t), name, table, columns, perRow)
}

// NewOn is New with the processes' Redis at redisURL: a
// wefttest.MemoryRedis for an example whose processes are killed but
// never stopped (SIGSTOP), as a subscriber that stops reading stalls every
// client of it.
func NewOn(t *testing.T, redisURL, name, table, columns string, perRow time.Duration) *Rig {
	t.Helper()
	bin, err := testenv.Prebuilt(name) // make test builds the examples once
	if err != nil {
		t.Fatal(err)
	}
	if bin == "" {
		bin = filepath.Join(t.TempDir(), name)
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
	}
	db := wefttest.Database(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE TABLE %[1]s (%[2]s);
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%[3]f); RETURN NEW; END $$;
		CREATE TRIGGER slow BEFORE INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION slow();`, table, columns, perRow.Seconds())); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "DATABASE_URL="+db, "REDIS_URL="+redisURL, "WEFT_SECRET="+name+"-example-secret")
	return &Rig{T: t, Bin: bin, Env: env, Pool: pool}
}

// Start starts the example with args; it is killed when the test ends
// unless it has been waited for. Its stderr is shown under go test -v,
// and the last 32 KiB of it when the test fails: a process that exited
// badly says why in the failing run itself.
func (r *Rig) Start(args ...string) *exec.Cmd {
	r.T.Helper()
	cmd := exec.Command(r.Bin, args...)
	cmd.Env = r.Env
	tail := &tailBuffer{max: 32 << 10}
	cmd.Stderr = tail
	if testing.Verbose() {
		cmd.Stderr = io.MultiWriter(os.Stderr, tail)
	}
	if err := cmd.Start(); err != nil {
		r.T.Fatal(err)
	}
	r.T.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if r.T.Failed() && !testing.Verbose() {
			r.T.Logf("stderr of %s %s (%v), its end:\n%s", r.Bin, strings.Join(args, " "), cmd.ProcessState, tail.String())
		}
	})
	return cmd
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
