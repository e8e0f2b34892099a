package main

import "strings"

// question is the hand-written part of the benchmarks doc for one
// measurement: a short title for the goals summary and what its figures
// measure, shown above its table. Keyed by the prefix of its figures' IDs.
type question struct {
	title, reading string
}

// questions say what each table measures and how to read it. They
// describe the method, never a figure: figures come from the results.
var questions = map[string]question{
	"e2e": {"End to end", `Durable rows, written and read back live. weft: 4 writer names (` +
		"`fabric.Writer`" + `), each INSERT drawing its ID in the statement, and 4 reader processes
(` + "`fabric.Node`" + `). Raw: autocommit INSERT with ` + "`nextval`" + ` in the statement, then a
synchronous PUBLISH, read by go-redis subscribers. A row counts once every reader has it.
*Batched*: 16 rooms x 64 callers, each waiting for its row, through a ` + "`shard.Queue`" + ` per
writer, against raw's 64 rows per INSERT and a pipeline of 64 PUBLISHes. Latency: rows fall due
on a fixed schedule at 1,000 rows/s; the clock runs from due to the last reader. Commits are not
fsynced (` + "`synchronous_commit = off`" + ` for both; ` + "`-sync-commit`" + ` measures with it on).
The peers' pass commits synchronously, all writers through one writer name.`},
	"fanout": {"Fan-out", `The pub/sub path alone: one writer on an ephemeral stream (no PostgreSQL),
N reader processes. Raw: a go-redis subscriber per process getting the same rows by PUBLISH.
*Deliveries/s* is rows x readers in a burst; *reader CPU per row* is each reader's getrusage over
its rows; latency is at 1,000 rows/s, publish to the last reader. On 2 cores the readers compete
with the writer and Redis for CPU, so deliveries/s flattens for both sides as readers are added.
The chart draws these figures.`},
	"streams": {"Per-stream channels", `4 ephemeral streams, 16 reader processes each following one:
a reader receives its stream's rows only. On one Redis (raw: a channel per stream, PUBLISH and
SUBSCRIBE), then on a Redis Cluster of 3 masters that ` + "`bench/cluster.sh`" + ` starts (raw:
SPUBLISH and SSUBSCRIBE).`},
	"catchup": {"Catch-up", `A reader that missed 100,000 rows reads them back from the writer's
instance over HTTP (` + "`catchup.Client`" + `, pages of 10,000), checking every row. Raw: one range
read of the same rows from PostgreSQL plus the JSON encoding of the same pages. Seconds: lower is
better, and a ratio under 1 is faster than raw.`},
	"lag": {"Persisted-upto lag", `How long after a commit a reader's persisted-upto (the position
below which every row is in PostgreSQL) covers it, with one busy writer and three idle ones. Idle
writers announce their position on an interval, so the interval bounds the lag. No raw equivalent.`},
	"outage": {"Redis outage", `Redis is killed (-9) for 5 s while the writers commit. weft: from the
restart until every reader has every row committed before it (reconnect, resync, catch-up from
PostgreSQL). Raw: until a go-redis subscriber receives again; raw has lost what was published
while Redis was down, weft has lost nothing.`},
	"rss": {"Memory", `The real ` + "`master`" + ` and ` + "`worker`" + ` binaries under the rooms
workload: 5,000 messages/s offered to the rooms' owners, each answered after read-your-writes;
peak RSS is VmHWM from /proc. On 2 cores fewer are acknowledged than offered (the msg/s row); the
rest wait in flight, at most 512 requests.`},
	"longpoll": {"Idle long-polls", `1,000 long-polls wait on one owner for other rooms while 1,000
messages are POSTed one at a time to their room's owner. Raw: the same writes with no long-poll
waiting. An idle long-poll should cost a write nothing.`},
	"groups": {"Consumer groups", `Members of a consumer group split a stream by key. Scaling: N
members, a handler that waits 5 ms a row, against N times one member's rate (linear).
Bookkeeping: a handler that does nothing; a group's one member against a single plain consumer,
and the difference of their 1/rate as the cost per row, at 64 and at 1,024 partitions.`},
	"failover": {"Failover", `A process killed with SIGKILL under load, with the default 10 s lease.
A writer: a writer process of its own (250 rows/s) and one in the benchmark's process (500 rows/s) append
to one stream; the time from the kill until persisted-upto on both readers has passed the
stream's sequence at the kill. A group member: three members (processes of their own) split a
stream a writer appends 500 rows/s to; the time from the kill until every partition the dead
member owned is owned by another. weft: liveness locks the others watch; raw: without them
(` + "`Config.SealDead`" + ` negative), the lease alone. Seconds: lower is better.`},
	"consumers": {"Consumer latency", `One process appends 1,000 rows/s and runs a Follower and a
durable Consumer of the stream, with an announce interval of 3 s. Each row carries the time of
its Append: append -> handled for the Follower (raw), append -> applied for the Consumer (weft).
A consumer that waited for the registry refresh would show the interval.`},
}

// prefix is the measurement a figure ID belongs to ("e2e.per_row": "e2e").
func prefix(id string) string {
	p, _, _ := strings.Cut(id, ".")
	return p
}

// howToRead is the doc's common reading guide.
const howToRead = `**How to read.** Each figure is the median over the runs, (min-max) after it. *Raw* is the
bare operation weft wraps, measured moments before weft on the same servers; *ratio* is weft/raw
within each run, then the median. The machine is shared, so absolute figures move from run to
run more than ratios do. Peer columns come from a separate pass (` + "`make peers`" + `, private
servers, synchronous commits): each is that peer's figure over raw's (INSERT+PUBLISH, or a SELECT
for catch-up) in the same pass, to set beside the ratio column; *peers only* rows are figures weft-bench does not take.
centrifuge keeps its history in Redis memory: it is not durable.`
