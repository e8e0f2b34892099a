package main

import (
	"fmt"
	"slices"
	"strings"
)

// renderDocSection is the consumers' section of docs/BENCHMARKS.md
// (cmd/weft-bench appends it; links are relative to docs/): one line per
// peer, each figure's median with its ratio to raw's in the same pass,
// then issue 46's goals and where weft stands.
func renderDocSection(h header, rs []result) string {
	var b strings.Builder
	b.WriteString("\n## Consumers: weft beside River, NATS JetStream and a raw SKIP LOCKED loop\n\n")
	fmt.Fprintf(&b, "`make peers-consumers` (`bench/consumers/run.sh`, -passes %d) on %s, %s, private PostgreSQL (synchronous commits), Redis and nats-server (JetStream, file storage). ",
		h.Passes, h.Commit, h.Taken.Format("2006-01-02 15:04 UTC"))
	b.WriteString("Each row's effect is an INSERT in the consumer's transaction (JetStream: committed, then acked; River: with JobCompleteTx, 100 workers per client). ")
	b.WriteString("Latency: append call -> the effect transaction's NOTIFY, heard at commit. ")
	b.WriteString("Producers are processes of their own. Cells: median over the passes (ratio to raw's in the same pass). ")
	b.WriteString("*Group of 4*: 4 weft nodes of one keyed consumer, 4 River clients, 4 JetStream pull subscribers, 4 raw loops. ")
	b.WriteString("CPU: the consumers' process and all three servers, per row drained. ")
	b.WriteString("Every run checks the effects table; all figures: [bench/consumers/results.md](../bench/consumers/results.md).\n\n")
	b.WriteString("| peer | append -> effect committed at 1,000 rows/s: p50 / p99 / p99.9 ms | live rows/s: 1 / group of 4 | drain rows/s: 1 / group of 4 | CPU us/row, drain: 1 / 4 | runs keeping the promise |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, p := range peersOf(rs) {
		cell := func(sc string, f figure) string {
			mine := only(rs, sc, p)
			if len(mine) == 0 {
				return "-"
			}
			v := median(mine, f)
			s := num(v)
			if p != "raw" {
				s += " (" + ratio(rs, mine, f) + ")"
			}
			return s
		}
		rps := func(r result) float64 { return r.RowsPerSec }
		cpu := func(r result) float64 { return r.CPUUsPerRow }
		holds, runs, undone := 0, 0, 0
		var pr, group promise
		for _, r := range rs {
			if r.Peer == p {
				runs++
				if !r.Done {
					undone++
				}
				if r.Holds {
					holds++
				}
				if r.Members == 1 {
					pr = r.Promise
				} else {
					group = r.Promise
				}
			}
		}
		late := ""
		if undone > 0 {
			late = fmt.Sprintf("; %d runs not done in their bound (figures over the rows applied)", undone)
		}
		fmt.Fprintf(&b, "| %s | %s / %s / %s | %s / %s | %s / %s | %s / %s | %d/%d: %s%s |\n", p,
			cell("latency", func(r result) float64 { return r.P50 }), cell("latency", func(r result) float64 { return r.P99 }),
			cell("latency", func(r result) float64 { return r.P999 }),
			cell("live1", rps), cell("live4", rps), cell("drain1", rps), cell("drain4", rps), cell("drain1", cpu), cell("drain4", cpu),
			holds, runs, promiseText(pr, group), late)
	}
	var killed []string
	for _, p := range peersOf(rs) {
		if k := only(rs, "kill", p); len(k) > 0 {
			doubled, undone := 0, countUndone(k)
			for _, r := range k {
				doubled += r.Doubled
			}
			s := fmt.Sprintf("%s %d twice, resumed in %s s", p, doubled, num(median(k, func(r result) float64 { return r.ResumeSecs })))
			if undone > 0 {
				s += fmt.Sprintf(" (%d/%d runs not done in time)", undone, len(k))
			}
			killed = append(killed, s)
		}
	}
	if len(killed) > 0 {
		fmt.Fprintf(&b, "\nA consumer killed -9 mid-run, a new one started at once (rows applied twice, all passes; median time from the kill to the next effect): %s.\n", strings.Join(killed, "; "))
	}
	b.WriteString("\nGoals (issue 46), weft's medians:\n\n")
	lat := func(q func(result) float64) float64 { return median(only(rs, "latency", "weft"), q) }
	p50, p99 := lat(func(r result) float64 { return r.P50 }), lat(func(r result) float64 { return r.P99 })
	fmt.Fprintf(&b, "- append -> effect committed at 1,000 rows/s, p50 <= 2 ms and p99 <= 10 ms: %s / %s ms, %s", num(p50), num(p99), metText(p50 <= 2 && p99 <= 10))
	if w4 := only(rs, "latency4w", "weft"); len(w4) > 0 {
		p50, p99 := median(w4, func(r result) float64 { return r.P50 }), median(w4, func(r result) float64 { return r.P99 })
		fmt.Fprintf(&b, "; with 4 writers %s / %s ms (raw %s / %s), %s", num(p50), num(p99),
			num(median(only(rs, "latency4w", "raw"), func(r result) float64 { return r.P50 })),
			num(median(only(rs, "latency4w", "raw"), func(r result) float64 { return r.P99 })), metText(p50 <= 2 && p99 <= 10))
	}
	b.WriteString("\n")
	b.WriteString("- applied rows/s at least JetStream's, 10x River's and raw's:")
	for i, sc := range []string{"live1", "live4", "drain1", "drain4"} {
		rps := func(r result) float64 { return r.RowsPerSec }
		w := median(only(rs, sc, "weft"), rps)
		js, rv, raw := median(only(rs, sc, "jetstream"), rps), median(only(rs, sc, "river"), rps), median(only(rs, sc, "raw"), rps)
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %s %s", sep, sc, metText(w >= js && w >= 10*rv && w >= raw))
	}
	b.WriteString("\n")
	cpu := func(r result) float64 { return r.CPUUsPerRow }
	w, js := median(only(rs, "drain1", "weft"), cpu), median(only(rs, "drain1", "jetstream"), cpu)
	fmt.Fprintf(&b, "- CPU per row drained (consumer and its servers) <= JetStream's: %s against %s us, %s\n", num(w), num(js), metText(w <= js))
	return b.String()
}

// promiseText says what a peer promises, and what its group of 4
// promises where that differs.
func promiseText(one, group promise) string {
	if one == (promise{}) {
		one, group = group, promise{}
	}
	s := strings.TrimSuffix(promised(one), ", holds")
	if group != (promise{}) && group != one {
		s += "; a group of 4: " + strings.TrimSuffix(promised(group), ", holds")
	}
	return s
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func peersOf(rs []result) []string {
	var ps []string
	for _, r := range rs {
		if !slices.Contains(ps, r.Peer) {
			ps = append(ps, r.Peer)
		}
	}
	return ps
}

func only(rs []result, sc, peer string) []result {
	var out []result
	for _, r := range rs {
		if r.Scenario == sc && r.Peer == peer {
			out = append(out, r)
		}
	}
	return out
}

func countUndone(rs []result) int {
	n := 0
	for _, r := range rs {
		if !r.Done {
			n++
		}
	}
	return n
}

func median(rs []result, f figure) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
