package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The suite is bound by CPU on 2 cores, so where the CPU goes says more
// than where the wall time goes: a test binary's CPU is its own plus that
// of every process it started (the binaries of a cluster, its private
// PostgreSQL and Redis). Linux's process accounting records each process
// when it ends, with its parent; `make test-cpu` turns it on around the
// suite and hands `dump-acct`'s lines to `weft-testrun cpu`.

// acctProc is one line of dump-acct: a process that ended.
type acctProc struct {
	comm       string
	cpu        float64 // user + system seconds
	pid, ppid  int
	start, end time.Time
}

// parseAcct reads dump-acct's lines ("comm|v3|utime|stime|etime|uid|gid|
// mem|io|pid|ppid|flags|exit|tty|start", times in hundredths of a
// second). Lines it cannot read are counted, not fatal.
func parseAcct(r io.Reader) (procs []acctProc, bad int, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) < 15 {
			bad++
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		ut, e1 := strconv.ParseFloat(f[2], 64)
		st, e2 := strconv.ParseFloat(f[3], 64)
		et, e3 := strconv.ParseFloat(f[4], 64)
		pid, e4 := strconv.Atoi(f[9])
		ppid, e5 := strconv.Atoi(f[10])
		start, e6 := time.ParseInLocation("Mon Jan _2 15:04:05 2006", f[14], time.Local)
		if e1 != nil || e2 != nil || e3 != nil || e4 != nil || e5 != nil || e6 != nil {
			bad++
			continue
		}
		procs = append(procs, acctProc{comm: f[0], cpu: (ut + st) / 100, pid: pid, ppid: ppid,
			start: start, end: start.Add(time.Duration(et * float64(time.Second) / 100))})
	}
	return procs, bad, sc.Err()
}

// isTestBinary: go test's binaries are named pkg.test, and the kernel
// keeps 15 bytes of a name.
func isTestBinary(comm string) bool {
	if strings.HasSuffix(comm, ".test") {
		return true
	}
	i := strings.LastIndexByte(comm, '.')
	return len(comm) == 15 && i > 0 && strings.HasPrefix(".test", comm[i:])
}

// kind names what a process was: redis-server's threads end under names
// of their own, and PostgreSQL's backends are all "postgres".
func kind(comm string) string {
	switch {
	case strings.HasPrefix(comm, "bio_"), strings.HasPrefix(comm, "jemalloc_bg"), strings.HasPrefix(comm, "io_thd_"):
		return "redis-server"
	case comm == "postmaster":
		return "postgres"
	}
	return comm
}

var buildTools = map[string]bool{"go": true, "compile": true, "link": true, "asm": true, "cgo": true, "vet": true,
	"cover": true, "gcc": true, "cc1": true, "as": true, "ld": true, "collect2": true, "staticcheck": true}

// bucket is where a process's CPU is counted: the test binary it ran
// under, the build, the shared PostgreSQL, or other.
func bucket(p acctProc, parent func(acctProc) (acctProc, bool)) string {
	for x, hops := p, 0; hops < 64; hops++ {
		if isTestBinary(x.comm) {
			return x.comm
		}
		var ok bool
		if x, ok = parent(x); !ok {
			break
		}
	}
	switch k := kind(p.comm); {
	case buildTools[k]:
		return "(go build, vet)"
	case k == "postgres":
		return "(PostgreSQL not started by a test: the shared server)"
	default:
		return "(other: " + k + ")"
	}
}

// writeCPU prints the CPU of the processes that ended, by test binary,
// with what in each took it.
func writeCPU(out io.Writer, in io.Reader, top int) error {
	procs, bad, err := parseAcct(in)
	if err != nil {
		return err
	}
	// Process IDs are reused (pid_max is often 32768): a parent is the
	// process of that ID alive when the child started.
	byPID := map[int][]acctProc{}
	for _, p := range procs {
		byPID[p.pid] = append(byPID[p.pid], p)
	}
	const slack = time.Second // start times are to the second
	parent := func(c acctProc) (acctProc, bool) {
		for _, p := range byPID[c.ppid] {
			if !p.start.After(c.start.Add(slack)) && !p.end.Before(c.start.Add(-slack)) {
				return p, true
			}
		}
		return acctProc{}, false
	}
	type row struct {
		name  string
		cpu   float64
		kinds map[string]float64
	}
	rows := map[string]*row{}
	var total float64
	for _, p := range procs {
		b := bucket(p, parent)
		r := rows[b]
		if r == nil {
			r = &row{name: b, kinds: map[string]float64{}}
			rows[b] = r
		}
		r.cpu += p.cpu
		r.kinds[kind(p.comm)] += p.cpu
		total += p.cpu
	}
	sorted := slices.SortedFunc(func(yield func(*row) bool) {
		for _, r := range rows {
			if !yield(r) {
				return
			}
		}
	}, func(a, b *row) int { return cmp.Or(cmp.Compare(b.cpu, a.cpu), cmp.Compare(a.name, b.name)) })
	fmt.Fprintf(out, "%.0f CPU-seconds in %d processes that ended", total, len(procs))
	if bad > 0 {
		fmt.Fprintf(out, " (%d lines not read)", bad)
	}
	fmt.Fprint(out, "\n\n")
	fmt.Fprintf(out, "%8s %6s  %s\n", "CPU s", "share", "test binary (or other): its processes by name, CPU s")
	for i, r := range sorted {
		if i == top {
			break
		}
		type kv struct {
			k string
			v float64
		}
		var ks []kv
		for k, v := range r.kinds {
			ks = append(ks, kv{k, v})
		}
		slices.SortFunc(ks, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
		var parts []string
		for _, x := range ks[:min(len(ks), 5)] {
			parts = append(parts, fmt.Sprintf("%s %.0f", x.k, x.v))
		}
		fmt.Fprintf(out, "%8.1f %5.1f%%  %s: %s\n", r.cpu, 100*r.cpu/max(total, 1e-9), r.name, strings.Join(parts, ", "))
	}
	return nil
}
