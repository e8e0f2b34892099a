package fabric

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/telemetry"
)

// Defaults of linkConfig, used for its zero fields.
const (
	defaultPingInterval = time.Second
	defaultPingTimeout  = 2 * time.Second
	defaultRunIDCheck   = 2 * time.Second
	defaultPublishQueue = 65536
	defaultQueueBytes   = 16 << 20
	defaultMaxBatch     = 512
)

const (
	// flushTimeout bounds the last flush of queued lines once run's context
	// is done, so a BYE queued just before shutdown still goes out.
	flushTimeout = time.Second
	// publishRetryInitial and publishRetryMax pace the publisher after
	// failed batches, so a Redis outage does not make it spin.
	publishRetryInitial = 10 * time.Millisecond
	publishRetryMax     = time.Second
	// connectRunIDRetry paces the run_id read on connect.
	connectRunIDRetry = 50 * time.Millisecond
)

var (
	// errLinkResubscribed: go-redis reconnected and resubscribed on its own;
	// whatever was published in between is lost.
	errLinkResubscribed = errors.New("fabric: link: subscription confirmed again (silent resubscribe)")
	// errLinkPingTimeout: the subscriber connection answers nothing.
	errLinkPingTimeout = errors.New("fabric: link: no reply to PING")
	// errLinkRedisRestarted: the Redis run_id changed under a live
	// subscription, so everything in flight is lost.
	errLinkRedisRestarted = errors.New("fabric: link: redis run_id changed")
	// errLinkUnexpected: the subscriber connection got a reply that a
	// subscription to its channels never produces.
	errLinkUnexpected = errors.New("fabric: link: unexpected pub/sub reply")
	errLinkRunning    = errors.New("fabric: link: already running")
)

// linkConfig configures a link. Zero values mean the defaults in brackets.
type linkConfig struct {
	// Options is the Redis connection, as from redis.ParseURL. The link
	// copies it. Exactly one of Options and Cluster is required.
	Options *redis.Options
	// Cluster is a Redis Cluster, as from redis.ParseClusterURL: the link
	// uses sharded pub/sub (SSUBSCRIBE, SPUBLISH), so each channel lives
	// on the master that owns its slot. The link copies it.
	Cluster *redis.ClusterOptions
	// Channels are the pub/sub channels subscribed to, all on one
	// connection; at least one, no duplicates. Lines may be published on
	// any channel, subscribed or not.
	Channels []string
	// Backoff is the reconnect policy.
	Backoff backoff.Config
	// PingInterval is how often the subscriber connection is PINGed [1s].
	PingInterval time.Duration
	// PingTimeout: no PONG (or any other reply) this long after a PING means
	// the connection is dead [2s]. It also bounds the subscription
	// confirmation and the run_id read on connect.
	PingTimeout time.Duration
	// RunIDCheck is how often the Redis run_id is read while subscribed [2s].
	RunIDCheck time.Duration
	// PublishQueue is how many lines may wait to be published [65536].
	PublishQueue int
	// QueueBytes bounds the bytes of the lines waiting [16 MiB]. A line
	// that would pass either bound is dropped and counted, never waited
	// for: writers must not block on a Redis outage, and readers repair
	// a lost line from the next one's prev.
	QueueBytes int64
	// MaxBatch is the most lines PUBLISHed per pipeline round trip [512].
	MaxBatch int
	// Logger gets the link's logs [discard].
	Logger *slog.Logger
	// OnAttempt, if set, is called before every connection attempt.
	OnAttempt func()
	// Barrier is the channel whose lines keep their place relative to the
	// lines of every channel as they are framed (the control channel);
	// lines of other channels keep their order per channel only.
	Barrier string
	// Stamp, if set, stamps each line as it is sent: it appends to line and
	// returns it. Stamping at send time, in send order, makes a line's
	// stamp the time it reached Redis, however long it waited in the queue
	// (see envelope).
	Stamp func(line []byte, now time.Time) []byte
	// Sign, if set, signs each frame (the lines of one PUBLISH) sent to
	// channel: it appends to frame and returns it.
	Sign func(channel string, frame []byte) []byte
}

