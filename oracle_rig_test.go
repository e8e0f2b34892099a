package weft_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// The consumer oracle's rig: every row written carries its key, a serial
// number and its index within its position; every consumer and group
// records each row it applies, in its batch's transaction, into
// oracle_applied (no constraint: a second apply is recorded, not
// refused); the stream's table is the truth they are checked against.

// oracleRow is a row's data.
type oracleRow struct {
	K string `json:"k"`
	N int    `json:"n"`
	I int    `json:"i"` // its index among the table rows of its position
}

const oracleDDL = `
CREATE TABLE oracle_applied (consumer text NOT NULL, stream text NOT NULL, pos bigint NOT NULL, idx int NOT NULL,
	k text NOT NULL, n int NOT NULL, member text NOT NULL, seq bigserial);
CREATE SEQUENCE multi_seq;
CREATE TABLE multi (id bigint NOT NULL, writer text NOT NULL, data jsonb NOT NULL);
CREATE INDEX ON multi (writer, id);`

// multiStream is a table of one's own holding several table rows at each
// position (Node.Write writes them; the catch-up source groups them).
var multiStream = weft.Stream{Name: "multi"}

// oracleApply records each row of a batch as applied by consumer on
// member; slow, if set, says how long this batch keeps its transaction
// busy on the server first (a handler slower than the lease).
func oracleApply(consumer, member string, slow func() time.Duration) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		if slow != nil {
			if d := slow(); d > 0 {
				if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, d.Seconds()); err != nil {
					return err
				}
			}
		}
		for _, r := range rows {
			var o oracleRow
			if err := json.Unmarshal(r.Data, &o); err != nil {
				return fmt.Errorf("row %d: %w", r.Pos, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO oracle_applied (consumer, stream, pos, idx, k, n, member) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
				consumer, r.Stream, r.Pos, o.I, o.K, o.N, member); err != nil {
				return err
			}
		}
		return nil
	}
}

// writeMulti writes rows (each a table row) at one position of the multi
// stream through the writer's own statement.
func writeMulti(ctx context.Context, w *weft.Node, rows []oracleRow) error {
	texts := make([]string, len(rows))
	for i, r := range rows {
		b, _ := json.Marshal(r)
		texts[i] = string(b)
	}
	_, err := w.Write(ctx, "multi", 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO multi (id, writer, data) SELECT $1, $2, d::jsonb FROM unnest($3::text[]) AS d`, ids[0], "writer", texts); err != nil {
			return nil, err
		}
		arr, _ := json.Marshal(rows)
		return []json.RawMessage{arr}, nil
	})
	return err
}

// appliedKey identifies one table row: its position and index.
type appliedKey struct {
	pos int64
	idx int
}

// oracleVerdict is what the oracle found for one consumer of one stream.
type oracleVerdict struct {
	consumer, stream     string
	rows, missing, twice int
	outOfOrder           []string
	missingAt, twiceAt   []appliedKey
	appliedByMember      map[string]int
}

func (v oracleVerdict) ok() bool { return v.missing == 0 && v.twice == 0 && len(v.outOfOrder) == 0 }

func (v oracleVerdict) String() string {
	return fmt.Sprintf("%s of %s: %d rows, %d missing %v, %d applied twice %v, %d out of order %v, by member %v",
		v.consumer, v.stream, v.rows, v.missing, first(v.missingAt), v.twice, first(v.twiceAt), len(v.outOfOrder), first(v.outOfOrder), v.appliedByMember)
}

func first[T any](s []T) []T { return s[:min(len(s), 5)] }

// tableRows reads the truth: every table row of stream's table (pos, idx).
func tableRows(ctx context.Context, pool *pgxpool.Pool, table string) (map[appliedKey]string, error) {
	rows, err := pool.Query(ctx, `SELECT id, (data->>'i')::int, data->>'k' FROM `+pgx.Identifier{table}.Sanitize())
	if err != nil {
		return nil, err
	}
	out := map[appliedKey]string{}
	var k appliedKey
	var key string
	_, err = pgx.ForEachRow(rows, []any{&k.pos, &k.idx, &key}, func() error {
		out[k] = key
		return nil
	})
	return out, err
}

// appliedCount is how many distinct table rows consumer applied of stream.
func appliedCount(ctx context.Context, pool *pgxpool.Pool, consumer, stream string) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(DISTINCT (pos, idx)) FROM oracle_applied WHERE consumer = $1 AND stream = $2`, consumer, stream).Scan(&n)
	return n
}

