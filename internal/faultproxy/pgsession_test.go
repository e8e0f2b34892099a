package faultproxy

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// rulesOnly is a PGProxy that is not listening: enough to arm rules and
// ask them.
func rulesOnly(t *testing.T, rules ...Rule) (*PGProxy, []*Armed) {
	t.Helper()
	p := &PGProxy{}
	p.rules.Store(&[]*Armed{})
	var armed []*Armed
	for _, r := range rules {
		a, err := p.Arm(r)
		if err != nil {
			t.Fatal(err)
		}
		armed = append(armed, a)
	}
	return p, armed
}

// sent is what the session said of one message.
type sent struct {
	step step
	plan *plan
}

// feed passes messages to s as the client's pump would and returns what
// it said of each; it stops after a cut or a hold.
func feed(t *testing.T, s *pgSession, msgs ...encoder) []sent {
	t.Helper()
	var out []sent
	for _, m := range msgs {
		b := encode(t, m)
		st, pl := s.client(b[0], b[5:])
		out = append(out, sent{st, pl})
		if st != stepForward {
			break
		}
	}
	return out
}

// pgxTx is a transaction as pgx sends it with the statement cache: begin,
// a statement prepared by name, run by name, commit.
func pgxTx(name, sql string, prepare bool) []encoder {
	msgs := []encoder{&pgproto3.Query{String: "begin"}}
	if prepare {
		msgs = append(msgs, &pgproto3.Parse{Name: name, Query: sql}, &pgproto3.Describe{ObjectType: 'S', Name: name}, &pgproto3.Sync{})
	}
	return append(msgs,
		&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{},
		&pgproto3.Query{String: "commit"})
}

// last checks that the session forwarded every message but the last and
// returns what it said of that one.
func last(t *testing.T, out []sent, n int) sent {
	t.Helper()
	if len(out) != n {
		t.Fatalf("the session stopped after %d of %d messages: %+v", len(out), n, out)
	}
	for _, o := range out[:n-1] {
		if o.step != stepForward || o.plan != nil {
			t.Fatalf("%+v before the last message", out)
		}
	}
	return out[n-1]
}

func TestSessionCutAfterCommitMatchesTheTransaction(t *testing.T) {
	ins := "INSERT INTO events VALUES ($1)"
	p, armed := rulesOnly(t, Rule{Fault: CutAfterCommit, Match: "INTO events"})
	s := newPGSession(p.fire)

	// A transaction of other statements commits untouched.
	other := pgxTx("s0", "INSERT INTO other VALUES ($1)", true)
	if o := last(t, feed(t, s, other...), len(other)); o.step != stepForward {
		t.Fatalf("commit of another transaction: %+v", o)
	}
	// The first use of the statement prepares it; the commit is cut.
	msgs := pgxTx("s1", ins, true)
	o := last(t, feed(t, s, msgs...), len(msgs))
	if o.step != stepHold || o.plan == nil || o.plan.fault != CutAfterCommit || o.plan.at != 0 || o.plan.unit != 8 {
		t.Fatalf("commit: %+v %+v, want a hold and a plan for unit 8 at completion 0", o, o.plan)
	}
	if armed[0].Fired() != 1 {
		t.Fatalf("fired %d times", armed[0].Fired())
	}

	// Spent: on a new connection, the statement's second use (Bind by
	// name alone) commits untouched; re-armed, it is cut.
	s = newPGSession(p.fire)
	feed(t, s, &pgproto3.Parse{Name: "s1", Query: ins}, &pgproto3.Sync{})
	msgs = pgxTx("s1", ins, false)
	if o := last(t, feed(t, s, msgs...), len(msgs)); o.step != stepForward {
		t.Fatalf("a spent rule fired: %+v", o)
	}
	p.Arm(Rule{Fault: CutAfterCommit, Match: "INTO events"})
	if o := last(t, feed(t, s, msgs...), len(msgs)); o.step != stepHold || o.plan.fault != CutAfterCommit {
		t.Fatalf("second use: %+v", o)
	}
}

func TestSessionCommitForms(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs []encoder
		at   int // the COMMIT's completion in its unit
		cut  int // the message that carries the COMMIT's execution
	}{
		{"simple", []encoder{&pgproto3.Query{String: "BEGIN"}, &pgproto3.Query{String: "INSERT INTO events VALUES (1)"}, &pgproto3.Query{String: "COMMIT"}}, 0, 3},
		{"one query", []encoder{&pgproto3.Query{String: "BEGIN; INSERT INTO events VALUES (1); SELECT 1; END"}}, 3, 1},
		{"extended", []encoder{&pgproto3.Query{String: "begin"},
			&pgproto3.Parse{Query: "INSERT INTO events VALUES (1)"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.Parse{Query: "commit"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}, 1, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := rulesOnly(t, Rule{Fault: CutAfterCommit, Match: "events"})
			out := feed(t, newPGSession(p.fire), tc.msgs...)
			var pl *plan
			for _, o := range out {
				if o.plan != nil {
					pl = o.plan
				}
			}
			if out[len(out)-1].step != stepHold || len(out) != len(tc.msgs) || pl == nil || pl.at != tc.at {
				t.Fatalf("%+v, plan %+v; want a hold after the last message and a plan at %d", out, pl, tc.at)
			}

			p, _ = rulesOnly(t, Rule{Fault: CutBeforeCommit})
			out = feed(t, newPGSession(p.fire), tc.msgs...)
			if len(out) != tc.cut || out[len(out)-1].step != stepCutBefore {
				t.Fatalf("before: %+v, want a cut at message %d", out, tc.cut)
			}
		})
	}
}