// validate reports the first invalid field.
func (c linkConfig) validate() error {
	switch {
	case (c.Options == nil) == (c.Cluster == nil):
		return errors.New("fabric: linkConfig.Options or linkConfig.Cluster is required, not both")
	case len(c.Channels) == 0:
		return errors.New("fabric: linkConfig.Channels is required")
	case c.PingInterval < 0:
		return fmt.Errorf("fabric: linkConfig.PingInterval %v is negative", c.PingInterval)
	case c.PingTimeout < 0:
		return fmt.Errorf("fabric: linkConfig.PingTimeout %v is negative", c.PingTimeout)
	case c.RunIDCheck < 0:
		return fmt.Errorf("fabric: linkConfig.RunIDCheck %v is negative", c.RunIDCheck)
	case c.PublishQueue < 0:
		return fmt.Errorf("fabric: linkConfig.PublishQueue %d is negative", c.PublishQueue)
	case c.MaxBatch < 0:
		return fmt.Errorf("fabric: linkConfig.MaxBatch %d is negative", c.MaxBatch)
	case c.QueueBytes < 0:
		return fmt.Errorf("fabric: linkConfig.QueueBytes %d is negative", c.QueueBytes)
	}
	seen := make(map[string]bool, len(c.Channels))
	for _, ch := range c.Channels {
		if ch == "" || seen[ch] {
			return fmt.Errorf("fabric: linkConfig.Channels: %q is empty or listed twice", ch)
		}
		seen[ch] = true
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("fabric: linkConfig.Backoff: %w", err)
	}
	return nil
}

func (c linkConfig) withDefaults() linkConfig {
	c.PingInterval = cmp.Or(c.PingInterval, defaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, defaultPingTimeout)
	c.RunIDCheck = cmp.Or(c.RunIDCheck, defaultRunIDCheck)
	c.PublishQueue = cmp.Or(c.PublishQueue, defaultPublishQueue)
	c.MaxBatch = cmp.Or(c.MaxBatch, defaultMaxBatch)
	c.QueueBytes = cmp.Or(c.QueueBytes, defaultQueueBytes)
	c.Logger = telemetry.Logger(c.Logger)
	if c.OnAttempt == nil {
		c.OnAttempt = func() {}
	}
	return c
}

// linkEvents receives what happens on a link, from one goroutine, in order:
// linkUp, any number of linkMessage, linkDown, then again linkUp...
type linkEvents interface {
	// linkUp: Redis confirmed the SUBSCRIBE of every channel, sent at since. Only now may
	// the node publish REPLICATE: anything answering it is sure to reach us.
	// No line sent before since can arrive on this subscription.
	linkUp(since time.Time)
	// linkMessage is one message on a subscribed channel: a frame of one
	// or more lines joined by '\n'.
	linkMessage(channel, payload string)
	// linkDown: the subscription is lost (error, missing PONG, silent
	// resubscribe, Redis run_id changed); messages may have been missed.
	// The end of run's context is not reported.
	linkDown(err error)
	// linkChannelsDown: on a Redis Cluster, between linkUp and linkDown,
	// these channels were lost alone (their connection failed, or the
	// server unsubscribed one whose slot moved); their messages may be
	// missed until linkChannelsUp. Never the Barrier channel: losing that
	// is a linkDown.
	linkChannelsDown(channels []string, err error)
	// linkChannelsUp: channels lost alone are subscribed again, confirmed;
	// the subscriptions were sent at since.
	linkChannelsUp(channels []string, since time.Time)
	// linkFresh: a PONG arrived for a PING sent at sent, so every message
	// published before then has been handed to linkMessage.
	linkFresh(sent time.Time)
}

// linkStats is a snapshot for metrics.
type linkStats struct {
	Attempts       uint64 // connection attempts
	Reconnects     uint64 // subscriptions confirmed after the first
	Published      uint64 // lines Redis accepted
	PublishErrors  uint64 // lines whose PUBLISH failed (lost, not retried)
	PublishDropped uint64 // lines dropped because the queue was full
	PublishBatches uint64 // pipeline round trips
	PublishFrames  uint64 // PUBLISHes (frames of lines)
	// ChannelLosses and ChannelResubscribes count channels lost alone and
	// subscribed again on a Redis Cluster, the rest of the subscription
	// staying up (see linkChannelsDown).
	ChannelLosses       uint64
	ChannelResubscribes uint64
	QueuedLines         int    // lines waiting to be published
	QueuedBytes         int64  // their bytes
	Connected           bool   // between linkUp and linkDown
	LastRunID           string // the Redis run_id last read
}

