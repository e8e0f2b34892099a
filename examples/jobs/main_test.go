package main_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/wefttest"
)

// The example run as its users run it: the binary, real processes, kill -9.

type rig struct {
	t    *testing.T
	bin  string
	env  []string
	pool *pgxpool.Pool
}

func newRig(t *testing.T, perJob time.Duration) *rig {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "jobs")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The example's own table, made before it starts: without a primary
	// key, so a job done twice shows, and slow, so kills land inside batches.
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE TABLE done (job int, pos bigint, at bigserial);
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%f); RETURN NEW; END $$;
		CREATE TRIGGER slow BEFORE INSERT ON done FOR EACH ROW EXECUTE FUNCTION slow();`, perJob.Seconds())); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "DATABASE_URL="+db, "REDIS_URL="+rds, "WEFT_SECRET=jobs-example-secret")
	return &rig{t: t, bin: bin, env: env, pool: pool}
}

func (r *rig) start(args ...string) *exec.Cmd {
	r.t.Helper()
	cmd := exec.Command(r.bin, args...)
	cmd.Env = r.env
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

func (r *rig) count() int {
	var n int
	_ = r.pool.QueryRow(context.Background(), `SELECT count(*) FROM done`).Scan(&n)
	return n
}

// check waits until every job is done and checks each was done once, in
// the order of the jobs' positions.
func (r *rig) check(jobs int) {
	r.t.Helper()
	wefttest.Eventually(r.t, 2*time.Minute, func() bool { return r.count() >= jobs }, "%d of %d jobs done", r.count(), jobs)
	rows, err := r.pool.Query(context.Background(), `SELECT job, pos FROM done ORDER BY at`)
	if err != nil {
		r.t.Fatal(err)
	}
	type done struct{ Job, Pos int64 }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[done])
	if err != nil {
		r.t.Fatal(err)
	}
	if len(got) != jobs {
		r.t.Fatalf("%d effects for %d jobs: some done twice", len(got), jobs)
	}
	for i, d := range got {
		if d.Job != int64(i) || (i > 0 && d.Pos <= got[i-1].Pos) {
			r.t.Fatalf("effect %d is job %d at %d (after %v): not each job once, in order", i, d.Job, d.Pos, got[max(i-1, 0)])
		}
	}
}

// Issue 32's acceptance: 2,000 jobs, two runners, one killed -9 and
// restarted mid-run: each job's effect exactly once, in order.
func TestJobs(t *testing.T) {
	r := newRig(t, time.Millisecond)
	writer := r.start("-write", "2000", "-name", "writer")
	r.start("-name", "r1")
	r1 := r.start("-name", "r2")
	wefttest.Eventually(t, time.Minute, func() bool { return r.count() >= 300 }, "runners did %d jobs", r.count())
	if err := r1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = r1.Wait()
	r.start("-name", "r2")
	if err := writer.Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	r.check(2000)
}

// A runner started after the writer has exited (and sealed its name) still
// runs every job.
func TestJobsAfterWriterExited(t *testing.T) {
	r := newRig(t, 0)
	if err := r.start("-write", "200", "-name", "writer").Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	r.start("-name", "late")
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
	if err := r.start("-write", fmt.Sprint(jobs), "-name", "writer").Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	rng := rand.New(rand.NewPCG(32, 32))
	inBatch := 0
	for i := range kills {
		runner := r.start("-name", "killed")
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
	r.start("-name", "survivor")
	r.check(jobs)
}

// batchOpen reports whether a transaction that inserts effects is open.
func (r *rig) batchOpen() bool {
	var n int
	_ = r.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL AND query LIKE '%INSERT INTO done%'`).Scan(&n)
	return n > 0
}
