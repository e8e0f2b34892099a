// Package engine hands this repository's binaries, benchmarks and tests
// the engine under a weft.Node: the fabric node, the streams' writers and
// generators, the read router. The library's users do not see them (the
// front door's verbs cover what they need), so these are no v1 promise.
//
// Package weft registers the accessor when it is initialised; Of panics
// on anything but a *weft.Node.
package engine

import (
	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/streams"
)

// Parts are one node's engine parts. The per-stream ones return nil for
// a stream not declared, or not of that kind, or not written here.
type Parts struct {
	// Fabric is the fabric node under the process.
	Fabric *fabric.Node
	// Reads routes range reads of the streams' tables to the read replica
	// as far as it holds them, the rest to the primary.
	Reads *catchup.ReadRouter
	// Writer is a durable stream's writer.
	Writer func(stream string) *fabric.Writer
	// Ephemeral is an ephemeral stream's writer.
	Ephemeral func(stream string) *fabric.Ephemeral
	// Generator is a durable stream's generator (registry, persisted-upto,
	// tokens).
	Generator func(stream string) *streams.Generator
}

var of func(node any) Parts

// Register is package weft's: it says how to take a node apart.
func Register(f func(node any) Parts) { of = f }

// Of is node's engine parts; node is a *weft.Node.
func Of(node any) Parts { return of(node) }