func TestSessionRollbackForgetsTheTransaction(t *testing.T) {
	p, armed := rulesOnly(t, Rule{Fault: CutAfterCommit, Match: "events"})
	msgs := []encoder{
		&pgproto3.Query{String: "BEGIN; INSERT INTO events VALUES (1); ROLLBACK"},
		&pgproto3.Query{String: "BEGIN"}, &pgproto3.Query{String: "SELECT 1"}, &pgproto3.Query{String: "COMMIT"},
		&pgproto3.Query{String: "BEGIN; INSERT INTO events VALUES (1); SAVEPOINT a; ROLLBACK TO a"}, &pgproto3.Query{String: "COMMIT"},
	}
	out := feed(t, newPGSession(p.fire), msgs...)
	if o := last(t, out, len(msgs)); o.step != stepHold || armed[0].Fired() != 1 {
		t.Fatalf("%+v; want only the commit after ROLLBACK TO cut", out)
	}
}

func TestSessionCutAfterSync(t *testing.T) {
	ins := "INSERT INTO events VALUES ($1)"
	p, armed := rulesOnly(t, Rule{Fault: CutAfterSync, Match: "INTO events"})
	s := newPGSession(p.fire)
	// pgx.Batch on a pool: a prepare pipeline (no Execute: not an
	// occasion), then the statements and one Sync.
	prepare := []encoder{&pgproto3.Parse{Name: "s1", Query: ins}, &pgproto3.Describe{ObjectType: 'S', Name: "s1"},
		&pgproto3.Parse{Name: "s2", Query: "SELECT 1"}, &pgproto3.Describe{ObjectType: 'S', Name: "s2"}, &pgproto3.Sync{}}
	last(t, feed(t, s, prepare...), len(prepare))
	batch := []encoder{
		&pgproto3.Bind{PreparedStatement: "s2"}, &pgproto3.Execute{},
		&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{},
		&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{},
	}
	out := feed(t, s, batch...)
	if len(out) != len(batch) || out[4].plan == nil || out[4].plan.fault != CutAfterSync || out[4].plan.unit != 2 ||
		out[7].step != stepHold || armed[0].Fired() != 1 {
		t.Fatalf("%+v; want a plan at the first matching Execute and a hold at the Sync", out)
	}

	// A simple autocommit statement.
	p, _ = rulesOnly(t, Rule{Fault: CutAfterSync, Match: "INTO events"})
	s = newPGSession(p.fire)
	simple := []encoder{&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Query{String: "INSERT INTO events VALUES (1)"}}
	if o := last(t, feed(t, s, simple...), 2); o.step != stepHold || o.plan == nil || o.plan.unit != 2 {
		t.Fatalf("simple: %+v", o)
	}

	// A portal closed and a statement replaced: the Execute is known by
	// what the Bind named when it ran.
	p, armed = rulesOnly(t, Rule{Fault: CutAfterSync, Match: "INTO events"})
	s = newPGSession(p.fire)
	msgs := []encoder{
		&pgproto3.Parse{Query: ins}, &pgproto3.Bind{DestinationPortal: "c"}, &pgproto3.Parse{Query: "SELECT 1"},
		&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Close{ObjectType: 'P', Name: "c"}, &pgproto3.Execute{Portal: "c"}, &pgproto3.Sync{},
	}
	if o := last(t, feed(t, s, msgs...), len(msgs)); o.step != stepForward || armed[0].Fired() != 0 {
		t.Fatalf("a closed portal matched: %+v", o)
	}
}

func TestArmedTimesAndProb(t *testing.T) {
	draws := func(r Rule, n int) []bool {
		_, armed := rulesOnly(t, r)
		out := make([]bool, n)
		for i := range out {
			out[i] = armed[0].fire()
		}
		return out
	}
	count := func(b []bool) (n int) {
		for _, x := range b {
			if x {
				n++
			}
		}
		return n
	}
	if n := count(draws(Rule{Fault: CutAfterSync}, 10)); n != 1 {
		t.Errorf("Times 0 fired %d times, want once", n)
	}
	if n := count(draws(Rule{Fault: CutAfterSync, Times: 3}, 10)); n != 3 {
		t.Errorf("Times 3 fired %d times", n)
	}
	if n := count(draws(Rule{Fault: CutAfterSync, Times: -1}, 10)); n != 10 {
		t.Errorf("Times -1 fired %d of 10 times", n)
	}
	a := draws(Rule{Fault: CutAfterSync, Times: -1, Prob: 0.3, Seed: 7}, 2000)
	b := draws(Rule{Fault: CutAfterSync, Times: -1, Prob: 0.3, Seed: 7}, 2000)
	c := draws(Rule{Fault: CutAfterSync, Times: -1, Prob: 0.3, Seed: 8}, 2000)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 drew differently at occasion %d", i)
		}
	}
	// Binomial(2000, 0.3): mean 600, sd 20.5; +-120 is over 5 sd.
	if n := count(a); n < 480 || n > 720 {
		t.Errorf("Prob 0.3 fired %d of 2000", n)
	}
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Error("seeds 7 and 8 drew the same")
	}

	_, armed := rulesOnly(t, Rule{Fault: CutAfterSync, Times: -1})
	armed[0].Disarm()
	if armed[0].fire() {
		t.Error("a disarmed rule fired")
	}
	for _, r := range []Rule{{}, {Fault: nFaults}, {Fault: CutAfterSync, Prob: 1.5}, {Fault: CutAfterSync, Prob: -0.1}} {
		if _, err := (&PGProxy{}).Arm(r); err == nil {
			t.Errorf("Arm(%+v) took a bad rule", r)
		}
	}
}
