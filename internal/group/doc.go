// Package group decides who runs which rows of a consumer group: the
// partition of each key, the balanced assignment of partitions to the
// group's live members, and when a member takes a partition, releases it
// and may run a batch of it. weft's Consumers with a Key run on it.
//
// A group splits a stream's keys into a fixed number of partitions
// ([Partition]: a hash that is the same in Go and in SQL, forever). Each
// partition has a row in the database: its cursor, its owner and an epoch
// that every take raises. Members register with a lease (by the database
// clock) and each one, on its own, reads the group (a [View]), assigns the
// partitions over the live members ([Rendezvous], the default [Strategy]: rendezvous hashing with
// bounded loads, the same answer on every member for the same members),
// takes the partitions assigned to it that nobody owns or whose owner's
// lease expired, and releases those no longer assigned to it, after its
// batch in flight. A batch locks its partitions' rows and runs only those
// still owned by the member at the epoch it holds them at ([Member.Fence]):
// a member that lost a partition, however stale its view, never commits
// for it again.
//
// A member's death is also seen directly: each holds a lock on a
// database session of its own while it runs, and [Watch] decides from
// successive looks at the others' locks which died (seen held, then gone
// for a grace), so that their leases can be expired early; a take still
// fences as for a lease that ran out.
//
// [Member] is a pure state machine: views, takes, releases and the rows
// read under a batch's locks go in, decisions come out. It does no I/O,
// keeps no clock and starts no goroutine, so the protocol is simulated
// deterministically (sim_test.go) with the database, leases, row locks,
// idle-in-transaction timeouts, kill -9, SIGSTOP and lost connections
// modelled. It is not safe for concurrent use.
package group
