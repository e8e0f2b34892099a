package rooms

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/streams"
)

// syncPage bounds the events one sync returns per writer.
const syncPage = 500

type syncResp struct {
	Rooms  map[string]roomEvents `json:"rooms"`
	Typing map[string][]string   `json:"typing"`
	// TypingLimited: the typing of some rooms did not fit the answer.
	TypingLimited bool `json:"typing_limited,omitempty"`
	// Limited: the answer stopped at its byte budget or page, and more
	// events may follow next_batch: sync again at once.
	Limited   bool   `json:"limited,omitempty"`
	NextBatch string `json:"next_batch"`
}

// syncAnswer is a sync answer before it is written.
type syncAnswer struct {
	events  map[string][]json.RawMessage
	next    streams.Token
	limited bool
	typing  typingAnswer
}

type roomEvents struct {
	Events []json.RawMessage `json:"events"`
}

// currentToken is this instance's view of the events stream as a token,
// and the writer registry it was built from: each writer the registry
// lists is at its delivered position (rows at or below it have committed,
// so the database answers exactly for it), and the minimum stays at or
// below the registry's cap, so a writer this instance has not read of yet
// is never passed over (streams.Registry.Token).
func (s *Service) currentToken() (streams.Token, streams.Registry) {
	reg := s.events.Registry()
	return reg.Token(s.views(reg)), reg
}

// views are this instance's delivered positions of the registry's writers.
func (s *Service) views(reg streams.Registry) map[streams.WriterID]int64 {
	views := make(map[streams.WriterID]int64, reg.Len())
	for w := range reg.All() {
		views[w.ID] = s.node.View(core.Key{Stream: EventsStream, Writer: w.Name})
	}
	return views
}

// MaxSyncRooms bounds the rooms one sync names, and so what a waiting
// long-poll holds: an index entry per room, beside its request (at most
// the server's header limit).
const MaxSyncRooms = 100

// syncParams is a checked sync query.
type syncParams struct {
	timeout  time.Duration
	rooms    []string // nil: every room
	since    streams.Token
	hasSince bool // false: an initial sync
}

// paramError is a bad client parameter: a 400 naming it.
type paramError struct {
	field, reason string
}

func (e *paramError) Error() string { return e.field + ": " + e.reason }

// parseSync checks the sync query, touching nothing else, so that bad
// input is a 400 whatever the state of the instance.
func parseSync(q url.Values) (syncParams, *paramError) {
	var p syncParams
	var err error
	// A parameter given twice would be read as its first value, and a
	// since moved past the events of rooms named the second time would
	// lose them for good.
	for _, field := range []string{"timeout_ms", "rooms", "since"} {
		if len(q[field]) > 1 {
			return p, &paramError{field, "given more than once (list rooms comma-separated)"}
		}
	}
	if p.timeout, err = parseTimeout(q.Get("timeout_ms")); err != nil {
		return p, &paramError{"timeout_ms", err.Error()}
	}
	if v := q.Get("rooms"); v != "" {
		// Counted before anything is allocated per room: a waiting sync
		// holds an index entry per room for up to 120 s.
		if n := strings.Count(v, ",") + 1; n > MaxSyncRooms {
			return p, &paramError{"rooms", fmt.Sprintf("%d rooms: at most %d per sync (omit rooms to follow every room)", n, MaxSyncRooms)}
		}
		for _, room := range strings.Split(v, ",") {
			if !roomRE.MatchString(room) {
				return p, &paramError{"rooms", fmt.Sprintf("room %.64q: want 1-255 of [A-Za-z0-9!:._@#-]", room)}
			}
			// A copy of each name, not the whole list's: a long-poll's
			// rooms key Live's index, where another long-poll on the room
			// may keep them long after this one ended.
			p.rooms = append(p.rooms, strings.Clone(room))
		}
	}
	if v := q.Get("since"); v != "" {
		if p.since, err = streams.ParseToken(v); err != nil {
			return p, &paramError{"since", err.Error()}
		}
		p.hasSince = true
	}
	return p, nil
}

