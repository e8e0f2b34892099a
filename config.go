package weft

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// Config configures a process. It names the process once; zero values
// mean the documented defaults.
type Config struct {
	// Name is the process's name: the writer name it writes its streams
	// under (one process at a time holds it, by a lease), and the prefix
	// of its instance ID. Required: 1-64 of [a-z0-9_-], starting with a
	// letter.
	Name string
	// DatabaseURL is the PostgreSQL URL. Required unless Database is set.
	DatabaseURL string
	// Database is a pool to use instead of DatabaseURL; Close leaves it
	// open.
	//
	// Pool sizing: a consumer's batch holds one connection of the pool
	// for as long as its handler runs (up to 30 s), a group's batch one
	// and its lanes' commits one more; writes and catch-up reads need theirs. The
	// pool Open makes from DatabaseURL has pgxpool's default, max(4,
	// NumCPU), plus one connection per consumer and two per group (and
	// MaxInFlight-1 more for a group whose Apply runs with MaxInFlight:
	// its partitions' transactions), unless the URL sets pool_max_conns;
	// size a pool of your own the same way.
	// The writer name's lease heartbeat and a group member's membership
	// rounds (its lease) never use the pool: each runs on a connection of
	// its own, so handlers that hold every connection delay writes, never
	// a lease.
	Database *pgxpool.Pool
	// DatabaseReadURL is a streaming replica of the database: range reads
	// of the streams' tables (catch-up, consumers' reads) go to it as far as it
	// holds them, the rest to the primary. Empty: the primary serves all.
	DatabaseReadURL string
	// RedisURL is redis:// or rediss://, with credentials if any. Required.
	RedisURL string
	// RedisCluster: RedisURL names the seed nodes of a Redis Cluster.
	RedisCluster bool
	// RedisTLS is the TLS of a rediss:// RedisURL, when the URL alone is
	// not enough: a private CA (RootCAs), a client certificate for a
	// server run with tls-auth-clients. Its ServerName defaults to the
	// URL's host. Only with rediss://. Nil: the system's roots.
	RedisTLS *tls.Config
	// Cluster names the Redis channels; processes that work together share
	// it ["weft"].
	Cluster string
	// Secret is shared by every process of the cluster: it signs every
	// line on Redis and guards the HTTP catch-up endpoint. Required unless
	// Insecure.
	Secret string
	// PreviousSecret is accepted besides Secret (lines signed with it,
	// requests that carry it), never sent: to rotate the secret without a
	// stop, every process first accepts the new one as PreviousSecret,
	// then sends it as Secret and accepts the old one as PreviousSecret,
	// then drops it (three rolling restarts).
	PreviousSecret string
	// Insecure allows an empty Secret: anyone who reaches Redis or the
	// endpoint is trusted. For tests and laptops.
	Insecure bool
	// Listen is the host:port the process serves its HTTP endpoints on
	// (Node.Handler: catch-up for the other processes, /healthz,
	// /readyz, /metrics, /status). Empty serves nothing: mount
	// Node.Handler on a server of your own.
	Listen string
	// Advertise is the base URL the other processes reach this one at
	// ["http://" + Listen when Listen names a host]. Empty: they read
	// what they miss from PostgreSQL instead.
	Advertise string
	// StatusSections adds the application's own sections to /status:
	// each key of the map it returns is served at the top level of the
	// document beside weft's own (Status), which win a clash. It is
	// called once per request with the request's context; nil adds
	// nothing. The binaries put their role, build, shard map and queues
	// there.
	StatusSections func(ctx context.Context) map[string]any
	// HTTPClient calls the other processes' catch-up endpoint (their
	// Advertise URLs): set one whose transport trusts their certificates
	// (and presents this process's, if they ask) when they serve HTTPS.
	// It must not follow redirects: requests carry Secret's bearer. Nil: a client
	// of weft's own, trusting the system's roots.
	HTTPClient *http.Client
	// Role is announced to the other processes, which list their peers
	// with it ["weft"].
	Role string
	// Version is announced with Role (the build of the process).
	Version string
	// Streams declares every stream the process writes, follows or
	// consumes, with its table.
	Streams []Stream
	// Writes names the streams this process writes (Append and Write, or
	// for an ephemeral stream Put and Remove).
	Writes []string
	// Followers see every row of a stream as it commits.
	Followers []Follower
	// Consumers apply every committed row of a stream exactly once, across
	// restarts and crashes.
	Consumers []Consumer
	// AnnounceInterval bounds how long an idle writer's position waits
	// before it is announced, and so how long a consumer may wait behind
	// an idle writer [1s; at least 50ms].
	AnnounceInterval time.Duration
	// LeaseTTL: a writer silent this long loses its name to the next
	// process that claims it, and a consumer group's member its
	// partitions to the others [10s].
	LeaseTTL time.Duration
	// OnWait, if set, is called while Open waits for Name, held by
	// another live process (self: this process's instance ID, Instance
	// once Open returns; holder: the other's; epoch: the name's; until:
	// when its lease runs out), at each look (several a second). Open
	// logs a WARN every 10s meanwhile either way.
	OnWait func(self, holder string, epoch int64, until time.Time)
	// SealExpired is how often the process seals the writers whose lease
	// ran out (a crashed holder), so their streams' order moves on: one
	// sealer per cluster is enough, each process one query per period
	// [LeaseTTL/4; at least 50ms]. Negative: never (another one seals).
	SealExpired time.Duration
	// SealDead: how often a sealing process (SealExpired not negative)
	// also looks for writers whose process ended (their liveness session
	// is gone: killed, crashed) and seals them without waiting for their
	// lease [250ms; at least 50ms]. Negative: never, the lease only (a
	// transaction-mode pooler between writers and PostgreSQL); it also
	// turns off the consumer group members' liveness locks, so a dead
	// member's partitions wait for its lease.
	SealDead time.Duration
	// HeartbeatInterval: the process announces itself this often; one not
	// heard from for three is forgotten [5s; at least 100ms].
	HeartbeatInterval time.Duration
	// Logger receives the process's logs [slog.Default()].
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a registry of the
	// process's own, served on /metrics.
	Registerer prometheus.Registerer
}

