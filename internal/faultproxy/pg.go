package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Fault is what a Rule does to the connection it fires on. Each keeps an
// answer from the client at a moment it cannot tell apart from a network
// failure; they differ in what the server has done by then, and in
// whether the connection is lost (the cuts) or left hanging (the hold).
type Fault int

const (
	// CutBeforeCommit closes the connection instead of sending the COMMIT
	// on: the server never sees it and rolls the transaction back.
	CutBeforeCommit Fault = iota + 1
	// CutAfterCommit sends the COMMIT on, and when the server's answer to
	// it arrives (its CommandComplete, or an ErrorResponse), drops that
	// answer and closes: the server has committed (unless the transaction
	// had failed, and COMMIT rolled it back), the client hears only that
	// the connection is gone.
	CutAfterCommit
	// CutAfterSync lets a matching statement run and, when the server
	// ends the unit it ran in (the simple Query, or the extended-protocol
	// messages up to their Sync) with ReadyForQuery, closes. Every answer
	// of that unit from the matching statement's on, ReadyForQuery
	// included, is dropped. Outside a transaction block the unit is an
	// implicit transaction, which the server has committed by then: a
	// pgx.Batch sent on a pool, or a lone autocommit statement.
	CutAfterSync
	// HoldAfterCommit is CutAfterCommit without the cut: the server's
	// answer to the COMMIT, and everything after it, is held from the
	// client, and the connection stays open. The server has committed
	// (unless the transaction had failed); the client waits for an answer
	// that never comes, as a process stopped between its COMMIT and
	// hearing of it would. The connection ends when the client closes it
	// (a test killed the client, say) or the proxy closes. PGStats.Holds
	// counts the answers held: once it has moved, the server has answered.
	HoldAfterCommit
	// FreezeAtRows lets a matching statement run and, when the first row
	// of its answer (a DataRow) arrives, freezes the whole proxy: from
	// then on no byte moves on any of its connections, either way, open
	// or new, and none is closed. The clients and the server see a
	// network gone silent mid-answer, as a process stopped with SIGSTOP
	// or a black-holed link looks: the server's backend sends on until
	// the buffers between fill (SetUpstreamReadBuffer keeps the proxy's
	// small), then waits on the client. Close ends it; PGStats.Frozen
	// says it happened.
	FreezeAtRows

	nFaults = iota + 1
)

func (f Fault) String() string {
	switch f {
	case CutBeforeCommit:
		return "CutBeforeCommit"
	case CutAfterCommit:
		return "CutAfterCommit"
	case CutAfterSync:
		return "CutAfterSync"
	case HoldAfterCommit:
		return "HoldAfterCommit"
	case FreezeAtRows:
		return "FreezeAtRows"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// commit reports whether the fault fires on COMMITs rather than on
// statements.
func (f Fault) commit() bool {
	return f == CutBeforeCommit || f == CutAfterCommit || f == HoldAfterCommit
}

// Rule says when a PGProxy loses a connection. A rule fires on an
// occasion: for the commit faults, a COMMIT (or END) statement about to be
// sent, simple or extended protocol; for CutAfterSync, any statement about
// to be sent. Statements sent by name (a Bind and Execute of a statement
// prepared earlier, as pgx's statement cache does) are known by the SQL
// their Parse gave.
type Rule struct {
	Fault Fault
	// Match narrows the occasions. For the commit faults: a substring of
	// some statement the transaction ran since its BEGIN; for
	// CutAfterSync: a substring of the statement. "" matches every
	// occasion.
	Match string
	// Times is how many times the rule fires at most; 0 means once, a
	// negative number without limit.
	Times int
	// Prob is the chance that a matching occasion fires the rule; 0 means
	// 1. The draws come from a generator seeded with Seed, so the n-th
	// matching occasion fires or not the same way in every run.
	Prob float64
	Seed uint64
}

func (r Rule) validate() error {
	switch {
	case r.Fault <= 0 || r.Fault >= nFaults:
		return fmt.Errorf("faultproxy: Rule.Fault: unknown fault %d", int(r.Fault))
	case math.IsNaN(r.Prob) || r.Prob < 0 || r.Prob > 1:
		return fmt.Errorf("faultproxy: Rule.Prob: %v is not in [0, 1]", r.Prob)
	}
	return nil
}

// Armed is a rule in force on a PGProxy. Its methods are safe for
// concurrent use.
type Armed struct {
	p    *PGProxy
	rule Rule

	mu    sync.Mutex
	rng   *rand.Rand // nil when every occasion fires
	fired int
	off   bool
}

// Fired is how many times the rule has fired. The cut itself follows when
// the connection gets there (for CutAfterCommit, when the server
// answers); PGStats.Cuts counts cuts done.
func (a *Armed) Fired() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fired
}

// Disarm stops the rule from firing again. A cut it has already decided
// still happens.
func (a *Armed) Disarm() {
	a.mu.Lock()
	a.off = true
	a.mu.Unlock()
	a.p.prune()
}

// fire decides one matching occasion.
func (a *Armed) fire() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spent() {
		return false
	}
	if a.rng != nil && a.rng.Float64() >= a.rule.Prob {
		return false
	}
	a.fired++
	return true
}