func (s *Service) sync(w http.ResponseWriter, r *http.Request) {
	p, bad := parseSync(r.URL.Query())
	if bad != nil {
		badRequest(w, bad.field, "%s", bad.reason)
		return
	}
	// Every sync holds a slot while it lasts, whether it waits or not:
	// one that answers at once reads and writes as much as one that
	// waited.
	if !s.polls.acquire() {
		s.busy(w)
		return
	}
	defer s.polls.release()
	rooms := p.rooms
	ctx := r.Context()
	if !p.hasSince {
		// An initial sync returns the current token and typing at once.
		if !s.answers.acquire(ctx) {
			return // the client left
		}
		defer s.answers.release()
		cur, _ := s.currentToken()
		s.writeSync(w, syncAnswer{next: cur, typing: s.syncTyping(rooms, typingWake{}, true)})
		return
	}
	cur, _ := s.currentToken()
	// A token may be ahead of this instance: a client behind a load
	// balancer got it from an instance further along. It is used as it is:
	// eventsBetween returns nothing for a writer this instance has not
	// reached yet and keeps the token's position for it, so the answer
	// neither repeats events the client has nor moves its token backwards
	// (clamping it to this instance's view did both). Only a token beyond
	// every ID the sequence handed out is refused: no instance made it.
	since := p.since
	if !since.LessOrEqual(cur) {
		if bad, err := s.beyondStream(ctx, since); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
			return
		} else if bad != "" {
			badRequest(w, "since", "%s", bad)
			return
		}
	}
	s.poll(ctx, w, rooms, since, p.timeout)
}

// poll answers the events of rooms after since, waiting up to timeout for
// some, and returns early when typing in rooms changes. It registers with
// Live before its first read; from then on every row of its rooms wakes it
// with the position its views must reach before it reads again (the
// fabric applies a row before its view moves past it), so no row slips
// between a read and the wait. Rows of other rooms never wake it: an idle
// long-poll costs no SQL however busy the instance.
func (s *Service) poll(ctx context.Context, w http.ResponseWriter, rooms []string, since streams.Token, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	var wt *waiter
	var needs []viewNeed
	var typing typingWake
	if timeout > 0 {
		wt = s.live.watch(rooms)
		defer s.live.unwatch(wt)
		// Rows applied but perhaps not in the views yet, and whatever
		// changed since watch.
		needs, typing = s.live.takeAll(wt)
	}
	for {
		if !s.waitViews(ctx, deadline, needs) {
			return // the client left
		}
		if !s.answers.acquire(ctx) {
			return
		}
		ty := s.syncTyping(rooms, typing, false)
		cur, reg := s.currentToken()
		ans, err := s.eventsBetween(ctx, since, cur, reg, rooms, s.maxBytes-ty.bytes-syncEnvelopeBytes(since, reg.Len()))
		if err != nil {
			s.answers.release()
			writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
			return
		}
		wait := time.Until(deadline)
		if len(ans.events) > 0 || typing.any || wait <= 0 || s.closed() {
			ans.typing = ty
			s.writeSync(w, ans)
			s.answers.release()
			return
		}
		s.answers.release()
		since = ans.next
		timer := time.NewTimer(wait)
		select {
		case <-wt.ch:
		case <-timer.C:
		case <-s.closeCtx.Done(): // answer with what there is
		case <-ctx.Done():
			timer.Stop()
			return
		}
		timer.Stop()
		needs, typing = s.live.takeAll(wt)
		if typing.any && len(needs) == 0 {
			// Only typing changed: the read above still holds.
			if !s.answers.acquire(ctx) {
				return
			}
			defer s.answers.release()
			s.writeSync(w, syncAnswer{next: since, typing: s.syncTyping(rooms, typing, false)})
			return
		}
	}
}

// waitViews waits until the views cover needs, or until the deadline (the
// read then answers with what is there). It reports false when the client
// left.
func (s *Service) waitViews(ctx context.Context, deadline time.Time, needs []viewNeed) bool {
	var wctx context.Context
	for _, n := range needs {
		if s.node.View(n.key) >= n.pos {
			continue // the usual case: the view moved on right after Apply
		}
		if wctx == nil {
			var cancel context.CancelFunc
			wctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
			defer context.AfterFunc(s.closeCtx, cancel)() // Close: answer now
		}
		if s.node.WaitFor(wctx, n.key, n.pos) != nil {
			break
		}
	}
	return ctx.Err() == nil
}

// DefaultMaxLongPolls is Config.MaxLongPolls' default.
const DefaultMaxLongPolls = 10000

// pollGate caps the syncs and state reads in progress at once on an
// instance, waiting or not.
type pollGate struct {
	max      int64
	active   atomic.Int64
	rejected atomic.Uint64
}

