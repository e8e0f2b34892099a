// Package control owns an operator's changes to a consumer's stored
// state and the listings of it, on a pool: pause, resume and seek a
// consumer or group by name, list the consumers, the groups and the dead
// letters, retry or discard a dead letter. weft's Node methods of the same
// names run on it, and so does `master consumers` (which has no Node).
//
// The state is stored on the consumer's row in weft_consumers (paused,
// and seeks, a count of seeks), so it holds across restarts and for every
// process that runs the consumer.
//
// Every change is fenced against the batches applying at that moment: it
// locks the consumer's row FOR UPDATE (and a group's partitions, in
// partition order), which a single consumer's batch holds FOR UPDATE and
// a group member's batch FOR SHARE from before it applies a row until it
// commits. So a change waits for the batches in flight, and every batch
// after it reads the change under that lock before it applies anything:
// once Pause returns, no batch commits until Resume; once Seek returns,
// every batch starts from the new cursor.
//
// A running consumer also re-reads its row at least every
// weft.Config.AnnounceInterval (a group member, every quarter second)
// when it has nothing to apply or is paused: a pause, resume or seek
// takes effect within about that long whether or not rows arrive.
package control
