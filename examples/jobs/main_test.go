package main_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/exampletest"
	"github.com/weft-dev/weft/wefttest"
)

// The example run as its users run it: the binary, real processes, kill -9.

type rig struct{ *exampletest.Rig }

func newRig(t *testing.T, perJob time.Duration) *rig {
	t.Helper()
	// The example's own table: a job done twice shows, and kills land
	// inside batches. Its runners are killed, never stopped, and Redis
	// stays up: an in-process one serves.
	return &rig{exampletest.NewOn(t, wefttest.MemoryRedis(t), "jobs", "done", "job int, pos bigint, at bigserial", perJob)}
}

func (r *rig) count() int {
	var n int
	_ = r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM done`).Scan(&n)
	return n
}

// check waits until every job is done and checks each was done once, in
// the order of the jobs' positions.
func (r *rig) check(jobs int) {
	r.T.Helper()
	wefttest.Eventually(r.T, 2*time.Minute, func() bool { return r.count() >= jobs }, "%d of %d jobs done", r.count(), jobs)
	rows, err := r.Pool.Query(context.Background(), `SELECT job, pos FROM done ORDER BY at`)
	if err != nil {
		r.T.Fatal(err)
	}
	type done struct{ Job, Pos int64 }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[done])
	if err != nil {
		r.T.Fatal(err)
	}
	if len(got) != jobs {
		r.T.Fatalf("%d effects for %d jobs: some done twice", len(got), jobs)
	}
	for i, d := range got {
		if d.Job != int64(i) || (i > 0 && d.Pos <= got[i-1].Pos) {
			r.T.Fatalf("effect %d is job %d at %d (after %v): not each job once, in order", i, d.Job, d.Pos, got[max(i-1, 0)])
		}
	}
}

// Issue 32's acceptance: 2,000 jobs, two runners, one killed -9 and
// restarted mid-run: each job's effect exactly once, in order.
func TestJobs(t *testing.T) {
	r := newRig(t, time.Millisecond)
	writer := r.Start("-write", "2000", "-name", "writer")
	r.Start("-name", "r1")
	r1 := r.Start("-name", "r2")
	wefttest.Eventually(t, time.Minute, func() bool { return r.count() >= 300 }, "runners did %d jobs", r.count())
	if err := r1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = r1.Wait()
	r.Start("-name", "r2")
	if err := writer.Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	r.check(2000)
}

// A runner started after the writer has exited (and sealed its name) still
// runs every job.
func TestJobsAfterWriterExited(t *testing.T) {
	r := newRig(t, 0)
	if err := r.Start("-write", "200", "-name", "writer").Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	r.Start("-name", "late")
	r.check(200)
}

// A runner killed -9 during a batch, a hundred times: no job is lost or
// done twice, checked against the table.
func TestJobsKilledInBatches(t *testing.T) {
	kills := 100
	if testing.Short() {
		kills = 10
	}
	const jobs = 3000
	r := newRig(t, 2*time.Millisecond)
	if err := r.Start("-write", fmt.Sprint(jobs), "-name", "writer").Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	rng := rand.New(rand.NewPCG(32, 32))
	inBatch := 0
	for i := range kills {
		runner := r.Start("-name", "killed")
		// Until its first batch is under way: it holds a transaction open
		// in which it inserts effects.
		wefttest.Eventually(t, 30*time.Second, func() bool { return r.batchOpen() || r.count() >= jobs }, "kill %d: no batch began", i)
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // somewhere inside it: a random point, not a synchronisation
		if r.batchOpen() {
			inBatch++
		}
		if err := runner.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = runner.Wait()
		if r.count() >= jobs {
			break
		}
	}
	t.Logf("%d kills landed inside a batch", inBatch)
	if inBatch < kills/2 {
		t.Fatalf("only %d of %d kills landed inside a batch", inBatch, kills)
	}
	r.Start("-name", "survivor")
	r.check(jobs)
}

// batchOpen reports whether a transaction that inserts effects is open.
func (r *rig) batchOpen() bool {
	var n int
	_ = r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL AND query LIKE '%INSERT INTO done%'`).Scan(&n)
	return n > 0
}
