package faultproxy

// maxTxStatements bounds the distinct statements a session remembers of
// one transaction for Rule.Match; past it, further ones are not matched.
const maxTxStatements = 1024

// pgSession follows the client's side of one connection: its prepared
// statements and portals, the statements of its transaction, and its
// units. A unit is what the server ends with one ReadyForQuery: a simple
// Query, a FunctionCall, or extended-protocol messages up to their Sync.
// Units are numbered on both sides the same way (see pgConn), so the
// server's answers can be told apart by unit.
//
// A client that sends a Query while the server discards messages up to a
// Sync (after an error in an extended-protocol unit) gets no
// ReadyForQuery for it and throws the count off; pgx never does that.
type pgSession struct {
	// fire returns the rule that fires on an occasion, or nil.
	fire func(commit bool, stmt string, tx map[string]struct{}) *Armed

	stmts   map[string]string // prepared statement name -> SQL
	portals map[string]string // portal name -> SQL of its statement
	tx      map[string]struct{}

	unit        uint64 // the unit the next message belongs to; the first after startup is 1
	completions int    // statement completions the server sends in this unit before the next one's
	plan        *plan  // this unit's, once a rule fired in it
}

// plan is the cut a rule decided for a unit.
type plan struct {
	rule  *Armed
	fault Fault
	unit  uint64
	// at is, for CutAfterCommit, the index in the unit of the completion
	// (CommandComplete, EmptyQueryResponse, PortalSuspended or
	// ErrorResponse) that answers the COMMIT.
	at int
}

// step is what the client's pump does with one message.
type step int

const (
	stepForward   step = iota
	stepCutBefore      // close without sending it on
	stepHold           // send it on, then nothing more: it ends a unit with a plan
)

func newPGSession(fire func(bool, string, map[string]struct{}) *Armed) *pgSession {
	return &pgSession{
		fire:    fire,
		stmts:   make(map[string]string),
		portals: make(map[string]string),
		tx:      make(map[string]struct{}),
		unit:    1,
	}
}

// client follows one typed message from the client (body without type and
// length) and says what to do with it. When a rule fires on it, the plan
// is returned as well: the server's pump must have it before the message
// goes on.
func (s *pgSession) client(typ byte, body []byte) (step, *plan) {
	var fresh *plan
	switch typ {
	case 'Q':
		sql, _, _ := cstring(body)
		stmts := splitSQL(sql)
		for _, stmt := range stmts {
			cut, pl := s.statement(stmt)
			if cut {
				return stepCutBefore, nil
			}
			if pl != nil {
				fresh = pl
			}
		}
		if len(stmts) == 0 {
			s.completions++ // the EmptyQueryResponse
		}
		return s.endUnit(), fresh
	case 'P':
		if name, sql, ok := parseMsg(body); ok {
			s.stmts[name] = sql
		}
	case 'B':
		if portal, stmt, ok := bindMsg(body); ok {
			s.portals[portal] = s.stmts[stmt]
		}
	case 'C':
		if kind, name, ok := closeMsg(body); ok {
			switch kind {
			case 'S':
				delete(s.stmts, name)
			case 'P':
				delete(s.portals, name)
			}
		}
	case 'E':
		portal, _, _ := cstring(body)
		cut, pl := s.statement(s.portals[portal])
		if cut {
			return stepCutBefore, nil
		}
		return stepForward, pl
	case 'S', 'F':
		return s.endUnit(), nil
	}
	return stepForward, nil
}

// statement follows one statement about to be sent, whose completion is
// the next of the unit: it follows the transaction and gives the rules
// their occasion. It reports whether to cut before sending it, or returns
// the plan of a rule that fired.
func (s *pgSession) statement(sql string) (cutBefore bool, fresh *plan) {
	at := s.completions
	s.completions++
	verb := classify(sql)
	if verb == txBegin {
		clear(s.tx)
	}
	if s.plan == nil && verb == txCommit {
		if a := s.fire(true, sql, s.tx); a != nil {
			if a.rule.Fault == CutBeforeCommit {
				return true, nil
			}
			s.plan = &plan{rule: a, fault: a.rule.Fault, unit: s.unit, at: at}
			fresh = s.plan
		}
	}
	if s.plan == nil {
		if a := s.fire(false, sql, nil); a != nil {
			s.plan = &plan{rule: a, fault: a.rule.Fault, unit: s.unit, at: at}
			fresh = s.plan
		}
	}
	switch verb {
	case txCommit, txEnd:
		clear(s.tx)
	case txNone:
		if sql != "" && len(s.tx) < maxTxStatements {
			s.tx[sql] = struct{}{}
		}
	}
	return false, fresh
}

// endUnit closes the current unit: the message that does so is held after
// when the unit has a plan.
func (s *pgSession) endUnit() step {
	st := stepForward
	if s.plan != nil {
		st = stepHold
	}
	s.unit++
	s.completions = 0
	s.plan = nil
	return st
}
