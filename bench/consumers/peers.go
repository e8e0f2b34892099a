package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// job is one row as every peer carries it: S is its sequence number
// (producer*producerSpan + i, so order is checked per producer), K its
// key (i % keys: a group's partitioning), T the Unix ns its producer
// sent it at.
type job struct {
	S int64 `json:"s"`
	K int   `json:"k"`
	T int64 `json:"t"`
}

const (
	producerSpan = 1_000_000_000
	keys         = 64
)

// env is where a scenario's servers are: a database of its own, the
// shared Redis (weft's channels named apart per scenario) and the
// nats-server (a stream created per scenario).
type env struct {
	DB      string // the scenario's database URL
	Redis   string
	NATS    string
	Cluster string // weft's Cluster: one per scenario
}

// peer is one contender: how its schema or stream is made, how its
// producers send, and how members consumers apply the rows.
type peer interface {
	Name() string
	// Promise says what it promises: exactly once (effects in the
	// transaction that acknowledges the row) and in what order.
	Promise(members int) promise
	Setup(ctx context.Context, e env) error
	Producer(ctx context.Context, e env, id int) (producer, error)
	// Consume starts members consumers; stop stops them and waits.
	Consume(ctx context.Context, e env, c consumeOpts) (stop func() error, err error)
}

type producer interface {
	Send(ctx context.Context, jobs []job) error
	Close() error
}

type consumeOpts struct {
	Members int
	Notify  bool          // pg_notify the append times at commit (the latency scenario)
	Applied *atomic.Int64 // counts rows handed to the effect (a wake-up for the waiter; the table decides)
}

type promise struct {
	ExactlyOnce bool
	Order       string // "total" (per producer), "key" (per producer and key), "none"
}

func peerByName(name string) (peer, error) {
	switch name {
	case "weft":
		return weftPeer{}, nil
	case "river":
		return riverPeer{}, nil
	case "jetstream":
		return natsPeer{}, nil
	case "raw":
		return rawPeer{}, nil
	}
	return nil, fmt.Errorf("no peer %q", name)
}

const effectsSchema = `CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, seq bigint NOT NULL, k int NOT NULL, t bigint NOT NULL)`

// applyEffects is the effect every peer applies: one INSERT row per job,
// in tx; with notify, the jobs' append times go to the run's listener
// when tx commits (NOTIFY is delivered at commit), which times append ->
// effect committed alike for every peer.
func applyEffects(ctx context.Context, tx pgx.Tx, jobs []job, notify bool) error {
	seq, k, t := make([]int64, len(jobs)), make([]int32, len(jobs)), make([]int64, len(jobs))
	for i, j := range jobs {
		seq[i], k[i], t[i] = j.S, int32(j.K), j.T
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (seq, k, t) SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[])`, seq, k, t); err != nil {
		return fmt.Errorf("effects: %w", err)
	}
	if !notify {
		return nil
	}
	// A NOTIFY payload is under 8,000 bytes: batches of at most 100 rows
	// of about 20 digits each fit.
	var b strings.Builder
	for i, j := range jobs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(j.T, 10))
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify('fx', $1)`, b.String()); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

func decodeJob(b []byte) (job, error) {
	var j job
	err := json.Unmarshal(b, &j)
	return j, err
}

type pgxTx = pgx.Tx
