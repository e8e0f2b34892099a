package streams

import "errors"

// Errors returned by this package, matched with errors.Is. Messages that
// wrap them name the stream, writer, table and positions involved.
var (
	// ErrNotInFlight: an ID was finished that was never allocated here, or
	// was finished twice.
	ErrNotInFlight = errors.New("streams: id not in flight")
	// ErrNotFromSequence: a statement that allocates IDs (AllocQuery)
	// returned an ID the stream's sequence cannot have handed out to it:
	// at or below what was known before it ran, repeated, or in flight.
	ErrNotFromSequence = errors.New("streams: id not drawn from the sequence")
	// ErrNoSequence: an operation that needs the stream's PostgreSQL
	// sequence was asked of a stream with an in-process counter.
	ErrNoSequence = errors.New("streams: stream has no sequence")
	// ErrNotWriter: an instance that does not write a stream tried to
	// allocate on it.
	ErrNotWriter = errors.New("streams: not a writer of this stream")
	// ErrSequenceBehind: the sequence would hand out IDs at or below rows
	// already stored (startup check a), or, at runtime, handed out an ID
	// at or below one the writer knew of or a row holds (it was set back:
	// setval, a restore of the sequence without its tables). A row there
	// could commit below a position readers passed and never be seen, so
	// the write is refused before it commits, and so is every write until
	// the sequence is past the stream's IDs again (the binaries' `master
	// check --repair`); Generator.SequenceBehind says so meanwhile.
	ErrSequenceBehind = errors.New("streams: sequence behind table")
	// ErrPositionAhead: a stored writer position is above the sequence
	// (startup check b).
	ErrPositionAhead = errors.New("streams: stored position ahead of sequence")
	// ErrBadConfig: a stream configuration is invalid.
	ErrBadConfig = errors.New("streams: bad config")
	// ErrSealed: the writer holding was sealed or taken over; it may never
	// write again (a zombie's write, heartbeat or release), or there is
	// nothing left to seal.
	ErrSealed = errors.New("streams: writer sealed")
	// ErrLeaseExpired: a holder's lease ran out (no heartbeat renewed it
	// within its TTL) and the holding was sealed: it may never write
	// again. Errors that wrap it wrap ErrSealed too.
	ErrLeaseExpired = errors.New("streams: lease expired")
	// ErrNameHeld: a writer name is held by another live instance (or, for
	// Seal without force, its lease has not expired).
	ErrNameHeld = errors.New("streams: writer name held")
)