func (a *Armed) spent() bool {
	return a.off || (a.rule.Times >= 0 && a.fired >= max(a.rule.Times, 1))
}

// matches reports whether an occasion is one the rule is for: a COMMIT
// in a transaction that ran the statements tx, or the statement stmt.
func (a *Armed) matches(commit bool, stmt string, tx map[string]struct{}) bool {
	if a.rule.Fault.commit() != commit {
		return false
	}
	if !commit || a.rule.Match == "" {
		return strings.Contains(stmt, a.rule.Match)
	}
	for s := range tx {
		if strings.Contains(s, a.rule.Match) {
			return true
		}
	}
	return false
}

// PGStats are a PGProxy's counters since StartPG.
type PGStats struct {
	ConnStats
	// Cuts counts the connections each fault closed (none for
	// HoldAfterCommit, which leaves them to the client).
	Cuts map[Fault]int64
	// Holds counts the COMMIT answers HoldAfterCommit kept from the
	// client: each had arrived from the server.
	Holds int64
	// Frozen: a FreezeAtRows rule froze the proxy.
	Frozen bool
	// FromClient and FromServer count the messages seen in each
	// direction by name ("Query", "Parse", "Bind", "Execute", "Sync",
	// "CommandComplete", "ReadyForQuery", ...; the untyped first messages
	// as "StartupMessage", "SSLRequest", "GSSENCRequest",
	// "CancelRequest"). Dropped messages count too.
	FromClient, FromServer map[string]int64
	// Dropped counts the server's messages a cut or a hold kept from the
	// client (of a hold, the first only: it reads no further).
	Dropped int64
	// ProtoErrors counts connections closed because a side sent bytes
	// that are not the PostgreSQL protocol v3.
	ProtoErrors int64
}

// PGProxy is a running fault-injecting proxy for PostgreSQL. Its methods
// are safe for concurrent use.
//
// It answers a client's SSLRequest and GSSENCRequest with 'N' itself, so
// the client goes on in plain text whatever its sslmode allows; a client
// that requires TLS cannot use it.
type PGProxy struct {
	base

	frozen     chan struct{} // closed by a FreezeAtRows rule
	freezeOnce sync.Once

	rmu   sync.Mutex               // serialises changes to rules
	rules atomic.Pointer[[]*Armed] // in force, in arming order; replaced, never changed

	stats struct {
		cuts           [nFaults]atomic.Int64
		client, server [256]atomic.Int64
		startup        [nStartupKinds]atomic.Int64
		dropped        atomic.Int64
		holds          atomic.Int64
		protoErrors    atomic.Int64
	}
}