// link is the Redis transport of the fabric: one subscriber connection to
// all its channels that it keeps alive (PING), checks (run_id) and
// re-establishes with backoff, and one ordered publisher connection. It
// moves lines and knows nothing of the protocol. On one Redis, lines one
// publisher connection sends reach a subscriber connection in the order
// sent, whatever their channels: the node relies on that order for the
// barrier (control) channel's lines, so the link keeps a single connection
// of each kind. A message is a frame of one or more lines of its channel
// (see framer); linkMessage gets the frame.
//
// go-redis's PubSub reconnects and resubscribes on its own after an error;
// the link never lets that pass silently: any receive error, and any second
// confirmation on one PubSub, ends the connection with linkDown, and the
// link reconnects itself through its backoff.
type link struct {
	cfg  linkConfig
	addr string // for logs
	log  *slog.Logger
	sub  *redis.Client // pub/sub connections only; nil on a cluster
	// subCluster configures each connection attempt's cluster client.
	subCluster *redis.ClusterOptions
	// pub publishes: one connection (per master, on a cluster), so
	// PUBLISHes stay in order.
	pub   redis.UniversalClient
	queue chan outLine
	kick  chan struct{} // asks serve for a PING now (pingNow)

	running atomic.Bool

	attempts       atomic.Uint64
	reconnects     atomic.Uint64
	published      atomic.Uint64
	publishErrors  atomic.Uint64
	publishDropped atomic.Uint64
	framer         framer // the publisher's only
	subscribed     map[string]bool
	publishBatches atomic.Uint64
	publishFrames  atomic.Uint64
	// Channels lost and subscribed again alone, within a session.
	channelLosses       atomic.Uint64
	channelResubscribes atomic.Uint64
	queuedBytes         atomic.Int64
	// finalFlush is what the last flush of run's end did: nil when every
	// queued line was published. Read it after run returned.
	finalFlush error

	mu         sync.Mutex
	session    uint64 // current connection, counting from 1; 0 before the first
	up         bool   // session is between linkUp and linkDown
	estSession uint64 // the session established() was called for
	current    *linkSession
	everUp     bool // linkUp was called once
	lastRunID  string
}

// newLink validates cfg and creates the Redis clients; it does not connect.
func newLink(cfg linkConfig) (*link, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()

	if cfg.Cluster != nil {
		return newClusterLink(cfg), nil
	}
	subOpt := *cfg.Options
	// On the subscriber only the handshake reads use ReadTimeout (Receive
	// sets no deadline): a Redis that does not answer it within
	// PingTimeout is as dead as one that misses a PONG.
	subOpt.ReadTimeout = cfg.PingTimeout
	pubOpt := *cfg.Options
	// Without this go-redis ignores context deadlines on reads and waits
	// ReadTimeout instead, so INFO could outlast PingTimeout.
	pubOpt.ContextTimeoutEnabled = true
	pubOpt.PoolSize = 1
	// Pipelines have their own pool unless this is negative; one connection
	// for everything keeps the publisher's commands on one socket.
	pubOpt.PipelinePoolSize = -1
	pubOpt.MinIdleConns = 0
	// A failed batch is lost, never resent: pub/sub is at-most-once and
	// readers detect gaps. Resending a pipeline could duplicate and reorder.
	pubOpt.MaxRetries = -1
	// The publisher paces its own retries.
	pubOpt.DialerRetries = 1

	pubOpt.MaintNotificationsConfig, subOpt.MaintNotificationsConfig = noMaint(), noMaint()
	l := newLinkOf(cfg, cfg.Options.Addr, redis.NewClient(&pubOpt))
	l.sub = redis.NewClient(&subOpt)
	return l, nil
}

// newClusterLink is newLink on a Redis Cluster.
func newClusterLink(cfg linkConfig) *link {
	subOpt := *cfg.Cluster
	subOpt.ReadTimeout = cfg.PingTimeout // as on one Redis
	pubOpt := *cfg.Cluster
	pubOpt.ContextTimeoutEnabled = true
	// One connection per master: a channel's lines stay in order.
	pubOpt.PoolSize = 1
	pubOpt.PipelinePoolSize = -1
	pubOpt.MinIdleConns = 0
	// At most once, as on one Redis. A MOVED reply is not a retry: the
	// command did not run, and go-redis sends it on to the new owner
	// (MaxRedirects).
	pubOpt.MaxRetries = -1
	pubOpt.DialerRetries = 1
	pubOpt.MaintNotificationsConfig, subOpt.MaintNotificationsConfig = noMaint(), noMaint()
	l := newLinkOf(cfg, strings.Join(cfg.Cluster.Addrs, ","), redis.NewClusterClient(&pubOpt))
	l.subCluster = &subOpt
	return l
}

// noMaint turns go-redis's maintenance notifications off. The link
// handles a failover itself (a gap), Redis before 8 refuses them anyway,
// and on RESP3 go-redis starts a goroutine per client for them as soon as
// the client is made: a Node that was built but never Run left it behind.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

