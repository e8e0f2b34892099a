// Package wire owns the command codec of weft's Redis pub/sub protocol: the
// grammar of one published line, the typed commands it carries, and the
// errors that say why a line was refused. It does no I/O and has no mutable
// package-level state; the application's own verbs and a small intern table
// live on a Codec.
//
// One command per line, one text line, no '\n' or '\r' anywhere (a PUBLISH
// carries a frame of one or more lines of its channel joined by '\n'; the
// transport takes frames apart and hands this package single lines):
//
//	line      = verb *( SP arg ) [ SP json ]
//	verb      = 1*32( %x41-5A )                  ; A-Z
//	name      = 1*128( ALPHA / DIGIT / "_" / "." / ":" / "-" )
//	position  = "0" / %x31-39 *18DIGIT           ; decimal int64 >= 0, no sign, no leading zero
//	SP        = %x20                             ; exactly one space between tokens
//
//	RDATA     SP stream SP writer SP prev SP pos SP rows   ; prev < pos
//	POSITION  SP stream SP writer SP prev SP pos           ; prev <= pos
//	REPLICATE SP instance *( SP stream )                   ; at most 64 streams, each once
//	HELLO     SP instance SP hello
//	BYE       SP instance
//	appverb   SP args                                      ; registered on a Codec
//
// stream is a stream name; writer and instance are instance IDs, both of the
// name grammar. Every command carries its sender's instance ID (the writer for
// RDATA and POSITION), returned by Command.Sender, so a reader can drop its own
// echoes. prev is the writer's previously announced position on the stream, so
// every data command can be checked for a gap. rows is a non-empty JSON array
// of rows, kept as raw bytes; hello is a JSON object decoded into Hello, unknown
// fields ignored. A JSON tail starts right after its single space and ends with
// its closing bracket: no whitespace around it.
//
// The grammar is strict so that every accepted line is the canonical encoding
// of its command: Encode(Decode(line)) reproduces line byte for byte, except
// for HELLO, whose JSON object is re-marshalled (and application verbs, which
// are as canonical as their own decoders). A refused line yields an
// *Error wrapping ErrLineTooLong, ErrUnknownVerb or ErrMalformed; Reason gives
// a bounded label for metrics. Callers count and skip such lines, never fail.
package wire
