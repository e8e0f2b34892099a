package core

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
)

// Defaults for zero Config fields.
const (
	DefaultReplicateWait     = 500 * time.Millisecond
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultAnnounceInterval  = time.Second
	DefaultMaxRowsBytes      = 64 << 10
	DefaultMaxBuffer         = 10000
	DefaultMaxLineAge        = time.Minute
	DefaultMaxClockSkew      = 2 * time.Second
	DefaultMaxPeers          = 4096
	DefaultMaxGone           = 4096
)

// StreamSpec is one stream this instance follows or writes.
type StreamSpec struct {
	Name string
	// Ephemeral streams live in their one writer's memory: a new instance of
	// the writer starts again from 0.
	Ephemeral bool
	// Start is the view of a writer not listed in Config.Views: for a
	// durable stream the persisted-upto the application loaded its state
	// at; 0 for ephemeral streams.
	Start int64
	// Writers are the durable writers known to exist when the instance
	// starts (from the database). A connection waits for their POSITION
	// as for writers heard from before, so a fresh instance is not
	// established, nor ready, before it knows where each writer is.
	Writers []string
}

// Config configures a Core. Zero durations and sizes mean the defaults.
type Config struct {
	// Instance is this process's instance ID; its own echoes are ignored.
	Instance string
	// Hello is announced on connect, on REPLICATE and with every heartbeat.
	Hello wire.Hello
	// Streams are the streams this instance follows.
	Streams []StreamSpec
	// Views are the positions the application's state is at, per writer.
	Views map[Key]int64
	// Writes maps each stream this instance writes to its position at start.
	Writes map[string]int64
	// ReplicateWait is how long after subscribing the connection waits for
	// REPLICATE answers before it may count as established.
	ReplicateWait time.Duration
	// HeartbeatInterval: HELLO and a POSITION per written stream, which let
	// readers detect anything they missed from this writer.
	HeartbeatInterval time.Duration
	// WriterWait is how long a new connection waits for the POSITION of
	// each writer heard from before, before it may count as established
	// without it [2 * HeartbeatInterval]. A writer that does not answer in
	// time is suspect, and not waited for again until it is heard from.
	WriterWait time.Duration
	// AnnounceInterval bounds how long a position move without rows waits
	// before it is published (moves are coalesced).
	AnnounceInterval time.Duration
	// MaxRowsBytes: larger rows go out as POSITION pos pos, so readers fetch
	// them over HTTP instead.
	MaxRowsBytes int
	// MaxBuffer bounds the commands buffered per writer while it catches up;
	// past it the buffer is dropped and the catch-up extends to the last
	// announced position.
	MaxBuffer int
	// RetryDelay is the wait before retrying a failed catch-up, by attempt
	// (1, 2, ...). Nil means 100 ms doubling up to 5 s. The runner usually
	// injects a jittered one.
	RetryDelay func(attempt int) time.Duration
	// PeerTimeout: an instance not heard from this long while connected is
	// forgotten (its ephemeral state reset, nobody waits for it) [3 *
	// HeartbeatInterval].
	PeerTimeout time.Duration
	// MaxLineAge: a line from an instance this core has never heard of is
	// refused as a replay when its stamp is older than this, by this core's
	// clock [1 min]. It bounds the clock skew between instances too.
	MaxLineAge time.Duration
	// StoredGrace: a writer position learned from the database (Stored)
	// while the connection is established and the writer live is fetched
	// only if the live path has not brought the view there within it
	// [2 * AnnounceInterval, at least 500 ms].
	StoredGrace time.Duration
	// MaxClockSkew is how far behind this core's clock another instance's
	// may be. A line from an instance not live here that is stamped more
	// than this before the current subscription was sent cannot have been
	// published on it: it is a replay [2 s].
	MaxClockSkew time.Duration
	// MaxPeers bounds the live instances (and the writer names) tracked;
	// lines from further new instances are refused [4096].
	MaxPeers int
	// MaxGone bounds the departed instances remembered, to refuse their
	// replayed lines; beyond it the oldest are forgotten and MaxLineAge
	// alone refuses their lines [4096].
	MaxGone int
}

