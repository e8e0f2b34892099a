package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Generator hands out stream IDs for one stream and keeps this instance's
// view of every writer's position. It is safe for concurrent use.
//
// A writer allocates IDs with Alloc (or InTx), writes its rows, and
// finishes the allocation once its transaction has ended either way; its
// position then moves over every contiguous finished ID. A reader (opened
// with no writer name) only observes positions.
type Generator struct {
	db   DB
	cfg  Config
	self string
	id   WriterID

	mu       sync.Mutex
	tr       *Tracker
	counter  int64 // in-process streams: the last ID handed out
	names    map[WriterID]string
	ids      map[string]WriterID
	stored   []StoredPosition // the registry as last read, sealed writers included
	advanced chan struct{}
	changed  chan struct{} // positions or persisted-upto may have moved (Changed)
	watch    chan struct{} // closed at the next change (Watch); under mu
	capMu    sync.Mutex    // serialises RaiseCap
	lease    atomic.Pointer[Lease]
	reg      Registry // every writer with a stored position, and the cap
	marks    marks    // when this instance last wrote and pruned the stream's marks; under mu
	// seqBehind says why writes are refused: the sequence was set back
	// (SequenceBehind); nil while its last allocation was sound.
	seqBehind atomic.Pointer[string]
}

// Open loads a stream's positions and runs its startup checks. self is the
// writer name this instance writes the stream as, or "" for a reader.
//
// Loading reads stream_positions, then scans the stream's tables for rows
// of self above its stored position: a crash can leave committed rows that
// were never recorded there. Persisted-upto starts at the stored one
// (stream_persisted) or at what the positions read give, stored first,
// whichever is higher.
func Open(ctx context.Context, db DB, cfg Config, self string) (*Generator, error) {
	if err := Check(ctx, db, cfg); err != nil {
		return nil, err
	}
	g := &Generator{db: db, cfg: cfg, self: self, names: map[WriterID]string{}, ids: map[string]WriterID{}, advanced: make(chan struct{}, 1), changed: make(chan struct{}, 1), watch: make(chan struct{})}
	if self != "" {
		id, err := RegisterWriter(ctx, db, self)
		if err != nil {
			return nil, err
		}
		g.id = id
		g.names[id], g.ids[self] = self, id
	}
	if err := g.refreshNames(ctx); err != nil {
		return nil, err
	}
	// The sequence is read before the positions: a writer registered after
	// this read can only hold IDs above it, so capping persisted-upto at it
	// keeps unknown writers safe until the next Refresh.
	var seq int64
	if cfg.Sequence != "" {
		var err error
		if seq, err = sequenceValue(ctx, db, cfg.Sequence); err != nil {
			return nil, fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
		}
	}
	stored, sealed, err := loadPositions(ctx, db, cfg.Name)
	if err != nil {
		return nil, err
	}
	g.stored = storedList(stored, sealed)
	_, registered := stored[self]
	if self != "" {
		for _, t := range cfg.Tables {
			m, err := tableMax(ctx, db, t, self, stored[self])
			if err != nil {
				return nil, fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
			}
			stored[self] = max(stored[self], m)
		}
		if !registered && cfg.Sequence != "" {
			// A new writer owns no ID at or below the sequence value.
			stored[self] = max(stored[self], seq)
		}
	}
	if cfg.Sequence == "" {
		// In-process counter: start above every table and every stored
		// position, so a restart never reuses an ID (background/2). The
		// stream has one writer, so everything at or below is persisted.
		for _, p := range stored {
			g.counter = max(g.counter, p)
		}
		for _, t := range cfg.Tables {
			m, err := tableMax(ctx, db, t, "", g.counter)
			if err != nil {
				return nil, fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
			}
			g.counter = max(g.counter, m)
		}
		if self != "" {
			stored[self] = g.counter
		}
	}
	// Self is listed too: it registers before Open returns.
	if err := g.learnRegistry(ctx, seq, stored); err != nil {
		return nil, err
	}
	positions := make(map[WriterID]int64, len(stored))
	for n, p := range stored {
		if sealed[n] && n != self {
			continue
		}
		id, err := g.writerID(ctx, n)
		if err != nil {
			return nil, err
		}
		positions[id] = p
	}
	g.tr = NewTracker(g.id, positions)
	if cfg.Sequence != "" {
		g.tr.SetCap(seq)
	}
	floor, err := openPersisted(ctx, db, cfg.Name)
	if err != nil {
		return nil, err
	}
	g.tr.Stored(floor)
	if self != "" {
		// Register for the stream before the first allocation, so every
		// reader that loads positions from now on counts this writer.
		if err := g.SavePosition(ctx); err != nil {
			return nil, err
		}
	}
	if err := g.StorePersisted(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// loadPositions reads every writer's stored position on the stream, and
// which of those writers are sealed: a sealed writer's IDs are all
// persisted, so it no longer holds persisted-upto back.
func loadPositions(ctx context.Context, db DB, stream string) (stored map[string]int64, sealed map[string]bool, err error) {
	rows, err := db.Query(ctx, positionsSQL, stream)
	if err != nil {
		return nil, nil, fmt.Errorf("streams: stream %s: load positions: %w", stream, err)
	}
	if stored, sealed, err = scanPositions(rows); err != nil {
		return nil, nil, fmt.Errorf("streams: stream %s: load positions: %w", stream, err)
	}
	return stored, sealed, nil
}

// positionsSQL reads every writer's stored position on stream $1, and
// whether it is sealed.
const positionsSQL = `SELECT sp.writer, sp.position, COALESCE(w.sealed, false)
		FROM stream_positions sp LEFT JOIN weft_writers w ON w.name = sp.writer WHERE sp.stream = $1`

// scanPositions reads positionsSQL's rows.
func scanPositions(rows pgx.Rows) (stored map[string]int64, sealed map[string]bool, err error) {
	stored, sealed = map[string]int64{}, map[string]bool{}
	var name string
	var pos int64
	var isSealed bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &pos, &isSealed}, func() error {
		stored[name] = pos
		if isSealed {
			sealed[name] = true
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return stored, sealed, nil
}

// Refresh re-reads the sequence and then the stored writer positions: it
// learns writers that registered since the last read, stops counting
// writers that were sealed, and lifts the cap on persisted-upto to the
// sequence value read first. A sealed name that is claimed again comes
// back at its next Refresh; until then the cap keeps its new IDs safe.
// It then stores persisted-upto, which StoredUpto hands out from then
// on.
func (g *Generator) Refresh(ctx context.Context) error {
	if err := g.reread(ctx); err != nil {
		return err
	}
	return g.StorePersisted(ctx)
}

// RaiseCap re-reads the sequence and then the stored writer positions,
// as Refresh does, without storing persisted-upto: it lifts the cap on
// ComputedUpto to a sequence value read now, for a caller that heard
// positions above it (HeardUpto) and would otherwise wait for the next
// Refresh. Calls are serialised; one that finds ComputedUpto at or above
// want already (another call lifted it) reads nothing.
func (g *Generator) RaiseCap(ctx context.Context, want int64) error {
	g.capMu.Lock()
	defer g.capMu.Unlock()
	if g.ComputedUpto() >= want {
		return nil
	}
	return g.reread(ctx)
}

// HeardUpto is what ComputedUpto would be without the cap: the least
// position of the known writers (never below ComputedUpto). Above
// ComputedUpto, it says that positions heard since the last Refresh or
// RaiseCap show more may be persisted, which only a fresh read of the
// sequence and the registry can prove (a writer that registered since
// may hold an ID below it).
func (g *Generator) HeardUpto() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.Uncapped()
}

// reread is Refresh without the store.
func (g *Generator) reread(ctx context.Context) error {
	seq, stored, sealed, err := g.readSequenceAndPositions(ctx)
	if err != nil {
		return err
	}
	if err := g.learnRegistry(ctx, seq, stored); err != nil {
		return err
	}
	ids := make(map[WriterID]int64, len(stored))
	gone := map[WriterID]bool{}
	for n, p := range stored {
		id, err := g.writerID(ctx, n)
		if err != nil {
			return err
		}
		ids[id] = p
		gone[id] = sealed[n]
	}
	g.mu.Lock()
	g.stored = storedList(stored, sealed)
	for id, p := range ids {
		g.tr.Observe(id, p)
		if gone[id] {
			g.tr.RemoveWriter(id) // sealed: every ID it had is persisted
		}
	}
	if g.cfg.Sequence != "" {
		g.tr.SetCap(seq)
	}
	g.mu.Unlock()
	g.change()
	return nil
}

// batcher is a DB that pipelines statements (a pool or a connection).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// readSequenceAndPositions reads the sequence, then the stored writer
// positions, in one round trip when the DB pipelines: the server runs
// them in order, and at read committed the second statement's snapshot
// is taken after the first read the sequence.
func (g *Generator) readSequenceAndPositions(ctx context.Context) (seq int64, stored map[string]int64, sealed map[string]bool, err error) {
	b, ok := g.db.(batcher)
	if !ok || g.cfg.Sequence == "" {
		if g.cfg.Sequence != "" {
			if seq, err = sequenceValue(ctx, g.db, g.cfg.Sequence); err != nil {
				return 0, nil, nil, fmt.Errorf("streams: stream %s: refresh: %w", g.cfg.Name, err)
			}
		}
		stored, sealed, err = loadPositions(ctx, g.db, g.cfg.Name)
		return seq, stored, sealed, err
	}
	batch := &pgx.Batch{}
	batch.Queue("SELECT last_value, is_called FROM " + ident(g.cfg.Sequence)).QueryRow(func(r pgx.Row) error {
		var called bool
		if err := r.Scan(&seq, &called); err != nil {
			return fmt.Errorf("streams: stream %s: refresh: read sequence %s: %w", g.cfg.Name, g.cfg.Sequence, err)
		}
		if !called {
			seq--
		}
		return nil
	})
	batch.Queue(positionsSQL, g.cfg.Name).Query(func(rows pgx.Rows) error {
		var err error
		stored, sealed, err = scanPositions(rows)
		return err
	})
	if err := b.SendBatch(ctx, batch).Close(); err != nil {
		return 0, nil, nil, fmt.Errorf("streams: stream %s: refresh: %w", g.cfg.Name, err)
	}
	return seq, stored, sealed, nil
}

// StoredPosition is one writer's row in the stream's registry
// (stream_positions): every ID of the writer at or below Pos is persisted.
// A sealed writer will write nothing more; its Pos is final.
type StoredPosition struct {
	Name   string
	Pos    int64
	Sealed bool
}

// Stored lists every writer of the stream the registry held at the last
// Open or Refresh, sealed writers included, by name. Persisted-upto does
// not wait for a sealed writer, but its rows stay to be read: a reader
// that starts (or restarts) behind one learns here how far to fetch.
func (g *Generator) Stored() []StoredPosition {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.stored)
}

func storedList(stored map[string]int64, sealed map[string]bool) []StoredPosition {
	out := make([]StoredPosition, 0, len(stored))
	for n, p := range stored {
		out = append(out, StoredPosition{Name: n, Pos: p, Sealed: sealed[n]})
	}
	slices.SortFunc(out, func(a, b StoredPosition) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RegisterWriter maps a writer name to its small integer ID, creating it
// on first use.
func RegisterWriter(ctx context.Context, db DB, name string) (WriterID, error) {
	var id WriterID
	err := db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO weft_writers (name) VALUES ($1)
			ON CONFLICT (name) DO NOTHING RETURNING id
		)
		SELECT id FROM ins UNION ALL SELECT id FROM weft_writers WHERE name = $1
		LIMIT 1`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another session inserted it at the same moment: the statement's
		// snapshot predates that commit, which ON CONFLICT waited for.
		err = db.QueryRow(ctx, `SELECT id FROM weft_writers WHERE name = $1`, name).Scan(&id)
	}
	if err != nil {
		return 0, fmt.Errorf("streams: register writer %s: %w", name, err)
	}
	return id, nil
}

// DB is the database the generator reads and writes.
func (g *Generator) DB() DB { return g.db }

// Stream is the stream's configuration.
func (g *Generator) Stream() Config { return g.cfg }

// Self is the writer name, "" for a reader.
func (g *Generator) Self() string { return g.self }

// SelfID is the writer's small integer ID, 0 for a reader.
func (g *Generator) SelfID() WriterID { return g.id }

// Advanced signals (without blocking, coalesced) that the local writer's
// position moved, so an announcer can publish it.
func (g *Generator) Advanced() <-chan struct{} { return g.advanced }

// Allocation is a set of IDs whose transaction is in progress.
type Allocation struct {
	g    *Generator
	ids  []int64
	once sync.Once
	// open: a statement drew IDs that never came back (Pending); tk holds
	// the position at or below its floor until ResolvePending or Finish.
	open bool
	tk   Ticket
	// unreturned: IDs the table shows the statement wrote and it did not
	// return (AllocStatement).
	unreturned []int64
}

// IDs are the allocated stream IDs, ascending.
func (a *Allocation) IDs() []int64 { return a.ids }

// Unreturned are the IDs among IDs that the stream's tables show a
// statement wrote and that no statement returned: rows to deliver whose
// content the caller does not hold (readers fetch them).
func (a *Allocation) Unreturned() []int64 { return a.unreturned }

// Pending reports that the allocation's statement may have drawn IDs, and
// committed rows at them, that it never returned (its connection failed
// with the statement sent): the writer's position stays below them until
// ResolvePending reads them from the table.
func (a *Allocation) Pending() bool {
	a.g.mu.Lock()
	defer a.g.mu.Unlock()
	return a.open
}

// Finish records that the IDs' transaction ended, committed or rolled back:
// either way no row will appear at them later. On a pending allocation it
// says its statement is known not to have committed. It is idempotent.
func (a *Allocation) Finish() {
	a.once.Do(func() {
		a.g.mu.Lock()
		open := a.open
		if open {
			a.g.tr.AbortAlloc(a.tk)
			a.open = false
		}
		a.g.mu.Unlock()
		if !open {
			a.g.finish(a.ids)
		}
	})
}

// Alloc allocates n IDs in one round trip. The caller must Finish the
// allocation when the transaction that uses them ends. With a lease set,
// the caller's transaction must call the lease's Fence before it writes
// anything (InTx does this itself).
func (g *Generator) Alloc(ctx context.Context, n int) (*Allocation, error) {
	return g.alloc(ctx, g.db, n)
}

// AllocIn is Alloc on q: inside a transaction, the IDs come in the same
// round trips as the rest of it.
func (g *Generator) AllocIn(ctx context.Context, q DB, n int) (*Allocation, error) {
	return g.alloc(ctx, q, n)
}

func (g *Generator) alloc(ctx context.Context, q DB, n int) (*Allocation, error) {
	if g.id == 0 {
		return nil, fmt.Errorf("%w: stream %s", ErrNotWriter, g.cfg.Name)
	}
	if n < 1 {
		return nil, fmt.Errorf("streams: stream %s: allocate %d IDs: want at least 1", g.cfg.Name, n)
	}
	ids := make([]int64, n)
	if g.cfg.Sequence == "" {
		g.mu.Lock()
		tk := g.tr.BeginAlloc()
		for i := range ids {
			g.counter++
			ids[i] = g.counter
		}
		g.tr.Allocated(tk, ids...)
		g.mu.Unlock()
		return &Allocation{g: g, ids: ids}, nil
	}
	g.mu.Lock()
	tk := g.tr.BeginAlloc()
	g.mu.Unlock()
	var err error
	if n == 1 {
		err = q.QueryRow(ctx, "SELECT nextval($1::regclass)", g.cfg.Sequence).Scan(&ids[0])
	} else {
		var rows pgx.Rows
		rows, err = q.Query(ctx, "SELECT nextval($1::regclass) FROM generate_series(1, $2)", g.cfg.Sequence, n)
		if err == nil {
			i := 0
			var v int64
			_, err = pgx.ForEachRow(rows, []any{&v}, func() error {
				if i < n {
					ids[i] = v
				}
				i++
				return nil
			})
			if err == nil && i != n {
				err = fmt.Errorf("got %d IDs", i)
			}
		}
		slices.Sort(ids)
	}
	g.mu.Lock()
	floor := g.tr.tickets[tk.id]
	if err == nil {
		// The sequence itself handed these out: one at or below what was
		// known before it was asked means it was set back, and a row there
		// could commit below a position readers passed.
		if cerr := g.tr.CheckAllocated(tk, ids); cerr != nil {
			err = g.sequenceBehind(ids, floor, nil)
		}
	}
	if err != nil {
		g.tr.AbortAlloc(tk)
	} else {
		g.tr.Allocated(tk, ids...)
	}
	g.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("streams: stream %s: allocate %d IDs from %s: %w", g.cfg.Name, n, g.cfg.Sequence, err)
	}
	g.sequenceSound()
	return &Allocation{g: g, ids: ids}, nil
}

func (g *Generator) finish(ids []int64) {
	g.mu.Lock()
	moved, _ := g.tr.FinishAll(ids) // only IDs of this allocation: never unknown
	g.mu.Unlock()
	if moved {
		g.signal()
	}
}

// signal says the local writer's position moved (Advanced), and so may
// have persisted-upto (Changed).
func (g *Generator) signal() {
	select {
	case g.advanced <- struct{}{}:
	default:
	}
	g.change()
}

func (g *Generator) change() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
	g.mu.Lock()
	close(g.watch)
	g.watch = make(chan struct{})
	g.mu.Unlock()
}

// Watch returns a channel closed at the next change Changed would signal:
// unlike Changed, every caller hears it. Take it before reading what it
// guards (ComputedUpto), so a change in between is not missed.
func (g *Generator) Watch() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.watch
}

// Changed signals (without blocking, coalesced) that a position this
// generator tracks may have moved, and with it ComputedUpto: a follower
// of persisted-upto waits on it rather than poll.
func (g *Generator) Changed() <-chan struct{} { return g.changed }

// SetLease makes every InTx fence with l (the lease of this generator's
// writer name) before it allocates, so a sealed writer commits nothing.
func (g *Generator) SetLease(l *Lease) { g.lease.Store(l) }

// InTx allocates n IDs inside a new transaction, runs fn with them, and
// commits if fn returns nil, rolling back otherwise. The IDs finish when the
// transaction has ended, whichever way. With a lease set, the transaction
// first fences with it: a sealed writer gets an error wrapping ErrSealed.
// A COMMIT whose reply is lost is resolved before the IDs finish: once
// the server process that ran it has ended, a row at one of the IDs in
// the stream's tables means it committed (InTx returns nil), none that it
// did not.
func (g *Generator) InTx(ctx context.Context, n int, fn func(tx pgx.Tx, ids []int64) error) error {
	tx, err := g.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("streams: stream %s: begin: %w", g.cfg.Name, err)
	}
	if l := g.lease.Load(); l != nil {
		if err := l.Fence(ctx, tx); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("%w (stream %s)", err, g.cfg.Name)
		}
	}
	a, err := g.alloc(ctx, tx, n)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	defer a.Finish()
	if err := fn(tx, a.ids); err != nil {
		_ = tx.Rollback(ctx)
		return g.checkSequence(ctx, err, a.ids[0]-1)
	}
	if err := tx.Commit(ctx); err != nil {
		err = fmt.Errorf("streams: stream %s: commit: %w", g.cfg.Name, err)
		if !MayHaveCommitted(err) {
			return err
		}
		ctx := context.WithoutCancel(ctx)
		if werr := AwaitSessionEnd(ctx, g.db, tx.Conn().PgConn().PID(), time.Second); werr != nil {
			a.once.Do(func() {}) // outcome unknown: the IDs never finish here
			return fmt.Errorf("%w; its outcome is unknown: %w", err, werr)
		}
		found, cerr := g.Committed(ctx, g.db, a.ids)
		switch {
		case cerr != nil:
			a.once.Do(func() {})
			return fmt.Errorf("%w; its outcome is unknown: %w", err, cerr)
		case len(found) == 0:
			return err
		}
	}
	return nil
}

// Observe records a writer's announced position.
func (g *Generator) Observe(w WriterID, pos int64) {
	g.observe(func() { g.tr.Observe(w, pos) })
}

// ObservePersisted records that a row at pos is persisted.
func (g *Generator) ObservePersisted(pos int64) {
	g.observe(func() { g.tr.ObservePersisted(pos) })
}

// observe runs record, which updates the tracker, and wakes those who
// wait on it: with signal when it moved the local writer's position, else
// with change.
func (g *Generator) observe(record func()) {
	g.mu.Lock()
	before := g.tr.SelfPosition()
	record()
	moved := g.tr.SelfPosition() != before
	g.mu.Unlock()
	if moved {
		g.signal()
	} else {
		g.change()
	}
}

// Position is the local writer's position (0 for a reader).
func (g *Generator) Position() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.SelfPosition()
}

// WriterPosition is writer w's position as known here.
func (g *Generator) WriterPosition(w WriterID) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.Position(w)
}

// ComputedUpto is the persisted-upto this instance has computed from what
// it knows now: every ID at or below it is persisted. It never goes
// backwards in this instance and may be above StoredUpto, the value
// stored and handed out; an instance started later may compute less at
// first. A follower that keeps its own durable cursor (a consumer) reads
// up to it.
func (g *Generator) ComputedUpto() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.ComputedUpto()
}

// StoredUpto is the position at or below which every ID is persisted,
// as stored in the database (the stored persisted-upto): Open starts from the stored value and Refresh
// stores a higher one before it is handed out, so it never goes backwards,
// across restarts of any instance too. It moves when Refresh or
// StorePersisted stores it.
func (g *Generator) StoredUpto() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.StoredUpto()
}

// Token is the current view as a vector clock.
func (g *Generator) Token() Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tr.Token()
}

// SavePosition stores the local writer's position in stream_positions. The
// row only ever moves up, and an unchanged position writes nothing (no dead
// tuple).
func (g *Generator) SavePosition(ctx context.Context) error {
	if g.id == 0 {
		return fmt.Errorf("%w: stream %s", ErrNotWriter, g.cfg.Name)
	}
	pos := g.Position()
	_, err := g.db.Exec(ctx, `
		INSERT INTO stream_positions AS sp (stream, writer, position) VALUES ($1, $2, $3)
		ON CONFLICT (stream, writer) DO UPDATE SET position = EXCLUDED.position
		WHERE sp.position < EXCLUDED.position`, g.cfg.Name, g.self, pos)
	if err != nil {
		return fmt.Errorf("streams: stream %s: save position %d of %s: %w", g.cfg.Name, pos, g.self, err)
	}
	return nil
}

// WriterID resolves a writer name to its ID, from memory or the database.
func (g *Generator) WriterID(ctx context.Context, name string) (WriterID, error) {
	return g.writerID(ctx, name)
}

// KnownWriterID resolves a writer name from memory only: it never does I/O.
func (g *Generator) KnownWriterID(name string) (WriterID, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id, ok := g.ids[name]
	return id, ok
}

// Writers are the names of the writers the generator counts for
// persisted-upto (every unsealed writer with a stored position, and this
// one), sorted.
func (g *Generator) Writers() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for id := range g.tr.Writers() {
		if n, ok := g.names[id]; ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// WriterName is the name of writer w, if known.
func (g *Generator) WriterName(w WriterID) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, ok := g.names[w]
	return n, ok
}

func (g *Generator) writerID(ctx context.Context, name string) (WriterID, error) {
	g.mu.Lock()
	id, ok := g.ids[name]
	g.mu.Unlock()
	if ok {
		return id, nil
	}
	id, err := RegisterWriter(ctx, g.db, name)
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	g.ids[name], g.names[id] = id, name
	g.mu.Unlock()
	return id, nil
}

func (g *Generator) refreshNames(ctx context.Context) error {
	rows, err := g.db.Query(ctx, `SELECT id, name FROM weft_writers`)
	if err != nil {
		return fmt.Errorf("streams: load writers: %w", err)
	}
	var id WriterID
	var name string
	g.mu.Lock()
	defer g.mu.Unlock()
	_, err = pgx.ForEachRow(rows, []any{&id, &name}, func() error {
		g.ids[name], g.names[id] = id, name
		return nil
	})
	if err != nil {
		return fmt.Errorf("streams: load writers: %w", err)
	}
	return nil
}
