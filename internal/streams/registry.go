package streams

import (
	"cmp"
	"context"
	"iter"
	"slices"
)

// Registry is a stream's writer registry as one instance has read it: every
// writer with a stored position on the stream, sealed or not, and how far
// each of them, and every writer it does not list, is known to hold no ID.
// It is what a reader builds tokens from (Token) so that no token passes
// over a row, whichever writers the reader has heard of.
//
// A writer registers (stores its position) before it allocates, so a read
// of the sequence followed by a read of the registry bounds every writer
// the second read misses: its IDs lie above the sequence value. A Registry
// is the union of such reads; Cap is the highest sequence value among
// them, and a writer first listed by a later read keeps, as its Floor, the
// Cap it was missing from.
//
// Registries are immutable values that may share their writers; the zero
// Registry lists no writer and has Cap 0.
type Registry struct {
	cap     int64
	writers []RegisteredWriter // sorted by ID, shared, never written
}

// RegisteredWriter is one writer of a Registry.
type RegisteredWriter struct {
	ID   WriterID
	Name string
	// Floor is a position at or below which the writer holds no ID: the
	// Cap the registry had when a read first listed it (0 for the first
	// read).
	Floor int64
}

// Cap is the sequence value read before the registry: a writer the
// registry does not list holds no ID at or below it. It is 0 for a stream
// without a sequence.
func (r Registry) Cap() int64 { return r.cap }

// Len is the number of writers listed.
func (r Registry) Len() int { return len(r.writers) }

// Lists reports whether the registry lists writer id.
func (r Registry) Lists(id WriterID) bool {
	_, listed := r.find(id)
	return listed
}

// find is where id is, or would be, in r's writers.
func (r Registry) find(id WriterID) (int, bool) {
	return slices.BinarySearchFunc(r.writers, id, func(w RegisteredWriter, id WriterID) int { return cmp.Compare(w.ID, id) })
}

// All yields the writers listed, in ID order.
func (r Registry) All() iter.Seq[RegisteredWriter] {
	return func(yield func(RegisteredWriter) bool) {
		for _, w := range r.writers {
			if !yield(w) {
				return
			}
		}
	}
}

// Token returns the token of a reader that holds every row of each writer
// w at or below views[w] (a writer missing from views: none). Each listed
// writer is at the higher of its view and its Floor, a writer of views
// the registry does not list at the higher of its view and Cap, and the
// minimum is the lowest of those and at most Cap. So every position in the
// token is of a row the reader holds or of no row at all, whichever
// writers exist.
//
// Tokens of one reader do not go backwards as its views rise and its
// registry learns: a writer learned later starts at its Floor, at or above
// the minimum of every token built before.
func (r Registry) Token(views map[WriterID]int64) Token {
	low := r.cap
	pos := make(map[WriterID]int64, max(len(r.writers), len(views)))
	for _, w := range r.writers {
		p := max(views[w.ID], w.Floor)
		pos[w.ID] = p
		low = min(low, p)
	}
	for w, v := range views {
		if _, listed := pos[w]; !listed {
			pos[w] = max(v, r.cap)
		}
	}
	return NewToken(low, pos)
}

// learn returns r after a read that found the writers named in found,
// having read the sequence at seq before them. A writer new to r gets r's
// Cap as its Floor: the reads r holds did not list it, so it registered
// after each of them began.
func (r Registry) learn(seq int64, found map[string]WriterID) Registry {
	out := Registry{cap: max(r.cap, seq), writers: r.writers}
	copied := false
	for name, id := range found {
		i, listed := out.find(id)
		if listed {
			continue
		}
		if !copied {
			out.writers, copied = slices.Clone(r.writers), true // r's may be shared
		}
		out.writers = slices.Insert(out.writers, i, RegisteredWriter{ID: id, Name: name, Floor: r.cap})
	}
	return out
}

// Registry returns the stream's writer registry as of the last Open or
// Refresh.
func (g *Generator) Registry() Registry {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reg
}

// learnRegistry records a read of the registry that found stored (by
// writer name) after reading the sequence at seq.
func (g *Generator) learnRegistry(ctx context.Context, seq int64, stored map[string]int64) error {
	found := make(map[string]WriterID, len(stored))
	for name := range stored {
		id, err := g.writerID(ctx, name)
		if err != nil {
			return err
		}
		found[name] = id
	}
	g.mu.Lock()
	g.reg = g.reg.learn(seq, found)
	g.mu.Unlock()
	return nil
}
