package core

import (
	"encoding/json"
	"fmt"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// Key names one writer of one stream. Writer is the writer's stable name,
// not its instance ID.
type Key struct {
	Stream string
	Writer string
}

func (k Key) String() string { return k.Stream + "/" + k.Writer }

// Action is something the runner must do. Actions of one step are executed
// in order.
type Action interface{ fmt.Stringer }

// Publish sends a command on the cluster channel, through the instance's
// one ordered pipeline.
type Publish struct{ Cmd wire.Command }

// Fetch asks for every row of Key with From < pos <= To. Instance is the
// writer instance last heard from (the only source for an ephemeral
// stream), URL its catch-up base URL if it sent a HELLO. The runner
// answers with FetchDone carrying ID, after delivering the rows itself.
type Fetch struct {
	ID        uint64
	Key       Key
	Instance  string
	URL       string
	Ephemeral bool
	From, To  int64
}

// Deliver hands live rows at Pos to the application. Prev is the view
// before them: on failure the runner reports ApplyFailed with both. Once
// they are applied the view of Key is at Pos: no Advance follows a Deliver.
//
// It is emitted as a *Deliver, lent from blocks the core allocates a few
// at a time, so that delivering a row does not allocate one Action for it
// on a reader's hot path.
type Deliver struct {
	Key      Key
	Instance string
	Prev     int64
	Pos      int64
	Rows     json.RawMessage
}

// Advance moves the local view of Key to Pos: everything up to Pos has been
// delivered, so waiters for it may wake. It comes where the view moves
// without rows to apply (a POSITION, the end of a catch-up); a Deliver
// advances the view itself once applied.
type Advance struct {
	Key Key
	Pos int64
}

// Reset tells the application to drop what it holds of Key: the ephemeral
// writer restarted (or said BYE), and its state starts again from 0.
type Reset struct {
	Key      Key
	Instance string // the instance whose state is dropped
}

// Established reports that the connection is established: subscribed,
// REPLICATE answered, and every stream caught up. The runner resets its
// reconnect backoff only then. Established{false} follows a disconnect.
type Established struct{ Established bool }

// Note reports something worth counting: a gap, a stale or dropped
// command, a failed catch-up. Kind and Cause are bounded label values.
type Note struct {
	Kind   string
	Stream string
	Cause  string
	// Instance is the instance concerned, when there is one: for logs,
	// never for labels.
	Instance string
}

// Note kinds.
const (
	NoteGap           = "gap"            // cause: rdata, position, overflow, apply_failed
	NoteStale         = "stale"          // a command at or below the view
	NoteDropped       = "dropped"        // cause: before_position, unknown_stream, bad_writer, late_rows, not_writer
	NoteReset         = "reset"          // cause: new_instance, bye, gone, expired, sealed
	NoteCatchupFailed = "catchup_failed" // a fetch failed; it is retried after a delay
	NoteSuspect       = "suspect"        // a writer did not answer a new connection in time
	NoteRefused       = "refused"        // a line refused by the peer table; cause: replayed, stale_instance, peers_full
	NoteExpired       = "expired"        // an instance not heard from for PeerTimeout was forgotten
	NoteChannelLost   = "channel_lost"   // the stream's channel was lost alone (StreamsLost)
)

func (a Publish) String() string {
	b, err := wire.Encode(nil, a.Cmd)
	if err != nil {
		return fmt.Sprintf("publish <%v>", err)
	}
	return "publish " + string(b)
}

func (a Fetch) String() string {
	return fmt.Sprintf("fetch #%d %s (%d, %d] from %s", a.ID, a.Key, a.From, a.To, a.Instance)
}

func (a Deliver) String() string {
	return fmt.Sprintf("deliver %s %d %s", a.Key, a.Pos, a.Rows)
}

func (a Advance) String() string { return fmt.Sprintf("advance %s %d", a.Key, a.Pos) }

func (a Reset) String() string { return fmt.Sprintf("reset %s (was %s)", a.Key, a.Instance) }

func (a Established) String() string {
	if a.Established {
		return "established"
	}
	return "not established"
}

func (a Note) String() string {
	s := fmt.Sprintf("note %s %s", a.Kind, a.Stream)
	if a.Cause != "" {
		s += " " + a.Cause
	}
	if a.Instance != "" {
		s += " (" + a.Instance + ")"
	}
	return s
}
