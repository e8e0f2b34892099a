package testenv

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartReplica starts a hot-standby streaming replica of primary, a
// cluster from StartPostgres: pg_basebackup -R copies it and writes the
// connection to it, and the copy starts on a free port. delay is
// recovery_min_apply_delay: the replica applies each commit that long
// after the primary made it (0: as soon as it arrives), to make a replica
// visibly behind. It returns once the replica accepts read-only
// connections; every database of primary, present and future, is on it
// under the same name (URL). It is stopped and its dir removed when the
// test ends, before primary.
func StartReplica(t testing.TB, primary *Postgres, delay time.Duration) *Postgres {
	t.Helper()
	dir := tempDir(t, "weft-pg-replica-")
	r := &Postgres{
		bin:  primary.bin,
		dir:  dir,
		data: filepath.Join(dir, "data"),
		log:  filepath.Join(dir, "postgres.log"),
		as:   primary.as,
		extra: []string{
			"-c", "hot_standby=on",
			"-c", "recovery_min_apply_delay=" + strconv.FormatInt(delay.Milliseconds(), 10) + "ms",
		},
	}
	r.server = server{name: "postgres replica", log: r.log, stopSig: os.Interrupt, launch: r.launch}
	t.Cleanup(func() {
		r.Stop()
		os.RemoveAll(dir)
	})
	if r.as != nil {
		if err := os.Chown(dir, r.as.uid, r.as.gid); err != nil {
			t.Fatalf("testenv: chown %s for user postgres: %v", dir, err)
		}
	}
	host, port, _ := strings.Cut(primary.addr(), ":")
	// -c fast: checkpoint at once instead of spreading it; -X stream: the
	// WAL written meanwhile comes along, so the copy is consistent alone.
	err := run(dir, r.log, r.as, filepath.Join(r.bin, "pg_basebackup"),
		"-D", r.data, "-h", host, "-p", port, "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		t.Fatalf("testenv: %v%s", err, logTail(r.log))
	}
	r.start(t)
	t.Logf("testenv: postgres replica of %s at %s (apply delay %v), log %s", primary.addr(), r.URL("postgres"), delay, r.log)
	return r
}

// DatabaseName is the database a postgres:// URL names, to reach the same
// database on a replica (Postgres.URL).
func DatabaseName(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(p.Path, "/")
}