// judge checks consumer's applied effects on stream against the table:
// every row once, each key's rows in (position, index) order.
func judge(ctx context.Context, pool *pgxpool.Pool, consumer, stream, table string) (oracleVerdict, error) {
	v := oracleVerdict{consumer: consumer, stream: stream, appliedByMember: map[string]int{}}
	truth, err := tableRows(ctx, pool, table)
	if err != nil {
		return v, err
	}
	v.rows = len(truth)
	rows, err := pool.Query(ctx, `SELECT pos, idx, k, member FROM oracle_applied WHERE consumer = $1 AND stream = $2 ORDER BY seq`, consumer, stream)
	if err != nil {
		return v, err
	}
	seen := map[appliedKey]int{}
	last := map[string]appliedKey{}
	var a appliedKey
	var key, member string
	_, err = pgx.ForEachRow(rows, []any{&a.pos, &a.idx, &key, &member}, func() error {
		seen[a]++
		v.appliedByMember[member]++
		if seen[a] == 2 {
			v.twice++
			v.twiceAt = append(v.twiceAt, a)
		}
		if l, ok := last[key]; ok && (a.pos < l.pos || a.pos == l.pos && a.idx <= l.idx) {
			v.outOfOrder = append(v.outOfOrder, fmt.Sprintf("key %s: %v after %v", key, a, l))
		}
		last[key] = a
		return nil
	})
	if err != nil {
		return v, err
	}
	for k := range truth {
		if seen[k] == 0 {
			v.missing++
			v.missingAt = append(v.missingAt, k)
		}
	}
	sort.Slice(v.missingAt, func(i, j int) bool { return v.missingAt[i].pos < v.missingAt[j].pos })
	return v, nil
}

// owned is the partitions of group name that member owns now.
func owned(ctx context.Context, pool *pgxpool.Pool, name, member string) []int {
	rows, err := pool.Query(ctx, `SELECT partition FROM weft_group_partitions WHERE name = $1 AND owner = $2 ORDER BY partition`, name, member)
	if err != nil {
		return nil
	}
	ps, _ := pgx.CollectRows(rows, pgx.RowTo[int])
	return ps
}

// cursor is a plain consumer's stored cursor.
func cursor(ctx context.Context, pool *pgxpool.Pool, stream, name string) int64 {
	var pos int64
	_ = pool.QueryRow(ctx, `SELECT pos FROM weft_consumers WHERE stream = $1 AND name = $2`, stream, name).Scan(&pos)
	return pos
}

// freezer is a TCP proxy in front of PostgreSQL that can freeze: stop
// moving bytes both ways and close nothing, as a process stopped
// (SIGSTOP) or a black-holed network looks to the server. Its upstream
// sockets have small buffers, so that a frozen client's answer soon
// fills them and the server's backend blocks writing it (ClientWrite).
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	// armed > 0: freeze once a server's answer runs past armed bytes with
	// nothing from the client meanwhile (a batch's rows mid-answer).
	armed atomic.Int64
	thaw  chan struct{}
	mu    sync.Mutex
	conns []net.Conn
	wide  bool // thawed: upstream buffers no longer small
	wg    sync.WaitGroup
}