// Follower is a handler of every row of a stream, delivered as it
// commits: on every process that follows the stream, each row once, in
// the order of each writer's positions (rows of different writers may
// interleave differently on different processes).
type Follower struct {
	// Stream is the stream followed. Required.
	Stream string
	// Handler is given each row. Required.
	Handler Handler
	// FromStart delivers every row the stream holds first; otherwise the
	// rows committed from the time the process starts. (An ephemeral
	// stream's followers get its writers' current rows first either way.)
	FromStart bool
}

// Consumer applies every row of a stream exactly once: its effects and
// its cursor commit in one transaction, in the stream's order (by
// position, up to the stream's persisted-upto: every lower position is
// committed or rolled back). See ConsumerFunc.
type Consumer struct {
	// Stream is the stream consumed. Required.
	Stream string
	// Name names the cursor, stored in the database: processes that run
	// a consumer of the same name share its cursor, and each batch is
	// applied by one of them. Required: 1-64 of [a-z0-9_-].
	Name string
	// Apply applies a batch inside the transaction that moves the
	// cursor: effects exactly once. Exactly one of Apply and Deliver is
	// set.
	Apply ConsumerFunc
	// Deliver gives one row to something outside the database (an HTTP
	// endpoint, a mail server) that cannot join the transaction: at least
	// once, each key's rows in order, the cursor committed after the row
	// was delivered. It runs holding no transaction and no lock, with a
	// deadline of 30s, and its context is cancelled when the member loses
	// the row's partition. r.Stream and r.Pos identify the row: send them
	// as the idempotency key. Its errors go through Retry and dead
	// letters as Apply's do. Only in a group (Key); Partitions: 1 keeps
	// one order over the whole stream. See docs/DESIGN.md, "Deliver".
	Deliver func(ctx context.Context, r Row) error
	// MaxInFlight bounds the partitions a member runs at once, each in a
	// lane of its own: with Deliver, the rows in flight, one per
	// partition [16]; with Apply (a group's), set, it applies each
	// partition's rows in a transaction of its own, this many at once, so
	// that a slow row holds back only its partition (at the cost of a
	// transaction per partition per read, and this many connections);
	// zero, a batch spans the member's partitions in one transaction.
	MaxInFlight int
	// StartAtEnd starts a consumer new to the database at the stream's
	// current end rather than at its beginning.
	StartAtEnd bool
	// MaxBatch bounds the rows in one batch [100]. A batch never splits
	// a position: one whose last position holds several table rows (a
	// table of one's own) takes the rest of them too.
	MaxBatch int
	// Key makes the consumer a group: the processes that run it split
	// the stream's rows by key, each key's rows applied by one of them at
	// a time, in order (see docs/DESIGN.md, "Consumer groups"). It names a
	// top-level field of each row's JSON data; a row without it (or with
	// null) has the key "". Fixed when the group is first created.
	Key string
	// Partitions is the number of parts a group's keys are hashed into,
	// the unit that moves between processes: at most this many processes
	// share the work. Fixed when the group is first created [64]; zero
	// takes the stored number. Only with Key; at most 4096.
	Partitions int
	// Retry is how a position the function fails on is tried again, and
	// when it is given up and dead-lettered (see RetryPolicy; zero values
	// are its defaults: 10 attempts from 100ms growing to 1m).
	Retry RetryPolicy
	// OnDeadLetter is what the rows after a dead-lettered position do
	// [DeadLetterSkip: they go on]; DeadLetterPark (a group only) parks
	// the dead row's key until its letters are retried.
	OnDeadLetter DeadLetterPolicy
}

