package fabric

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// Config configures a Node. Zero values mean the documented defaults.
type Config struct {
	// Instance is this process's instance ID (instance.NewID). Required.
	Instance string
	// Cluster names the Redis channels: the control channel
	// "weft:<Cluster>" and one per stream, "weft:<Cluster>/<stream>".
	// Required.
	Cluster string
	// RedisURL is redis:// or rediss://, with credentials if any. Required.
	RedisURL string
	// RedisCluster: RedisURL names seed nodes of a Redis Cluster (7+), in
	// go-redis's cluster form: redis://host1:port?addr=host2:port&addr=...
	// The node then uses sharded pub/sub: each stream's channel lives on
	// the master that owns its slot, and a master's failover, a slot
	// migration or a node's loss is a gap the node repairs.
	RedisCluster bool
	// RedisTLS replaces the TLS configuration a rediss:// RedisURL implies
	// (its ServerName kept unless set); an error with a redis:// one.
	RedisTLS *tls.Config
	// Hello is what this instance announces (its URL serves catch-up).
	Hello wire.Hello
	// Streams are the streams this instance follows. The node subscribes
	// to their channels and to those of the streams it writes, and to no
	// other: the lines of streams it neither follows nor writes never
	// reach it (weft_fabric_lines_received_total counts by channel).
	Streams []core.StreamSpec
	// Views are where the application's state is, per writer.
	Views map[core.Key]int64
	// Writers are the durable streams this instance writes (OpenWriter).
	// The node owns them: it publishes their rows and positions, renews
	// their leases, and on a graceful stop seals them and announces it.
	Writers []*Writer
	// Ephemerals are the ephemeral streams this instance writes.
	Ephemerals []*Ephemeral
	// Generators are the generators of durable streams followed but not
	// written here (streams.Open with no writer name): the node refreshes
	// their registry and feeds them every writer's position. A Writer's
	// generator is added by itself.
	Generators []*streams.Generator
	// Handler applies rows. Required.
	Handler Handler
	// Fetcher serves catch-ups. Required when following any stream.
	Fetcher Fetcher
	// FetchTimeout bounds one page fetch [10 s].
	FetchTimeout time.Duration
	// AnnounceInterval: position moves without rows are published at most
	// this long after they happen, and registry refreshes and stored
	// positions run at this pace [1 s; at least 50 ms].
	AnnounceInterval time.Duration
	// HeartbeatInterval: HELLO plus a POSITION per written stream [5 s].
	HeartbeatInterval time.Duration
	// ReplicateWait: how long after subscribing to wait for positions
	// before the connection may count as established [500 ms].
	ReplicateWait time.Duration
	// Backoff is the reconnect policy; catch-up retries use it too.
	Backoff backoff.Config
	// Secret, when set, signs every command this node publishes (HMAC) and
	// makes it drop, and count, any line not signed with the same secret:
	// a forged position could otherwise make readers skip rows. Every
	// instance of a cluster must use the same secret.
	Secret string
	// PreviousSecret, when set with Secret, is accepted too and never
	// used to sign: a rotation, while some instances still sign with it.
	PreviousSecret string
	// Epoch is the epoch of the writer name this instance holds when it
	// writes only ephemeral streams (streams.ClaimName's); the Writers'
	// leases give it otherwise. 0 when it holds none. Every line carries
	// it, and readers follow only the highest epoch of a name: a previous
	// holder that is still running, or a replay of its lines, is ignored.
	Epoch uint64
	// SealExpired, when positive, makes this node a sealer: this often it
	// seals every writer of its durable streams whose lease expired (a
	// crashed or stalled holder) and announces each seal, so persisted-upto
	// moves on. Any number of instances may; one is enough (the binaries'
	// master, at a quarter of the lease). Zero: never.
	SealExpired time.Duration
	// SealDead: how often a sealer (SealExpired > 0) also looks for
	// writers whose process died (their liveness session ended, see
	// streams.SealDead) and seals them at once, without waiting for their
	// lease [250 ms; at least 50ms]. Negative: never (the lease only).
	SealDead time.Duration
	// SealTimeout bounds the seal of each Writer on a graceful stop
	// [2 s]; past it the seal is skipped and the name's lease lapses.
	SealTimeout time.Duration
	// MaxLineAge: a line from an instance never heard of is refused as a
	// replay when older than this [1 min]; it also bounds the clock skew
	// between instances.
	MaxLineAge time.Duration
	// DegradedFreshness: once established, while the connection is lost
	// (Redis down) or being established again, the node stays ready as
	// long as it has caught up with the writer positions PostgreSQL held
	// at most this long ago (degraded mode) [3 * AnnounceInterval, at
	// least 1 s]. Negative disables degraded readiness.
	DegradedFreshness time.Duration
	// Codec decodes the channel; register application verbs on it. Nil
	// means a codec with the built-in verbs only.
	Codec *wire.Codec
	// OnCommand receives application commands (verbs registered on Codec).
	OnCommand func(wire.Command)
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// OnFail, if set, is called once, at once, when the node can no
	// longer serve (a writer's lease lost), with the cause: before Run has
	// stopped its goroutines and returned it. Err returns it from then on.
	OnFail func(err error)
	// Logger; nil discards.
	Logger *slog.Logger
	// link is set by tests to tune the transport.
	linkTune func(*linkConfig)
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if _, ok := instance.NameOf(c.Instance); !ok {
		return fmt.Errorf("fabric: config: Instance %q is not an instance ID", c.Instance)
	}
	if c.Cluster == "" || !wire.ValidName(c.Cluster) {
		return fmt.Errorf("fabric: config: Cluster %q: want 1-128 of [A-Za-z0-9_.:-]", c.Cluster)
	}
	if c.RedisURL == "" {
		return errors.New("fabric: config: RedisURL is empty")
	}
	if c.Handler == nil {
		return errors.New("fabric: config: Handler is nil")
	}
	if len(c.Streams) > 0 && c.Fetcher == nil {
		return errors.New("fabric: config: Fetcher is nil but Streams are followed")
	}
	if c.AnnounceInterval != 0 && c.AnnounceInterval < 50*time.Millisecond {
		return fmt.Errorf("fabric: config: AnnounceInterval %v is below 50ms", c.AnnounceInterval)
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("fabric: config: Backoff: %w", err)
	}
	// A sealer scans the writer registry this often: a unit typed wrong
	// (µs for ms) would have it query in a tight loop.
	if c.SealExpired < 0 || (c.SealExpired > 0 && c.SealExpired < 50*time.Millisecond) {
		return fmt.Errorf("fabric: config: SealExpired %v: want 0 (not a sealer) or at least 50ms", c.SealExpired)
	}
	if c.SealDead > 0 && c.SealDead < 50*time.Millisecond {
		return fmt.Errorf("fabric: config: SealDead %v: want 0 (250ms), negative (never) or at least 50ms", c.SealDead)
	}
	// Stream names travel in every line: one the wire cannot carry would
	// be accepted here and every line of it dropped at publish.
	for i, sp := range c.Streams {
		if !wire.ValidName(sp.Name) {
			return fmt.Errorf("fabric: config: Streams[%d].Name %q: want 1-128 of [A-Za-z0-9_.:-]", i, sp.Name)
		}
	}
	for i, e := range c.Ephemerals {
		if e == nil {
			return fmt.Errorf("fabric: config: Ephemerals[%d] is nil", i)
		}
		if !wire.ValidName(e.stream) {
			return fmt.Errorf("fabric: config: Ephemerals[%d]: stream name %q: want 1-128 of [A-Za-z0-9_.:-] (NewEphemeral)", i, e.stream)
		}
	}
	// A writer's rows go out under this instance's role name (the key
	// readers know it by), so its writer name must be that name.
	role, _ := instance.NameOf(c.Instance)
	for i, w := range c.Writers {
		if w == nil {
			return fmt.Errorf("fabric: config: Writers[%d] is nil", i)
		}
		if w.Name() != role {
			return fmt.Errorf("fabric: config: Writers[%d]: writer name %q is not this instance's role name %q (Instance %s): open it with WriterConfig.Name %q",
				i, w.Name(), role, c.Instance, role)
		}
	}
	return nil
}