func startFreezer(t *testing.T, db string) (*freezer, string) {
	t.Helper()
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: u.Host, thaw: make(chan struct{})}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	u.Host = ln.Addr().String()
	return f, u.String()
}

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		d := net.Dialer{}
		up, err := d.Dial("tcp", f.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if tc, ok := up.(*net.TCPConn); ok {
			// Small, so that the server soon waits on a frozen client;
			// unfreeze widens it again.
			_ = tc.SetReadBuffer(4096)
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, up)
		if tc, ok := up.(*net.TCPConn); ok && f.wide {
			_ = tc.SetReadBuffer(4 << 20)
		}
		f.mu.Unlock()
		answer := new(atomic.Int64) // server bytes since this client last sent any
		f.wg.Go(func() { f.pipe(up, c, answer, false) })
		f.wg.Go(func() { f.pipe(c, up, answer, true) })
	}
}

// pipe copies src to dst in small pieces, waiting while frozen;
// fromServer says which way.
func (f *freezer) pipe(dst, src net.Conn, answer *atomic.Int64, fromServer bool) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		f.wait()
		n, err := src.Read(buf)
		if n > 0 {
			if !fromServer {
				answer.Store(0)
			} else if a := f.armed.Load(); a > 0 && answer.Add(int64(n)) > a && f.armed.CompareAndSwap(a, 0) {
				f.freeze()
			}
			f.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

func (f *freezer) wait() {
	for f.frozen.Load() {
		f.mu.Lock()
		ch := f.thaw
		f.mu.Unlock()
		<-ch
	}
}

// freeze stops every connection's bytes, both ways, from now on.
func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen.CompareAndSwap(false, true) {
		f.thaw = make(chan struct{})
	}
}

// freezeMidAnswer arms a freeze at the first server answer longer than
// n bytes.
func (f *freezer) freezeMidAnswer(n int64) { f.armed.Store(n) }

// unfreeze lets them move again, at full speed: with the small buffers
// that make the server wait on a frozen client, a delayed ACK per 4 KiB
// held a thawed process's reads to about 100 KB/s, so that its batches
// of 2 KiB rows took seconds each and it looked stalled (a member that
// took its partitions back after the thaw kept them behind for over a
// minute).
func (f *freezer) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed.Store(0)
	for _, c := range f.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 20)
		}
	}
	f.wide = true
	if f.frozen.CompareAndSwap(true, false) {
		close(f.thaw)
	}
}

func (f *freezer) close() {
	f.unfreeze()
	_ = f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// oracleNode opens a process named name on db (a direct or proxied URL)
// that knows streams and runs consumers.
func oracleNode(t *testing.T, name, db, rds string, ttl time.Duration, streams []weft.Stream, consumers ...weft.Consumer) *weft.Node {
	t.Helper()
	cfg := wefttest.Config(name, db, rds)
	cfg.Streams = streams
	cfg.LeaseTTL = ttl
	cfg.Consumers = consumers
	// The cut-off and frozen ones WARN at every try: kept, and shown
	// only when the test fails (what each process saw, to read a red run).
	cfg.Logger = slog.New(lastWarnings(t, name))
	return wefttest.Open(t, cfg)
}

// warnRing keeps a process's last WARN and ERROR lines for the test's
// failure report.
type warnRing struct {
	name  string
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

// lastWarnings is a slog.Handler that keeps name's last 100 warnings
// and logs them when t fails.
func lastWarnings(t *testing.T, name string) slog.Handler {
	h := warnRing{name: name, mu: &sync.Mutex{}, lines: &[]string{}}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, l := range *h.lines {
			t.Log(l)
		}
	})
	return h
}

func (h warnRing) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnRing) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s: %s", r.Time.Format("15:04:05.000"), h.name, r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	if *h.lines = append(*h.lines, b.String()); len(*h.lines) > 100 {
		*h.lines = (*h.lines)[1:]
	}
	return nil
}

func (h warnRing) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(slices.Clone(h.attrs), as...)
	return h
}

func (h warnRing) WithGroup(string) slog.Handler { return h }
