// Package testenv owns the servers that weft's integration tests run against
// and the polling helpers those tests synchronise with.
//
// Two kinds of server are offered:
//
//   - Shared servers that are already running (BaseDatabaseURL,
//     SharedRedisURL). Each test gets its own database via NewDatabase or
//     NewPool, so tests never see each other's tables.
//   - Private servers that a test starts, kills and restarts at will
//     (StartRedis, StartPostgres, and StartReplica for a streaming replica
//     of such a PostgreSQL), for fault tests that must never touch a
//     shared server; StartRedisCluster starts a private Redis Cluster of
//     three masters and three replicas and does to it what a cluster does
//     in production (failover, slot migration, dropped pub/sub clients).
//
// When a server cannot be reached the test is skipped with a message saying
// why, except under CI=true, where it fails: integration tests must never
// pass in CI by silently not running.
//
// Child processes get Pdeathsig=SIGKILL on Linux so a crashed test binary
// does not leave servers behind. The kernel sends that signal when the
// forking OS thread exits, which the Go runtime only does for threads locked
// with runtime.LockOSThread whose goroutine exits; tests here do not do that.
package testenv
