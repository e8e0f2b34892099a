package wire

import "encoding/json"

// Built-in verbs. Application verbs must not reuse them.
const (
	VerbRData     = "RDATA"
	VerbPosition  = "POSITION"
	VerbReplicate = "REPLICATE"
	VerbHello     = "HELLO"
	VerbBye       = "BYE"
)

// Command is one decoded line. Built-in commands are the pointer types below;
// application commands are whatever their registered decoder returns.
type Command interface {
	// Verb is the line's first token.
	Verb() string
	// Sender is the instance ID of the process that published the command.
	Sender() string
}

// DataStream returns the stream of a stream's data command (RDATA,
// POSITION, SEALED), which travels on that stream's channel; ok is false
// for the commands of the control channel.
func DataStream(cmd Command) (stream string, ok bool) {
	switch c := cmd.(type) {
	case *RData:
		return c.Stream, true
	case *Position:
		return c.Stream, true
	case *Sealed:
		return c.Stream, true
	}
	return "", false
}

// Appender is implemented by application commands so that Encode can write
// them. AppendArgs appends everything after "VERB ": at least the sender's
// instance ID, one line, in the form the verb's registered decoder accepts.
type Appender interface {
	Command
	AppendArgs(dst []byte) ([]byte, error)
}

// RData carries a writer's rows at one stream position: all rows sharing the
// stream ID Pos travel together.
type RData struct {
	Stream string
	// Writer is the writing instance's ID, and the sender.
	Writer string
	// Prev is the writer's previously announced position on Stream; Prev < Pos.
	Prev int64
	Pos  int64
	// Rows is a non-empty JSON array, one element per row, kept undecoded. A
	// decoded RData owns its Rows: they do not alias the decoded line.
	Rows json.RawMessage
}

// Verb returns VerbRData.
func (*RData) Verb() string { return VerbRData }

// Sender returns the writer's instance ID.
func (c *RData) Sender() string { return c.Writer }

// Position says that Writer wrote nothing on Stream in (Prev, Pos] and its
// position is now Pos. Prev == Pos is valid: it is how a writer answers
// REPLICATE ("POSITION s w last last").
type Position struct {
	Stream string
	// Writer is the writing instance's ID, and the sender.
	Writer string
	Prev   int64
	Pos    int64
}

// Verb returns VerbPosition.
func (*Position) Verb() string { return VerbPosition }

// Sender returns the writer's instance ID.
func (c *Position) Sender() string { return c.Writer }

// Replicate says that Instance (re)connected: every writer answers with a
// Position for each stream it writes, of Streams when it names some.
type Replicate struct {
	Instance string
	// Streams limits the answers to these streams (at most
	// MaxReplicateStreams, each once): an instance that regained the
	// channels of some streams asks for those alone. Empty means every
	// stream.
	Streams []string
}

// MaxReplicateStreams bounds the streams one REPLICATE names; an instance
// that wants more asks for every stream.
const MaxReplicateStreams = 64

// Verb returns VerbReplicate.
func (*Replicate) Verb() string { return VerbReplicate }

// Sender returns Instance.
func (c *Replicate) Sender() string { return c.Instance }

// Hello is the JSON body of a HELLO command. Unknown fields are ignored when
// decoding, so newer instances may add fields without breaking older readers.
type Hello struct {
	// Name is the instance's stable role label from config (e.g. "persister1").
	Name string `json:"name"`
	Role string `json:"role"`
	// URL is the HTTP base URL that serves catch-up for the streams it writes.
	URL     string `json:"url"`
	Version string `json:"version"`
	// Streams lists the streams the instance writes; each is a valid name.
	Streams []string `json:"streams"`
}

// HelloCmd announces an instance: sent on connect and with every heartbeat.
type HelloCmd struct {
	Instance string
	Hello    Hello
}

// Verb returns VerbHello.
func (*HelloCmd) Verb() string { return VerbHello }

// Sender returns Instance.
func (c *HelloCmd) Sender() string { return c.Instance }

// Bye says that Instance is shutting down gracefully: others drop its
// ephemeral state now rather than waiting for it to look dead.
type Bye struct {
	Instance string
}

// Verb returns VerbBye.
func (*Bye) Verb() string { return VerbBye }

// Sender returns Instance.
func (c *Bye) Sender() string { return c.Instance }

// builtin reports whether verb is one of the built-in verbs.
func builtin(verb string) bool {
	switch verb {
	case VerbRData, VerbPosition, VerbReplicate, VerbHello, VerbBye, VerbSealed:
		return true
	}
	return false
}
