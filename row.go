package weft

import (
	"context"
	"encoding/json"
)

// Row is one row of a stream.
type Row struct {
	// Stream is the stream's name.
	Stream string
	// Writer is the name of the process that wrote it.
	Writer string
	// Pos is its position: unique in the stream, and ascending in each
	// writer's order.
	Pos int64
	// Data is the row as JSON. It is the same JSON value live and when
	// read back from the database, not always the same bytes (jsonb
	// normalizes): parse it, never compare it.
	Data json.RawMessage
}

// Decode unmarshals the row's Data into v.
func (r Row) Decode(v any) error { return json.Unmarshal(r.Data, v) }

// Handler handles the rows of a followed stream, each once per process,
// in the order of each writer's positions. It runs on the process's
// delivery loop: keep it short. An error rejects the row: it is given
// again after a growing delay, and the writer's later rows wait.
//
// A Handler with a method Reset(stream, writer string) is told when a
// writer's rows start again from the beginning, to drop the state it
// keeps of them: when a writer of an ephemeral stream (Stream.Ephemeral)
// restarts; never for a durable stream.
type Handler interface {
	Handle(ctx context.Context, r Row) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, r Row) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, r Row) error { return f(ctx, r) }

// resetter is a Handler with Reset (see Handler).
type resetter interface {
	Reset(stream, writer string)
}