func newLinkOf(cfg linkConfig, addr string, pub redis.UniversalClient) *link {
	subscribed := make(map[string]bool, len(cfg.Channels))
	for _, ch := range cfg.Channels {
		subscribed[ch] = true
	}
	return &link{
		cfg:        cfg,
		addr:       addr,
		log:        cfg.Logger.With("channel", cfg.Channels[0]),
		pub:        pub,
		queue:      make(chan outLine, cfg.PublishQueue),
		kick:       make(chan struct{}, 1),
		subscribed: subscribed,
		framer:     framer{barrier: cfg.Barrier, stamp: cfg.Stamp, sign: cfg.Sign},
	}
}

// pingNow asks for a PING ahead of the interval: after a stall, its PONG
// proves the backlog was read, and readiness need not wait a whole
// PingInterval for the next one.
func (l *link) pingNow() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// close closes the Redis clients; call it after run returned.
func (l *link) close() error {
	if l.sub == nil {
		return l.pub.Close()
	}
	return errors.Join(l.sub.Close(), l.pub.Close())
}

// stats returns a snapshot of the counters.
func (l *link) stats() linkStats {
	l.mu.Lock()
	connected, runID := l.up, l.lastRunID
	l.mu.Unlock()
	return linkStats{
		Attempts:            l.attempts.Load(),
		Reconnects:          l.reconnects.Load(),
		Published:           l.published.Load(),
		PublishErrors:       l.publishErrors.Load(),
		PublishDropped:      l.publishDropped.Load(),
		PublishBatches:      l.publishBatches.Load(),
		PublishFrames:       l.publishFrames.Load(),
		ChannelLosses:       l.channelLosses.Load(),
		ChannelResubscribes: l.channelResubscribes.Load(),
		QueuedLines:         len(l.queue),
		QueuedBytes:         l.queuedBytes.Load(),
		Connected:           connected,
		LastRunID:           runID,
	}
}

// established tells the link that the current connection is established
// (the node caught up), so the reconnect backoff starts over after it
// drops. Until then every reconnect waits longer than the one before, so a
// catch-up that keeps failing cannot cause a tight reconnect loop. A call
// while no connection is up is ignored: it is late for one already lost.
func (l *link) established() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.up {
		l.estSession = l.session
	}
	if l.current != nil {
		l.current.resetRetries()
	}
}

// errPublishDropped: the publish queue was full; the line was dropped.
var errPublishDropped = errors.New("fabric: publish queue full: line dropped")

// outLine is one line waiting to be published on channel.
type outLine struct{ channel, line string }

// publish queues one line for the publisher, to go out on channel. Lines
// are PUBLISHed in the order queued (per channel; see framer), on one
// connection, in pipelines of up to MaxBatch lines. It never blocks: a
// line that does not fit the queue (PublishQueue lines, QueueBytes bytes)
// is dropped, counted and reported as errPublishDropped.
// Queued lines go out only while run runs; a failed batch is logged and
// counted, not retried. The line is copied.
func (l *link) publish(channel string, line []byte) error {
	n := int64(len(line))
	if l.queuedBytes.Add(n) > l.cfg.QueueBytes {
		l.queuedBytes.Add(-n)
		l.publishDropped.Add(1)
		return errPublishDropped
	}
	select {
	case l.queue <- outLine{channel, string(line)}:
		return nil
	default:
		l.queuedBytes.Add(-n)
		l.publishDropped.Add(1)
		return errPublishDropped
	}
}

// dequeued accounts for lines taken off the queue.
func (l *link) dequeued(lines []outLine) {
	var n int64
	for _, o := range lines {
		n += int64(len(o.line))
	}
	l.queuedBytes.Add(-n)
}

