package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestWireRows(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{`[1]`, `[1]`, true},
		{`[{"a": 1, "s": "x y"}]`, `[{"a": 1, "s": "x y"}]`, true}, // spaces on one line travel as they are
		{"[{\"a\":1}]\n", `[{"a":1}]`, true},                       // json.Encoder
		{"[\n  {\n    \"a\": 1\n  }\n]", `[{"a":1}]`, true},        // MarshalIndent
		{"\r\n [1,\r\n2] \t", `[1,2]`, true},
		{` [1] `, `[1]`, true},
		{`["a\nb"]`, `["a\nb"]`, true}, // an escaped newline is not a line break
		{``, ``, false},
		{`[]`, ``, false},
		{"[ \n ]", ``, false},
		{`{"a":1}`, ``, false},
		{`[1,]`, ``, false},
		{"[1,\n]", ``, false},
		{"[\"a\nb\"]", ``, false}, // a raw newline inside a string is not JSON
	} {
		got, ok := wireRows(json.RawMessage(c.in))
		if ok != c.ok || string(got) != c.want {
			t.Errorf("wireRows(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	in := json.RawMessage(`[{"a":1}]`)
	if got, _ := wireRows(in); &got[0] != &in[0] {
		t.Error("rows already on one line were copied")
	}
	if n := testenv.AllocsPerRun(100, func() { wireRows(in) }); n != 0 {
		t.Errorf("rows already on one line: %v allocations, want 0", n)
	}
}

// wireRig is a writer of the events stream and of an Ephemeral "typing",
// on a database and a Redis of its own, and a raw subscriber to both
// streams' channels, subscribed before anything is written.
type wireRig struct {
	pool     *pgxpool.Pool
	redisURL string
	w        *member
	typing   *Ephemeral
	ps       *redis.PubSub
}

func newWireRig(t *testing.T, deferRun bool) wireRig {
	t.Helper()
	pool := testDB(t)
	redisURL := testenv.StartRedis(t).URL()
	typing := NewEphemeral("typing")
	w := startMember(t, pool, redisURL, "persister1", clusterOpts{deferRun: deferRun, tune: func(c *Config) {
		c.Ephemerals = []*Ephemeral{typing}
		c.Streams = append(c.Streams, core.StreamSpec{Name: "typing", Ephemeral: true})
	}})
	opts, _ := redis.ParseURL(redisURL)
	rc := redis.NewClient(opts)
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	ps := rc.Subscribe(ctx, StreamChannel("test", "typing"), StreamChannel("test", "events"))
	t.Cleanup(func() { ps.Close() })
	for range 2 {
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return wireRig{pool: pool, redisURL: redisURL, w: w, typing: typing, ps: ps}
}

// rows reads RDATA lines off the wire until each stream has want[stream]
// of them, and returns their rows by stream, in order.
func (r wireRig) rows(t *testing.T, want map[string]int) map[string][]string {
	t.Helper()
	seen := map[string][]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for stream := range want {
		for len(seen[stream]) < want[stream] {
			msg, err := r.ps.ReceiveMessage(ctx)
			if err != nil {
				t.Fatalf("RDATA lines seen %v, want %v: %v", seen, want, err)
			}
			for line := range strings.SplitSeq(msg.Payload, "\n") { // a frame
				if f := strings.Fields(line); len(f) >= 6 && f[0] == "RDATA" {
					seen[f[1]] = append(seen[f[1]], f[5])
				}
			}
		}
	}
	return seen
}

// TestRowsInAnyLayoutGoLive: rows as encoding/json lays them out (the
// Encoder's trailing newline, MarshalIndent's lines, spaces around) are
// accepted by every way in, so they must go out live, on one line. They
// used to be accepted and then dropped at publish ("cannot encode
// command"), and every reader fetched them through a gap.
func TestRowsInAnyLayoutGoLive(t *testing.T) {
	var fetches atomic.Int64
	rig := newWireRig(t, false)
	pool, w, typing := rig.pool, rig.w, rig.typing
	reader := startMember(t, pool, rig.redisURL, "reader", clusterOpts{fetcher: &dbFetcher{pool: pool, gate: func(context.Context) error {
		fetches.Add(1)
		return nil
	}}})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w.node.Ready() }, "not ready")
	ctx := context.Background()

	var enc bytes.Buffer
	if err := json.NewEncoder(&enc).Encode([]map[string]int{{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	indented, err := json.MarshalIndent([]map[string]int{{"n": 2}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	layouts := []json.RawMessage{enc.Bytes(), indented, json.RawMessage(" [{\"n\":3}] \r\n")}
	want := []string{`[{"n":1}]`, `[{"n":2}]`, `[{"n":3}]`}

	for i, rows := range layouts {
		if _, err := typing.Put(ctx, want[i], rows); err != nil {
			t.Fatalf("Put %q: %v", rows, err)
		}
	}
	if _, err := w.w.Write(ctx, len(layouts), func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		for i, id := range ids {
			if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3)`, id, w.gen.Self(), string(layouts[i])); err != nil {
				return nil, err
			}
		}
		return slices.Clone(layouts), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, rows := range layouts {
		if _, err := w.w.Insert(ctx, []json.RawMessage{rows},
			`INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1`, w.gen.Self(), string(rows)); err != nil {
			t.Fatal(err)
		}
	}

	// Every change is one RDATA line with the rows on it, compact.
	seen := rig.rows(t, map[string]int{"typing": len(layouts), "events": 2 * len(layouts)})
	if got := seen["typing"]; !slices.Equal(got, want) {
		t.Errorf("typing rows on the wire %q, want %q", got, want)
	}
	if got, w2 := seen["events"], append(slices.Clone(want), want...); !slices.Equal(got, w2) {
		t.Errorf("events rows on the wire %q, want %q", got, w2)
	}

	converged(t, pool, reader, "persister1")
	var bodies []string
	for _, b := range reader.rec.Bodies(eventsKey("persister1")) {
		bodies = append(bodies, string(b))
	}
	if w2 := append(slices.Clone(want), want...); !slices.Equal(bodies, w2) {
		t.Errorf("reader applied %q, want %q (live, as written)", bodies, w2)
	}
	if n := fetches.Load(); n != 0 {
		t.Errorf("reader fetched %d times: a row did not go out live", n)
	}
}

// TestRowsAreNotRetained: a caller may reuse its buffer once Put, Write or
// Insert has returned (as io.Writer's callers do); the line that goes out
// later carries the rows as they were at the call.
func TestRowsAreNotRetained(t *testing.T) {
	rig := newWireRig(t, false)
	w, typing := rig.w, rig.typing
	testenv.Eventually(t, 10*time.Second, func() bool { return w.node.Ready() }, "not ready")
	ctx := context.Background()

	const n = 200
	buf := make([]byte, 0, 64)
	fill := func(i int) json.RawMessage {
		buf = fmt.Appendf(buf[:0], `[{"n":"%04d"}]`, i)
		return buf
	}
	scribble := func() { copy(buf, `[{"n":"xxxx"}]`) } // the same length, valid JSON
	for i := range n {
		if _, err := typing.Put(ctx, "k", fill(i)); err != nil {
			t.Fatal(err)
		}
		scribble()
		if _, err := w.w.Insert(ctx, []json.RawMessage{fill(i)},
			`INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1`, w.gen.Self(), fmt.Sprintf(`[{"n":"%04d"}]`, i)); err != nil {
			t.Fatal(err)
		}
		scribble()
		if _, err := w.w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3)`, ids[0], w.gen.Self(), fmt.Sprintf(`[{"n":"%04d"}]`, i))
			return []json.RawMessage{fill(i)}, err
		}); err != nil {
			t.Fatal(err)
		}
		scribble()
	}
	seen := rig.rows(t, map[string]int{"typing": n, "events": 2 * n})
	for i := range n {
		want := fmt.Sprintf(`[{"n":"%04d"}]`, i)
		if got := seen["typing"][i]; got != want {
			t.Fatalf("typing change %d went out as %s, want %s", i, got, want)
		}
		for j := range 2 {
			if got := seen["events"][2*i+j]; got != want {
				t.Fatalf("events row %d went out as %s, want %s", 2*i+j, got, want)
			}
		}
	}
}
