package streams_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/streams"
)

// TestMain doubles as the writer process of TestTwoWritersTwoProcesses and
// of the lease tests (seal_test.go).
func TestMain(m *testing.M) {
	if instance := os.Getenv("WEFT_LEASE_CHILD"); instance != "" {
		os.Exit(leaseChildRun(instance, os.Getenv("WEFT_STREAMS_DB"), os.Getenv("WEFT_LEASE_TTL")))
	}
	if name := os.Getenv("WEFT_STREAMS_CHILD"); name != "" {
		n, err := childWriter(name, os.Getenv("WEFT_STREAMS_DB"), os.Getenv("WEFT_STREAMS_N"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		fmt.Println("committed", n)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// childWriter allocates IDs as writer name, committing a random three in
// four of them as rows, and records every ID it was handed (committed or
// not) in allocated, whose primary key catches any duplicate.
func childWriter(name, url, count string) (int, error) {
	ctx := context.Background()
	total, err := strconv.Atoi(count)
	if err != nil {
		return 0, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	g, err := streams.Open(ctx, pool, eventsCfg, name)
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(uint64(len(name)), uint64(os.Getpid())))
	committed := 0
	for i := 0; i < total; {
		n := min(1+rng.IntN(3), total-i)
		i += n
		commit := rng.IntN(4) != 0
		err := g.InTx(ctx, n, func(tx pgx.Tx, ids []int64) error {
			if _, err := pool.Exec(ctx, `INSERT INTO allocated SELECT unnest($1::bigint[]), $2`, ids, name); err != nil {
				return fmt.Errorf("record allocation %v: %w", ids, err)
			}
			for _, id := range ids {
				if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, $2)`, id, name); err != nil {
					return err
				}
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		switch {
		case err == nil:
			committed += n
		case !errors.Is(err, errRollback):
			return committed, err
		}
	}
	if err := g.SavePosition(ctx); err != nil {
		return committed, err
	}
	return committed, nil
}

func TestTwoWritersTwoProcesses(t *testing.T) {
	pool, url := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE allocated (id bigint PRIMARY KEY, writer text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const perWriter = 5000
	type result struct {
		out string
		err error
	}
	results := make(chan result, 2)
	for _, name := range []string{"persister1", "persister2"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "WEFT_STREAMS_CHILD="+name, "WEFT_STREAMS_DB="+url, "WEFT_STREAMS_N="+strconv.Itoa(perWriter))
		go func() {
			out, err := cmd.CombinedOutput()
			results <- result{string(out), err}
		}()
	}
	committed := 0
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("writer process: %v\n%s", r.err, r.out)
		}
		var n int
		if _, err := fmt.Sscanf(r.out[strings.Index(r.out, "committed"):], "committed %d", &n); err != nil {
			t.Fatalf("writer output %q: %v", r.out, err)
		}
		committed += n
	}
	var allocated, rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM allocated), (SELECT count(*) FROM events), (SELECT count(DISTINCT stream_id) FROM events)`).Scan(&allocated, &rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if allocated != 2*perWriter {
		t.Fatalf("%d distinct IDs allocated, want %d", allocated, 2*perWriter)
	}
	if rows != committed || distinct != rows {
		t.Fatalf("%d rows (%d distinct), want %d committed", rows, distinct, committed)
	}
	// Both writers stored positions; with both finished, a reader that
	// loads them computes persisted-upto at most the sequence head, and
	// each writer's stored position covers all its own IDs.
	reader := open(t, pool, eventsCfg, "")
	var maxOwn1, maxOwn2 int64
	if err := pool.QueryRow(ctx, `SELECT max(id) FILTER (WHERE writer = 'persister1'), max(id) FILTER (WHERE writer = 'persister2') FROM allocated`).Scan(&maxOwn1, &maxOwn2); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{"persister1": maxOwn1, "persister2": maxOwn2} {
		id, err := reader.WriterID(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := reader.WriterPosition(id); got < want {
			t.Errorf("%s stored position %d below its last ID %d", name, got, want)
		}
	}
	if got := reader.StoredUpto(); got < min(maxOwn1, maxOwn2) || got > 2*perWriter {
		t.Fatalf("persisted-upto %d outside [%d, %d]", got, min(maxOwn1, maxOwn2), 2*perWriter)
	}
}