func (g *pollGate) acquire() bool {
	if g.active.Add(1) > g.max {
		g.active.Add(-1)
		g.rejected.Add(1)
		return false
	}
	return true
}

func (g *pollGate) release() { g.active.Add(-1) }

// LongPollStats is what Service.LongPolls reports.
type LongPollStats struct {
	Active   int64  // syncs and state reads in progress now
	Max      int64  // the cap (Config.MaxLongPolls)
	Rejected uint64 // answered 503 for the cap since the start
}

// LongPolls reports the long-polls of this instance, for metrics.
func (s *Service) LongPolls() LongPollStats {
	return LongPollStats{Active: s.polls.active.Load(), Max: s.polls.max, Rejected: s.polls.rejected.Load()}
}

// busy answers 503: the instance serves as many syncs and state reads
// as it may at once.
func (s *Service) busy(w http.ResponseWriter) {
	unavailable(w, fmt.Sprintf("%d syncs and state reads are in progress on this instance, the most it serves at once: retry later or on another instance", s.polls.max))
}

// syncTyping is the typing part of a sync answer: for named rooms their
// typing now, for a sync of every room the typing of the rooms whose
// typing changed while it waited (an initial one: of any rooms), never
// the whole table; at most half the answer's budget.
func (s *Service) syncTyping(rooms []string, changed typingWake, initial bool) typingAnswer {
	budget := s.maxBytes / 2
	switch {
	case rooms != nil:
		return s.live.typingOf(rooms, false, budget)
	case initial:
		return s.live.typingAny(budget)
	}
	t := s.live.typingOf(changed.rooms, true, budget)
	t.limited = t.limited || changed.limited
	return t
}

func (s *Service) writeSync(w http.ResponseWriter, a syncAnswer) {
	resp := syncResp{Rooms: map[string]roomEvents{}, Typing: a.typing.rooms, TypingLimited: a.typing.limited,
		Limited: a.limited, NextBatch: a.next.String()}
	if resp.Typing == nil {
		resp.Typing = map[string][]string{}
	}
	for room, evs := range a.events {
		resp.Rooms[room] = roomEvents{Events: evs}
	}
	s.writeAnswer(w, resp)
}

// roomEvent is one event row read by sync.
type roomEvent struct {
	pos  int64
	room string
	ev   json.RawMessage
}

// eventsBetween reads every event in (since, upto] per writer of reg, for
// the rooms (all when nil); upto is reg's token of this instance's views,
// so every row in it has committed. A writer with more than a page (of
// rows, or of budget bytes as the answer writes them) stops at its last
// event returned, and the answer stops there for every writer
// (mergePages), or lower to fit budget (byteCut, never below one event):
// next says where to go on. next holds since, so it never
// goes backwards, and a writer reg does not list stays at since's position
// or below reg's cap, under any row it holds. With a read replica, a
// writer's range is read there as far as the replica holds it and the
// rest on the primary (catchup.ReadRouter).
func (s *Service) eventsBetween(ctx context.Context, since, upto streams.Token, reg streams.Registry, rooms []string, budget int) (syncAnswer, error) {
	pages := make([]writerPage, 0, reg.Len())
	for w := range reg.All() {
		id, wname := w.ID, w.Name
		pg := writerPage{id: id, name: wname, from: since.Get(id), to: upto.Get(id)}
		if pg.to > pg.from {
			var err error
			read := func(q catchup.Querier, from, to int64) (more bool, err error) {
				return readPage(ctx, q, &pg, from, to, rooms, budget)
			}
			if s.reads != nil {
				err = s.reads.Read(ctx, EventsStream, wname, pg.from, pg.to, read)
			} else {
				_, err = read(s.pool, pg.from, pg.to)
			}
			if err != nil {
				return syncAnswer{}, fmt.Errorf("rooms: sync read: writer %s (%d, %d]: %w", wname, pg.from, pg.to, err)
			}
			pg.full = len(pg.rows) == syncPage || pg.bytes >= budget
		}
		pages = append(pages, pg)
	}
	out, held, err := mergeSeen(pages, byteCut(pages, pageCut(pages), budget), func(held map[streams.WriterID]int64, hi int64, rooms []string) (int64, error) {
		return s.firstUnseen(ctx, pages, held, hi, rooms)
	})
	if err != nil {
		return syncAnswer{}, err
	}
	limited := false
	for _, pg := range pages {
		limited = limited || held[pg.id] < pg.to
	}
	return syncAnswer{events: out, next: streams.Merge(since, reg.Token(held)), limited: limited}, nil
}

