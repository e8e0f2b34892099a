// Package simtest is the harness weft's deterministic simulations share
// (shard/handover and group): a logical clock in milliseconds with its
// queue of events, the failures a run records, and the seed loops their
// tests drive runs with.
//
// A simulation embeds a Sched, schedules work with After, records
// violations with Failf and steps the clock with Next; its test runs it
// over many seeds with Run, and checks that a deliberately broken
// protocol is caught with Catches. WEFT_SIM_SEEDS sets how many seeds a
// test runs, WEFT_SIM_SEED replays one.
package simtest
