package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// pgStartTimeout bounds a start, including crash recovery after Kill.
	pgStartTimeout = 60 * time.Second
	// pgRelaunchDelay spaces attempts to start while the killed postmaster's
	// children still hold its shared memory.
	pgRelaunchDelay = 20 * time.Millisecond
)

// Postgres is a private PostgreSQL cluster in a temp dir, for tests that kill
// and restart the database. It listens on 127.0.0.1 only, with trust auth
// for user postgres, and fsync off: it survives a process crash, not a
// machine crash. Kill leaves the data dir, so Start recovers it and waits
// until crash recovery has finished; Stop is a fast shutdown (SIGINT:
// disconnect clients, checkpoint).
type Postgres struct {
	server        // the postmaster
	bin    string // directory holding initdb and postgres
	dir    string // temp dir: socket dir, log and data dir parent
	data   string
	log    string
	as     *runAs // nil unless the tests run as root
	// extra are more postgres arguments (a replica's recovery settings).
	extra []string
}

// StartPostgres creates a cluster with initdb (or copies the one
// $WEFT_TEST_PG_TEMPLATE holds, see PGTemplateEnv), starts it on a free
// port and waits until it accepts connections. It is stopped and its dir removed when
// the test ends. Binaries come from the highest /usr/lib/postgresql/*/bin,
// else PATH.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	bin, err := postgresBin()
	if err != nil {
		unavailable(t, "%v", err)
	}
	// PostgreSQL refuses to run as root; then it runs as user postgres.
	as, err := lookupRunAs("postgres")
	if err != nil {
		unavailable(t, "%v", err)
	}
	dir := tempDir(t, "weft-pg-")
	p := &Postgres{
		bin:  bin,
		dir:  dir,
		data: filepath.Join(dir, "data"),
		log:  filepath.Join(dir, "postgres.log"),
		as:   as,
	}
	p.server = server{name: "postgres", log: p.log, stopSig: os.Interrupt, launch: p.launch}
	t.Cleanup(func() {
		p.Stop()
		os.RemoveAll(dir)
	})
	if as != nil {
		// MkdirTemp makes the dir 0700 for us; its parent (/tmp) lets anyone
		// pass through.
		if err := os.Chown(dir, as.uid, as.gid); err != nil {
			t.Fatalf("testenv: chown %s for user postgres: %v", dir, err)
		}
	}
	if err := initdb(dir, p.data, p.log, bin, as); err != nil {
		t.Fatalf("testenv: %v%s", err, logTail(p.log))
	}
	p.start(t)
	t.Logf("testenv: postgres at %s, log %s", p.URL("postgres"), p.log)
	return p
}

// postgresBin finds the directory holding initdb and postgres.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestVersion := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil || v <= bestVersion {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			best, bestVersion = d, v
		}
	}
	if best != "" {
		return best, nil
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("postgres binaries: none in /usr/lib/postgresql/*/bin and %w", err)
	}
	return filepath.Dir(initdb), nil
}

// URL is postgres://postgres@127.0.0.1:port/db?sslmode=disable; the port
// stays the same across restarts.
func (p *Postgres) URL(db string) string {
	return postgresURL(p.addr(), db)
}

func postgresURL(host, db string) string {
	return "postgres://postgres@" + host + "/" + db + "?sslmode=disable"
}

// NewDatabase creates an empty, uniquely named database on this cluster and
// returns its URL. It is not dropped: the whole cluster goes when the test
// ends, and the cluster may well be down by then.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	base := p.URL("postgres")
	conn, err := connect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: connect to private postgres: %v%s", err, logTail(p.log))
	}
	defer conn.Close(ctx)
	name, err := createDatabase(ctx, conn)
	if err != nil {
		t.Fatalf("testenv: private postgres: %v", err)
	}
	return p.URL(name)
}

// launch starts the postmaster on port and waits until it accepts
// connections; it is p.server's launch.
func (p *Postgres) launch(port int) (*process, error) {
	args := []string{
		"-D", p.data,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + p.dir,
		"-c", "fsync=off",
		"-c", "shared_buffers=16MB",
	}
	args = append(args, p.extra...)
	deadline := time.Now().Add(pgStartTimeout)
	for {
		offset := logSize(p.log)
		proc, err := startProcess(p.dir, p.log, p.as, filepath.Join(p.bin, "postgres"), args...)
		if err != nil {
			return nil, err
		}
		err = waitPostgres(proc, postgresURL(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "postgres"), deadline)
		if err == nil {
			return proc, nil
		}
		if !proc.exited() {
			proc.stop(os.Kill)
			return nil, err
		}
		out := logSince(p.log, offset)
		switch {
		case strings.Contains(out, "Address already in use"):
			return nil, errPortInUse
		case strings.Contains(out, "is still in use") && time.Now().Before(deadline):
			// The killed postmaster's backends have not all noticed its
			// death yet and still hold its shared memory.
			time.Sleep(pgRelaunchDelay)
		default:
			return nil, fmt.Errorf("postgres exited: %v", proc.err)
		}
	}
}

// waitPostgres polls until the cluster at u accepts a connection, the
// postmaster exits, or deadline passes.
func waitPostgres(proc *process, u string, deadline time.Time) error {
	return poll(time.Until(deadline), func() error {
		if proc.exited() {
			return &permanent{fmt.Errorf("postgres exited: %v", proc.err)}
		}
		ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
		defer cancel()
		conn, err := connect(ctx, u)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
}
