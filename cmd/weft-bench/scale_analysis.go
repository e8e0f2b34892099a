package main

// The analysis of each curve, written against the figures of the last
// full run (bench/scale.json): causes where the measured order disagrees
// with the model, and the fix or the ceiling.

const readersAnalysis = `**Analysis.** Pending the full run.`

const streamsAnalysis = `**Analysis.** Pending the full run.`

const instancesAnalysis = `**Analysis.** Pending the full run.`

const longPollsAnalysis = `**Analysis.** Pending the full run.`

const backlogAnalysis = `**Analysis.** Pending the full run.`

const writersAnalysis = `**Analysis.** Pending the full run.`

const paperIntro = `From the per-unit costs measured above (the largest point of each curve), what 1,000 instances,
100 writers and 1M rows/s in all would need, if every instance followed every row (the worst case).
`

const paperAnalysis = `**What saturates first.** Pending the full run.`