func (c *Config) setDefaults() {
	if c.Cluster == "" {
		c.Cluster = "weft"
	}
	if c.Advertise == "" && c.Listen != "" {
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
			c.Advertise = "http://" + c.Listen
		}
	}
	// The engine's defaults, defined once there.
	if c.AnnounceInterval == 0 {
		c.AnnounceInterval = core.DefaultAnnounceInterval
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = streams.DefaultLeaseTTL
	}
	if c.SealExpired == 0 {
		c.SealExpired = c.LeaseTTL / 4
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = core.DefaultHeartbeatInterval
	}
	if c.Role == "" {
		c.Role = "weft"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for i := range c.Consumers {
		if c.Consumers[i].MaxBatch == 0 {
			c.Consumers[i].MaxBatch = 100
		}
	}
}

// validate reports the first invalid field, by name: Open fails with it.
func (c Config) validate() error {
	c.setDefaults()
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("weft: Config.%s: %s", field, fmt.Sprintf(format, args...))
	}
	if err := instance.ValidName(c.Name); err != nil {
		return fail("Name", "%v", err)
	}
	if c.DatabaseURL == "" && c.Database == nil {
		return fail("DatabaseURL", "empty, and Database is nil")
	}
	if c.RedisURL == "" {
		return fail("RedisURL", "empty")
	}
	if c.RedisTLS != nil && !strings.HasPrefix(strings.ToLower(c.RedisURL), "rediss://") {
		return fail("RedisTLS", "set, but RedisURL is not rediss://")
	}
	if c.Secret == "" && !c.Insecure {
		return fail("Secret", "empty (set Insecure to run without one, for tests only)")
	}
	if c.Secret != strings.TrimSpace(c.Secret) || strings.ContainsAny(c.Secret, "\r\n\x00") {
		return fail("Secret", "has leading or trailing white space or a control character: it cannot travel in an HTTP header")
	}
	if c.PreviousSecret != "" && c.Secret == "" {
		return fail("PreviousSecret", "set without Secret: it is accepted besides Secret during a rotation")
	}
	if c.PreviousSecret != strings.TrimSpace(c.PreviousSecret) || strings.ContainsAny(c.PreviousSecret, "\r\n\x00") {
		return fail("PreviousSecret", "has leading or trailing white space or a control character: it cannot travel in an HTTP header")
	}
	if c.AnnounceInterval < 50*time.Millisecond {
		return fail("AnnounceInterval", "%v is below 50ms", c.AnnounceInterval)
	}
	if c.LeaseTTL < time.Second {
		return fail("LeaseTTL", "%v is below 1s", c.LeaseTTL)
	}
	if c.SealDead > 0 && c.SealDead < 50*time.Millisecond {
		return fail("SealDead", "%v is below 50ms (negative: never)", c.SealDead)
	}
	if c.SealExpired > 0 && c.SealExpired < 50*time.Millisecond {
		return fail("SealExpired", "%v is below 50ms (negative: never)", c.SealExpired)
	}
	if c.HeartbeatInterval < 100*time.Millisecond {
		return fail("HeartbeatInterval", "%v is below 100ms", c.HeartbeatInterval)
	}
	byName := map[string]Stream{}
	for i, s := range c.Streams {
		if err := s.validate(); err != nil {
			return fail(fmt.Sprintf("Streams[%d]", i), "%v", err)
		}
		if _, dup := byName[s.Name]; dup {
			return fail(fmt.Sprintf("Streams[%d]", i), "stream %q declared twice", s.Name)
		}
		byName[s.Name] = s
	}
	declared := func(field, stream string) error {
		if _, ok := byName[stream]; !ok {
			return fail(field, "stream %q is not in Streams", stream)
		}
		return nil
	}
	for i, s := range c.Writes {
		if err := declared(fmt.Sprintf("Writes[%d]", i), s); err != nil {
			return err
		}
	}
	from := map[string]bool{}
	for i, f := range c.Followers {
		field := fmt.Sprintf("Followers[%d]", i)
		if err := declared(field+".Stream", f.Stream); err != nil {
			return err
		}
		if f.Handler == nil {
			return fail(field+".Handler", "nil")
		}
		if was, seen := from[f.Stream]; seen && was != f.FromStart {
			return fail(field+".FromStart", "followers of %q disagree on FromStart", f.Stream)
		}
		from[f.Stream] = f.FromStart
	}
	names := map[[2]string]bool{}
	for i, k := range c.Consumers {
		field := fmt.Sprintf("Consumers[%d]", i)
		if err := declared(field+".Stream", k.Stream); err != nil {
			return err
		}
		if byName[k.Stream].Ephemeral {
			return fail(field+".Stream", "stream %q is ephemeral: it has no table to consume", k.Stream)
		}
		if err := instance.ValidName(k.Name); err != nil {
			return fail(field+".Name", "%v", err)
		}
		if names[[2]string{k.Stream, k.Name}] {
			return fail(field+".Name", "consumer %q of %q given twice", k.Name, k.Stream)
		}
		names[[2]string{k.Stream, k.Name}] = true
		switch {
		case k.Apply == nil && k.Deliver == nil:
			return fail(field+".Apply", "nil, and Deliver is nil")
		case k.Apply != nil && k.Deliver != nil:
			return fail(field+".Deliver", "set with Apply (a consumer applies in the transaction or delivers outside it, not both)")
		case k.Deliver != nil && k.Key == "":
			return fail(field+".Deliver", "set without Key (only a group delivers; Partitions: 1 keeps one order)")
		case k.MaxInFlight != 0 && k.Key == "":
			return fail(field+".MaxInFlight", "set without Key (only a group runs partitions apart)")
		case k.MaxInFlight < 0:
			return fail(field+".MaxInFlight", "%d is below 0", k.MaxInFlight)
		}
		if k.MaxBatch < 1 {
			return fail(field+".MaxBatch", "%d is below 1", k.MaxBatch)
		}
		if f, msg := k.validateGroup(); msg != "" {
			return fail(field+"."+f, "%s", msg)
		}
		if f, msg := k.Retry.validate(); msg != "" {
			return fail(field+".Retry."+f, "%s", msg)
		}
		switch {
		case k.OnDeadLetter != DeadLetterSkip && k.OnDeadLetter != DeadLetterPark:
			return fail(field+".OnDeadLetter", "%d is not a DeadLetterPolicy", k.OnDeadLetter)
		case k.OnDeadLetter == DeadLetterPark && k.Key == "":
			// Every row is one key's: a dead letter would stop the consumer,
			// which a failing position does already (Retry.MaxAttempts).
			return fail(field+".OnDeadLetter", "DeadLetterPark without Key (a single consumer has one order: every later row would wait; raise Retry.MaxAttempts instead)")
		}
	}
	return nil
}