// run connects, subscribes and keeps reconnecting with backoff until ctx
// is done, reporting to ev; it also runs the publisher. It returns nil when
// ctx is done, after every goroutine it started has stopped.
func (l *link) run(ctx context.Context, ev linkEvents) error {
	if !l.running.CompareAndSwap(false, true) {
		return errLinkRunning
	}
	defer l.running.Store(false)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { l.runPublisher(ctx) })

	bo := l.cfg.Backoff.NewBackOff()
	for {
		l.attempts.Add(1)
		l.cfg.OnAttempt()
		wasEstablished, err := l.connect(ctx, ev)
		if ctx.Err() != nil {
			return nil
		}
		if wasEstablished {
			bo.Reset()
		}
		delay := bo.NextBackOff()
		l.log.Warn("fabric: link: disconnected", "err", err, "retry_in", delay)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// runPublisher drains the queue into pipelines until ctx is done, then
// flushes what is still queued for at most flushTimeout. It keeps going
// across subscriber reconnects and Redis outages: a failed batch is counted
// and dropped, and consecutive failures back off.
func (l *link) runPublisher(ctx context.Context) {
	// Sends do not take ctx's cancellation: go-redis fails a batch at once
	// on a canceled context, and a batch taken from the queue must not be
	// lost to shutdown. Timeouts bound them.
	sendCtx := context.WithoutCancel(ctx)
	retry := backoff.Config{Initial: publishRetryInitial, Max: publishRetryMax}.NewBackOff()
	batch := make([]outLine, 0, l.cfg.MaxBatch)
	for {
		if ctx.Err() != nil {
			l.flush(sendCtx)
			return
		}
		select {
		case <-ctx.Done():
			continue
		case line := <-l.queue:
			batch = l.fill(append(batch[:0], line))
		}
		l.dequeued(batch)
		if err := l.send(sendCtx, batch); err != nil {
			if cc, ok := l.pub.(*redis.ClusterClient); ok {
				// go-redis reloads its slot map on MOVED, not when a master
				// is gone: without this it keeps dialing the dead one.
				cc.ReloadState(sendCtx)
			}
			delay := retry.NextBackOff()
			l.log.Warn("fabric: link: publish failed", "err", err, "lines", len(batch), "retry_in", delay)
			timer := time.NewTimer(delay)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		retry.Reset()
	}
}

// fill appends queued lines to batch without waiting, up to MaxBatch.
func (l *link) fill(batch []outLine) []outLine {
	for len(batch) < l.cfg.MaxBatch {
		select {
		case line := <-l.queue:
			batch = append(batch, line)
		default:
			return batch
		}
	}
	return batch
}

// flush sends what is queued, for at most flushTimeout, and records in
// finalFlush whether all of it was published.
func (l *link) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	batch := make([]outLine, 0, l.cfg.MaxBatch)
	for {
		batch = l.fill(batch[:0])
		l.dequeued(batch)
		if len(batch) == 0 {
			return
		}
		if err := ctx.Err(); err != nil {
			l.finalFlush = fmt.Errorf("fabric: link: final flush: %d lines left: %w", len(batch)+len(l.queue), err)
			return
		}
		if err := l.send(ctx, batch); err != nil {
			l.finalFlush = err
			l.log.Warn("fabric: link: final publish failed", "err", err, "lines", len(batch))
			return
		}
	}
}

// send PUBLISHes batch in one pipeline round trip, as frames (see framer).
func (l *link) send(ctx context.Context, batch []outLine) error {
	frames := l.framer.pack(batch, time.Now())
	pipe := l.pub.Pipeline()
	for _, fr := range frames {
		l.publishOn(ctx, pipe, fr.channel, l.framer.payload(fr))
	}
	cmds, err := pipe.Exec(ctx)
	l.publishBatches.Add(1)
	l.publishFrames.Add(uint64(len(frames)))
	failed := 0
	for i, cmd := range cmds {
		if cmd.Err() != nil && i < len(frames) {
			failed += frames[i].lines
		}
	}
	if err != nil && failed == 0 {
		failed = len(batch)
	}
	l.published.Add(uint64(len(batch) - failed))
	l.publishErrors.Add(uint64(failed))
	if err != nil {
		return fmt.Errorf("fabric: link: publish %d lines: %w", len(batch), err)
	}
	return nil
}

// publishOn queues a PUBLISH (SPUBLISH on a cluster) of msg on pipe.
func (l *link) publishOn(ctx context.Context, pipe redis.Pipeliner, channel string, msg any) {
	if l.cfg.Cluster != nil {
		pipe.SPublish(ctx, channel, msg)
		return
	}
	pipe.Publish(ctx, channel, msg)
}

// redisOptions parses cfg.RedisURL (as a Redis Cluster's seeds with
// cfg.RedisCluster) and applies cfg.RedisTLS.
func redisOptions(cfg Config) (*redis.Options, *redis.ClusterOptions, error) {
	var opts *redis.Options
	var copts *redis.ClusterOptions
	var err error
	var implied **tls.Config
	if cfg.RedisCluster {
		if copts, err = redis.ParseClusterURL(cfg.RedisURL); err == nil {
			implied = &copts.TLSConfig
		}
	} else if opts, err = redis.ParseURL(cfg.RedisURL); err == nil {
		implied = &opts.TLSConfig
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fabric: config: RedisURL: %w", err)
	}
	if cfg.RedisTLS != nil {
		if *implied == nil {
			return nil, nil, errors.New("fabric: config: RedisTLS is set but RedisURL is not rediss://")
		}
		tc := cfg.RedisTLS.Clone()
		if tc.ServerName == "" {
			tc.ServerName = (*implied).ServerName
		}
		*implied = tc
	}
	return opts, copts, nil
}