// readPage reads pg's writer's events in (from, to] into pg, in chunks
// sized to end near budget bytes (a page of large events reads a few
// more rows than it keeps, not syncPage of them), until the range ends
// (more: the rest is to be read elsewhere, catchup.ReadRouter), or
// syncPage rows or budget bytes are read.
func readPage(ctx context.Context, q catchup.Querier, pg *writerPage, from, to int64, rooms []string, budget int) (more bool, err error) {
	for {
		lim := 16
		if n := len(pg.rows); n > 0 {
			lim = (budget-pg.bytes)/max(pg.bytes/n, 1) + 1
		}
		lim = max(1, min(lim, syncPage-len(pg.rows)))
		var rows pgx.Rows
		if rooms == nil {
			rows, err = q.Query(ctx, `SELECT stream_id, room, rows->0 FROM events WHERE writer = $1 AND stream_id > $2 AND stream_id <= $3 ORDER BY stream_id LIMIT $4`,
				pg.name, from, to, lim)
		} else {
			rows, err = q.Query(ctx, `SELECT stream_id, room, rows->0 FROM events WHERE writer = $1 AND stream_id > $2 AND stream_id <= $3 AND room = ANY($5) ORDER BY stream_id LIMIT $4`,
				pg.name, from, to, lim, rooms)
		}
		if err != nil {
			return false, err
		}
		var e roomEvent
		got := 0
		_, err = pgx.ForEachRow(rows, []any{&e.pos, &e.room, &e.ev}, func() error {
			ev := compactEvent(e.ev)
			pg.rows = append(pg.rows, roomEvent{pos: e.pos, room: e.room, ev: ev})
			got++
			// An upper bound: as if each event were its room's first.
			if pg.bytes += eventBytes(ev) + roomBytes(e.room); pg.bytes >= budget {
				return errPageFull
			}
			return nil
		})
		switch {
		case errors.Is(err, errPageFull):
			return false, nil
		case err != nil:
			return false, err
		case len(pg.rows) == syncPage:
			return false, nil
		case got < lim:
			// Short of a page: the rest of the range, from the primary
			// if the replica held only part of it. A long-poll must not
			// stop at the replica's bound: nothing would wake it for
			// rows already applied.
			return true, nil
		}
		from = pg.rows[len(pg.rows)-1].pos
	}
}

// errPageFull stops a writer's read at its byte budget.
var errPageFull = errors.New("rooms: sync read: page full")

// byteCut lowers cut (pageCut's) so that the events at or below it, in
// stream order, fit in budget bytes as an answer writes them; it never
// goes below the first event, so paging always moves on, and never above
// cut.
func byteCut(pages []writerPage, cut int64, budget int) int64 {
	var rows []roomEvent
	for _, pg := range pages {
		for _, e := range pg.rows {
			if e.pos > cut {
				break
			}
			rows = append(rows, e)
		}
	}
	slices.SortFunc(rows, func(a, b roomEvent) int { return cmp.Compare(a.pos, b.pos) })
	seen := map[string]bool{}
	total := 0
	for i, e := range rows {
		n := eventBytes(e.ev)
		if !seen[e.room] {
			n += roomBytes(e.room)
		}
		if i > 0 && total+n > budget {
			return rows[i-1].pos
		}
		seen[e.room] = true
		total += n
	}
	return cut
}

// unseenFunc returns the lowest position above held[w] and at most hi of
// a committed row of a writer w of rooms that this instance's views have
// not reached (held[w] < hi), or 0 when there is none.
type unseenFunc func(held map[streams.WriterID]int64, hi int64, rooms []string) (int64, error)

// mergeSeen is mergePages at cut, lowered below any row of a room in the
// answer that another writer committed and this instance has not seen
// yet: a room that moved from writer A to B holds A's rows below B's, and
// if A's last ones have not reached this instance's view (a Redis
// message lost and not repaired yet, say) the answer must not carry B's.
// It waits for them instead (the view moves on within a gap repair, and
// every row applied wakes the long-polls of its room). One statement, on
// the rooms of the answer only; it finds nothing unless a room moved.
func mergeSeen(pages []writerPage, cut int64, unseen unseenFunc) (map[string][]json.RawMessage, map[streams.WriterID]int64, error) {
	out, held, hi, rooms := mergePages(pages, cut)
	if len(rooms) == 0 {
		return out, held, nil
	}
	lagging := false
	for _, h := range held {
		lagging = lagging || h < hi
	}
	if !lagging {
		return out, held, nil
	}
	q, err := unseen(held, hi, rooms)
	if err != nil || q == 0 {
		return out, held, err
	}
	out, held, _, _ = mergePages(pages, q-1)
	return out, held, nil
}