// StartPG listens on a free port of 127.0.0.1 and proxies every accepted
// connection to the PostgreSQL server at target (host:port). The proxy
// stops when ctx is cancelled or Close is called; Close must be called
// either way to wait for its goroutines.
//
// A test that loses the answer to one COMMIT of the transaction that
// inserts into events:
//
//	p, err := faultproxy.StartPG(ctx, "127.0.0.1:5432")
//	if err != nil { ... }
//	defer p.Close()
//	through, err := p.URL(dbURL) // dbURL with the proxy's host:port
//	pool, err := pgxpool.New(ctx, through)
//	...
//	cut, err := p.Arm(faultproxy.Rule{Fault: faultproxy.CutAfterCommit, Match: "INSERT INTO events"})
//	...
//	// tx.Commit(ctx) fails with a lost connection; the row is committed.
//	if cut.Fired() != 1 || p.Stats().Cuts[faultproxy.CutAfterCommit] != 1 { ... }
func StartPG(ctx context.Context, target string) (*PGProxy, error) {
	p := &PGProxy{frozen: make(chan struct{})}
	p.rules.Store(&[]*Armed{})
	if err := p.start(ctx, "postgres", target, p.serve); err != nil {
		return nil, err
	}
	return p, nil
}

// URL returns dbURL, a postgres:// URL of the proxy's target, with its
// host and port replaced by the proxy's, for a client to connect through
// the proxy.
func (p *PGProxy) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("faultproxy: database URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", errors.New("faultproxy: database URL: not a postgres:// URL")
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// Arm puts a rule in force on every connection, open or new, from the
// next message the proxy reads. Rules fire in the order they were armed;
// at most one fires per unit (a simple Query, or the extended-protocol
// messages up to a Sync), and a connection that one fired on is lost.
func (p *PGProxy) Arm(r Rule) (*Armed, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	a := &Armed{p: p, rule: r}
	if r.Prob != 0 && r.Prob != 1 {
		a.rng = rand.New(rand.NewPCG(r.Seed, r.Seed^0x9e3779b97f4a7c15))
	}
	p.rmu.Lock()
	defer p.rmu.Unlock()
	rules := slices.DeleteFunc(slices.Clone(*p.rules.Load()), (*Armed).isSpent)
	rules = append(rules, a)
	p.rules.Store(&rules)
	return a, nil
}

func (a *Armed) isSpent() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spent()
}

// prune drops disarmed and spent rules.
func (p *PGProxy) prune() {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	rules := slices.DeleteFunc(slices.Clone(*p.rules.Load()), (*Armed).isSpent)
	p.rules.Store(&rules)
}

// fire returns the first rule in force that matches an occasion and fires
// on it, or nil.
func (p *PGProxy) fire(commit bool, stmt string, tx map[string]struct{}) *Armed {
	for _, a := range *p.rules.Load() {
		if a.matches(commit, stmt, tx) && a.fire() {
			return a
		}
	}
	return nil
}

// Stats returns the counters.
func (p *PGProxy) Stats() PGStats {
	st := PGStats{
		ConnStats:   p.connStats(),
		Cuts:        make(map[Fault]int64, nFaults-1),
		FromClient:  make(map[string]int64),
		FromServer:  make(map[string]int64),
		Dropped:     p.stats.dropped.Load(),
		Holds:       p.stats.holds.Load(),
		Frozen:      p.isFrozen(),
		ProtoErrors: p.stats.protoErrors.Load(),
	}
	for f := CutBeforeCommit; f < nFaults; f++ {
		st.Cuts[f] = p.stats.cuts[f].Load()
	}
	for i := range 256 {
		if n := p.stats.client[i].Load(); n > 0 {
			st.FromClient[msgName(clientMsgNames, byte(i))] = n
		}
		if n := p.stats.server[i].Load(); n > 0 {
			st.FromServer[msgName(serverMsgNames, byte(i))] = n
		}
	}
	for k, name := range startupNames {
		if n := p.stats.startup[k].Load(); n > 0 {
			st.FromClient[name] = n
		}
	}
	return st
}

// freeze stops every connection's bytes, for good (see FreezeAtRows).
func (p *PGProxy) freeze() { p.freezeOnce.Do(func() { close(p.frozen) }) }

func (p *PGProxy) isFrozen() bool {
	select {
	case <-p.frozen:
		return true
	default:
		return false
	}
}

// serve runs one PostgreSQL connection.
func (p *PGProxy) serve(l *link, up net.Conn) { newPGConn(p, l).run(up) }