func (c *Config) setDefaults() {
	orDefault(&c.ReplicateWait, DefaultReplicateWait)
	orDefault(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	orDefault(&c.WriterWait, 2*c.HeartbeatInterval)
	orDefault(&c.AnnounceInterval, DefaultAnnounceInterval)
	orDefault(&c.MaxRowsBytes, DefaultMaxRowsBytes)
	orDefault(&c.MaxBuffer, DefaultMaxBuffer)
	if c.RetryDelay == nil {
		c.RetryDelay = DoublingDelay(100*time.Millisecond, 5*time.Second)
	}
	orDefault(&c.PeerTimeout, 3*c.HeartbeatInterval)
	orDefault(&c.MaxLineAge, DefaultMaxLineAge)
	orDefault(&c.StoredGrace, max(2*c.AnnounceInterval, 500*time.Millisecond))
	orDefault(&c.MaxClockSkew, DefaultMaxClockSkew)
	orDefault(&c.MaxPeers, DefaultMaxPeers)
	orDefault(&c.MaxGone, DefaultMaxGone)
}

// orDefault sets *v to def when it is zero or negative.
func orDefault[T ~int | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// DoublingDelay is base, 2*base, 4*base, ... capped at limit.
func DoublingDelay(base, limit time.Duration) func(int) time.Duration {
	return func(attempt int) time.Duration {
		d := base
		for i := 1; i < attempt && d < limit; i++ {
			d *= 2
		}
		return min(d, limit)
	}
}

// ErrConfig is returned by New for an invalid Config.
var ErrConfig = errors.New("core: bad config")

// FetchResult answers a Fetch. Upto is the highest position whose rows the
// runner delivered (From if none); Err says the fetch failed or stopped
// there, Gone that the writer no longer has the range (it restarted).
type FetchResult struct {
	ID   uint64
	Upto int64
	Err  error
	Gone bool
}

type view struct {
	key        Key
	ephemeral  bool
	instance   string
	pos        int64 // delivered up to here
	announced  int64 // highest position the writer announced
	positioned bool  // a POSITION arrived on this connection
	awaited    bool  // the connection waits for this writer's POSITION
	suspect    bool  // did not answer a connection in time
	expected   bool  // a known writer (StreamSpec.Writers), maybe not heard from yet

	// stored is a position the database has for the writer above the
	// view, waiting StoredGrace (since storedSince) for the live path.
	stored      int64
	storedSince time.Time

	catching bool   // catching up to `to`
	why      string // what started the catch-up: a gap cause, "gone", "overflow"
	to       int64  // fetch target
	fetchID  uint64 // the fetch in flight, 0 when waiting to retry
	attempt  int
	gones    int // consecutive resets by a Gone fetch
	retryAt  time.Time
	buf      []wire.Command // *wire.RData and *wire.Position, by position
	overflow bool
}

type pendingRows struct {
	pos   int64
	rows  json.RawMessage
	fetch bool // committed, content not held: readers fetch it (LocalCommitted)
}

type ownStream struct {
	name       string
	pos        int64 // the writer's position
	sent       int64 // the last position announced: the next command's prev
	pending    []pendingRows
	dirty      bool
	announceAt time.Time
}

// Core is the protocol state of one instance. It is not safe for
// concurrent use: one runner goroutine owns it.
type Core struct {
	cfg      Config
	selfName string
	streams  map[string]StreamSpec
	views    map[Key]*view
	fetches  map[uint64]*view
	nextID   uint64
	// The peer table (peers.go).
	peers     map[string]*peer
	gone      map[string]uint64 // departed instance -> last sequence refused
	goneOrder []string          // departure order, from goneHead
	goneHead  int
	holders   map[string]holder // writer name -> its highest epoch
	own       map[string]*ownStream
	ownList   []*ownStream // in name order, for deterministic output

	now          time.Time
	subscribedAt time.Time // when the current subscription was sent; zero if unknown
	connected    bool
	established  bool
	lost         map[string]bool // streams whose channel is lost (channels.go)
	windowEnd    time.Time
	writersEnd   time.Time
	nextHello    time.Time
	out          []Action
	delivers     []Deliver // the rest of the block deliver lends from
}

// New returns a disconnected Core.
func New(cfg Config) (*Core, error) {
	cfg.setDefaults()
	selfName, ok := instance.NameOf(cfg.Instance)
	if !ok {
		return nil, fmt.Errorf("%w: Instance %q is not an instance ID", ErrConfig, cfg.Instance)
	}
	c := &Core{
		cfg:      cfg,
		selfName: selfName,
		streams:  make(map[string]StreamSpec, len(cfg.Streams)),
		views:    map[Key]*view{},
		fetches:  map[uint64]*view{},
		peers:    map[string]*peer{},
		gone:     map[string]uint64{},
		holders:  map[string]holder{},
		own:      map[string]*ownStream{},
		lost:     map[string]bool{},
	}
	for _, s := range cfg.Streams {
		if _, dup := c.streams[s.Name]; dup {
			return nil, fmt.Errorf("%w: Streams: %s listed twice", ErrConfig, s.Name)
		}
		c.streams[s.Name] = s
		for _, w := range s.Writers {
			if w != cfg.Hello.Name {
				c.view(Key{Stream: s.Name, Writer: w}).expected = true
			}
		}
	}
	for k, p := range cfg.Views {
		if _, ok := c.streams[k.Stream]; !ok {
			return nil, fmt.Errorf("%w: Views: stream %s is not in Streams", ErrConfig, k.Stream)
		}
		c.view(k).pos = p
	}
	names := make([]string, 0, len(cfg.Writes))
	for s := range cfg.Writes {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, s := range names {
		o := &ownStream{name: s, pos: cfg.Writes[s], sent: cfg.Writes[s]}
		c.own[s] = o
		c.ownList = append(c.ownList, o)
		if _, follows := c.streams[s]; follows {
			// The rows this writer name wrote before this start, above the
			// view the application's state is at, are fetched like any
			// other writer's (the first Tick asks): a follower from the
			// stream's start gets them too. Rows written from now on wait
			// in the view's buffer meanwhile.
			v := c.view(Key{Stream: s, Writer: selfName})
			v.instance, v.announced = cfg.Instance, o.pos
			if v.pos < o.pos && !c.streams[s].Ephemeral {
				v.catching, v.to, v.why = true, o.pos, "own rows before this start"
			} else {
				v.pos = max(v.pos, o.pos)
			}
		}
	}
	return c, nil
}

func (c *Core) emit(a Action) { c.out = append(c.out, a) }

func (c *Core) flush() []Action {
	out := c.out
	c.out = nil
	return out
}

func (c *Core) note(kind, stream, cause string) {
	c.emit(Note{Kind: kind, Stream: stream, Cause: cause})
}

func (c *Core) view(k Key) *view {
	v, ok := c.views[k]
	if !ok {
		s := c.streams[k.Stream]
		v = &view{key: k, ephemeral: s.Ephemeral, pos: s.Start}
		c.views[k] = v
	}
	return v
}

// Tick moves the core's clock: retries fall due, coalesced positions are
// announced, heartbeats sent, and the connection may become established.
func (c *Core) Tick(now time.Time) []Action {
	prev := c.now
	if now.After(c.now) {
		c.now = now
	}
	c.expirePeers(prev)
	c.storedDue()
	for _, k := range c.sortedKeys() {
		v := c.views[k]
		if v.catching && v.fetchID == 0 && !c.now.Before(v.retryAt) {
			c.issueFetch(v)
		}
	}
	for _, o := range c.ownList {
		if o.dirty && !c.now.Before(o.announceAt) {
			c.announce(o)
		}
	}
	if c.connected && !c.now.Before(c.nextHello) {
		c.heartbeat()
	}
	c.checkEstablished()
	return c.flush()
}

// Connected starts a new connection: the subscription is confirmed. It
// announces this instance, asks every writer for its position, and
// announces its own.
func (c *Core) Connected() []Action {
	c.connected, c.established = true, false
	clear(c.lost) // every channel is subscribed again
	for _, p := range c.peers {
		p.heard = c.now // silence counts from now
	}
	for _, v := range c.views {
		v.positioned = false
		v.awaited = (v.instance != "" || v.expected) && !v.suspect && v.instance != c.cfg.Instance
	}
	c.windowEnd = c.now.Add(c.cfg.ReplicateWait)
	c.writersEnd = c.now.Add(c.cfg.WriterWait)
	c.emit(Publish{&wire.HelloCmd{Instance: c.cfg.Instance, Hello: c.cfg.Hello}})
	c.emit(Publish{&wire.Replicate{Instance: c.cfg.Instance}})
	c.answerReplicate(nil)
	c.nextHello = c.now.Add(c.cfg.HeartbeatInterval)
	return c.flush()
}

// Disconnected ends the connection: anything published from now until the
// next Connected may be missed, and will be caught up then.
func (c *Core) Disconnected() []Action {
	c.connected = false
	if c.established {
		c.established = false
		c.emit(Established{false})
	}
	return c.flush()
}

// Shutdown says goodbye: peers drop this instance's ephemeral state.
func (c *Core) Shutdown() []Action {
	c.emit(Publish{&wire.Bye{Instance: c.cfg.Instance}})
	return c.flush()
}

// HeartbeatInterval is the configured heartbeat interval.
func (c *Core) HeartbeatInterval() time.Duration { return c.cfg.HeartbeatInterval }

// IsEstablished reports whether the connection is established.
func (c *Core) IsEstablished() bool { return c.established }

// Ready reports established and no writer catching up: what /readyz shows.
func (c *Core) Ready() bool {
	if !c.established {
		return false
	}
	for _, v := range c.views {
		if v.catching {
			return false
		}
	}
	return true
}

// NotReady says why the core is not ready, or "" if it is: not
// established, or the first writer (by key) catching up. Ready is the
// cheap test made on every input; this is for when it said no.
func (c *Core) NotReady() string {
	if len(c.lost) > 0 {
		return "resubscribing the channel of " + c.lostStreams()
	}
	if !c.established {
		return "not established"
	}
	for _, k := range c.sortedKeys() {
		if v := c.views[k]; v.catching {
			return fmt.Sprintf("catching up %s/%s from %d to %d (%s)", k.Stream, k.Writer, v.pos, v.to, v.why)
		}
	}
	return ""
}

// View is the delivered position of k and whether it is catching up.
func (c *Core) View(k Key) (pos int64, catching bool) {
	if v, ok := c.views[k]; ok {
		return v.pos, v.catching
	}
	return c.streams[k.Stream].Start, false
}

// ViewInfo is one writer's state, for status pages and metrics.
type ViewInfo struct {
	Key       Key
	Instance  string
	Pos       int64
	Announced int64
	Catching  bool
}

// Views lists every writer followed, by key.
func (c *Core) Views() []ViewInfo {
	out := make([]ViewInfo, 0, len(c.views))
	for _, k := range c.sortedKeys() {
		v := c.views[k]
		out = append(out, ViewInfo{Key: k, Instance: v.instance, Pos: v.pos, Announced: max(v.announced, v.pos), Catching: v.catching})
	}
	return out
}

func (c *Core) sortedKeys() []Key {
	keys := make([]Key, 0, len(c.views))
	for k := range c.views {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if a.Stream != b.Stream {
			return cmp.Compare(a.Stream, b.Stream)
		}
		return cmp.Compare(a.Writer, b.Writer)
	})
	return keys
}

// checkEstablished: after the REPLICATE window, once every writer heard
// from before has answered (or WriterWait passed) and none is catching up.
func (c *Core) checkEstablished() {
	if !c.connected || c.established || len(c.lost) > 0 || c.now.Before(c.windowEnd) {
		return
	}
	giveUp := !c.now.Before(c.writersEnd)
	for _, v := range c.views {
		if v.catching {
			return
		}
		if v.awaited && !v.positioned && !giveUp {
			return
		}
	}
	for _, v := range c.views {
		if v.awaited && !v.positioned {
			v.suspect = true
			c.note(NoteSuspect, v.key.Stream, "")
		}
		v.awaited = false
	}
	c.established = true
	c.emit(Established{true})
}
