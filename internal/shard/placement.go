package shard

import (
	"context"

	"github.com/weft-dev/weft/internal/shard/handover"
)

// Placement says who owns keys while the shard map changes at runtime, and
// fences this instance's own keys through a handover (see package
// handover): a key that moved here runs nothing until its old owner let go
// of it. The membership package's Follower implements it, reading the map
// from the database; a static [Map] needs none.
type Placement interface {
	// Owner is key's owner at the newest map this instance knows, and
	// that map's epoch.
	Owner(key string) (writer string, epoch int64)
	// Admit decides on a task for key from a sender that knows the map up
	// to senderEpoch (0: unknown); Accept counts it until Done.
	Admit(key string, senderEpoch int64) handover.Decision
	// Runnable reports whether the admitted tasks of key may run now.
	Runnable(key string) bool
	// Done ends one admitted task of key (ran, failed or dropped).
	Done(key string)
	// Refresh reads the map now (a sender knew a newer one).
	Refresh(ctx context.Context) error
}
