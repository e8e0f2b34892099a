package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, 100 on Linux.
const clockTick = 100

// cpuSample is CPU time used so far: this process (the consumers; the
// producers are processes of their own and not counted), the PostgreSQL
// cluster (the postmaster, its live children, and the children it has
// reaped: backends that ended), redis-server and nats-server.
type cpuSample struct {
	Self, PG, Redis, NATS time.Duration
}

type cpuPids struct{ PG, Redis, NATS int }

func sampleCPU(p cpuPids) cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if p.PG > 0 {
		own, reaped := procCPU(p.PG)
		s.PG = own + reaped
		for _, c := range children(p.PG) {
			own, _ := procCPU(c)
			s.PG += own
		}
	}
	if p.Redis > 0 {
		s.Redis, _ = procCPU(p.Redis)
	}
	if p.NATS > 0 {
		s.NATS, _ = procCPU(p.NATS)
	}
	return s
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{s.Self - o.Self, s.PG - o.PG, s.Redis - o.Redis, s.NATS - o.NATS}
}

// procCPU reads utime+stime and cutime+cstime of /proc/<pid>/stat.
func procCPU(pid int) (own, reaped time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The fields after the command name, which may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 15 {
		return 0, 0
	}
	tick := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(v) * time.Second / clockTick
	}
	// f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
	return tick(11) + tick(12), tick(13) + tick(14)
}

// children scans /proc for the processes whose parent is pid.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

func readPidfile(path string) int {
	if path == "" {
		return 0
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}