// firstUnseen is the unseenFunc of a sync read: from the primary, where
// rows commit.
func (s *Service) firstUnseen(ctx context.Context, pages []writerPage, held map[streams.WriterID]int64, hi int64, rooms []string) (int64, error) {
	var names []string
	var after []int64
	for _, pg := range pages {
		if h := held[pg.id]; h < hi {
			names, after = append(names, pg.name), append(after, h)
		}
	}
	var q *int64
	err := s.pool.QueryRow(ctx, `SELECT min(e.stream_id) FROM unnest($1::text[], $2::bigint[]) AS u(writer, after)
		JOIN events e ON e.writer = u.writer AND e.stream_id > u.after AND e.stream_id <= $3 WHERE e.room = ANY($4)`,
		names, after, hi, rooms).Scan(&q)
	if err != nil {
		return 0, fmt.Errorf("rooms: sync read: rows not seen yet below %d: %w", hi, err)
	}
	if q == nil {
		return 0, nil
	}
	return *q, nil
}

// writerPage is what a sync read of one writer's range (from, to] found:
// its rows in stream order, and whether they filled a page (more may
// follow).
type writerPage struct {
	id       streams.WriterID
	name     string
	from, to int64
	rows     []roomEvent
	bytes    int // the rows' size in an answer, at most
	full     bool
}

// pageCut is where an answer of pages ends: the lowest last position of
// the pages that filled up (more may follow them), or MaxInt64.
func pageCut(pages []writerPage) int64 {
	cut := int64(math.MaxInt64)
	for _, pg := range pages {
		if pg.full {
			cut = min(cut, pg.rows[len(pg.rows)-1].pos)
		}
	}
	return cut
}

// mergePages makes one answer of the writers' pages, up to cut: each
// room's events in stream order, where each writer's token goes, the
// highest position answered and the rooms answered. A room that moved
// between writers holds rows of several of them; positions come from one
// sequence and a room's new owner writes only after its old one
// finished, so stream order is the room's write order. Cut at pageCut, a
// writer read further gives back its rows above cut for the next page, so
// no page carries a room's later event while an earlier one of another
// writer waits for a later page. Every writer still reaches past its
// from, or the page that set cut does, so paging always moves on.
func mergePages(pages []writerPage, cut int64) (map[string][]json.RawMessage, map[streams.WriterID]int64, int64, []string) {
	held := make(map[streams.WriterID]int64, len(pages))
	var kept []roomEvent
	for _, pg := range pages {
		held[pg.id] = max(pg.from, min(pg.to, cut))
		for _, e := range pg.rows {
			if e.pos > cut {
				break
			}
			kept = append(kept, e)
		}
	}
	slices.SortFunc(kept, func(a, b roomEvent) int { return cmp.Compare(a.pos, b.pos) })
	out := map[string][]json.RawMessage{}
	var hi int64
	var rooms []string
	for _, e := range kept {
		if _, ok := out[e.room]; !ok {
			rooms = append(rooms, e.room)
		}
		out[e.room] = append(out[e.room], e.ev)
		hi = e.pos
	}
	return out, held, hi, rooms
}

// beyondStream says why a token ahead of this instance cannot have come
// from any instance: a position above every ID the sequence has handed
// out. Only such a token is refused; one merely ahead of this instance is
// served as the instance catches up.
func (s *Service) beyondStream(ctx context.Context, t streams.Token) (string, error) {
	var last int64
	if err := s.pool.QueryRow(ctx, `SELECT last_value FROM `+Events().Sequence).Scan(&last); err != nil {
		return "", fmt.Errorf("rooms: read %s: %w", Events().Sequence, err)
	}
	if m := t.Max(); m > last {
		return fmt.Sprintf("token %s is ahead of the stream: position %d was never handed out (the sequence is at %d)", t, m, last), nil
	}
	return "", nil
}

// closed reports whether Close was called.
func (s *Service) closed() bool { return s.closeCtx.Err() != nil }
