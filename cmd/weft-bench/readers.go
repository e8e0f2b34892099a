package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// readerProc is one reader process (see reader.go), driven over its stdin
// and stdout.
type readerProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	done chan struct{}
}

// startReaders starts n reader processes (the benchmark's own binary in
// its hidden reader mode) and waits until each is ready.
func startReaders(ctx context.Context, n int, a readerArgs) ([]*readerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("readers: %w", err)
	}
	procs := make([]*readerProc, n)
	var g errgroup.Group
	for i := range procs {
		cmd := exec.Command(self, a.flags()...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		in, err := cmd.StdinPipe()
		if err != nil {
			closeReaders(procs)
			return nil, fmt.Errorf("readers: %w", err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			closeReaders(procs)
			return nil, fmt.Errorf("readers: %w", err)
		}
		if err := cmd.Start(); err != nil {
			closeReaders(procs)
			return nil, fmt.Errorf("readers: start: %w", err)
		}
		p := &readerProc{cmd: cmd, in: in, out: bufio.NewScanner(out), done: make(chan struct{})}
		p.out.Buffer(make([]byte, 64<<10), 256<<20)
		procs[i] = p
		g.Go(func() error {
			var r readerStat
			return p.await(ctx, &r)
		})
	}
	if err := g.Wait(); err != nil {
		closeReaders(procs)
		return nil, fmt.Errorf("readers: %w", err)
	}
	return procs, nil
}

// await reads the next reply line into v, bounded by ctx and 60 s.
func (p *readerProc) await(ctx context.Context, v any) error {
	got := make(chan error, 1)
	go func() {
		if !p.out.Scan() {
			got <- fmt.Errorf("reader %d exited: %w", p.cmd.Process.Pid, errors.Join(p.out.Err(), io.ErrUnexpectedEOF))
			return
		}
		got <- json.Unmarshal(p.out.Bytes(), v)
	}()
	select {
	case err := <-got:
		return err
	case <-ctx.Done():
		p.kill()
		<-got
		return ctx.Err()
	case <-time.After(60 * time.Second):
		p.kill()
		<-got
		return fmt.Errorf("reader %d: no answer in 60s", p.cmd.Process.Pid)
	}
}

func (p *readerProc) ask(ctx context.Context, cmd string, v any) error {
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		return fmt.Errorf("reader %d: %s: %w", p.cmd.Process.Pid, cmd, err)
	}
	return p.await(ctx, v)
}

func (p *readerProc) stat(ctx context.Context) (readerStat, error) {
	var s readerStat
	err := p.ask(ctx, "stat", &s)
	return s, err
}

func (p *readerProc) latencies(ctx context.Context) ([][2]int64, error) {
	var r struct {
		Lat [][2]int64 `json:"lat"`
	}
	err := p.ask(ctx, "lat", &r)
	return r.Lat, err
}

func (p *readerProc) kill() { _ = p.cmd.Process.Kill() }

// close ends the reader (stdin EOF) and waits for it, killing it after 10 s.
func (p *readerProc) close() {
	p.in.Close()
	exited := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		p.kill()
		<-exited
	}
}

// closeReaders closes every reader at once and waits for them all.
func closeReaders(procs []*readerProc) {
	var wg sync.WaitGroup
	for _, p := range procs {
		if p != nil {
			wg.Go(p.close)
		}
	}
	wg.Wait()
}

// stats asks every reader for its counters.
func stats(ctx context.Context, procs []*readerProc) ([]readerStat, error) {
	out := make([]readerStat, len(procs))
	for i, p := range procs {
		var err error
		if out[i], err = p.stat(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// untilAll asks every reader to answer once it has counted n rows, and
// returns their stats and when the last answer came.
func untilAll(ctx context.Context, procs []*readerProc, n int64, timeout time.Duration) ([]readerStat, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := make([]readerStat, len(procs))
	var g errgroup.Group
	for i, p := range procs {
		g.Go(func() error { return p.ask(ctx, "until "+strconv.FormatInt(n, 10), &out[i]) })
	}
	if err := g.Wait(); err != nil {
		return nil, time.Time{}, fmt.Errorf("readers: waiting for %d rows: %w", n, err)
	}
	return out, time.Now(), nil
}

// waitReaders polls the readers every few milliseconds until done holds for
// every one of them, or timeout passes. It returns the last stats and when
// done first held for all.
func waitReaders(ctx context.Context, procs []*readerProc, timeout time.Duration, done func(readerStat) bool) ([]readerStat, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := stats(ctx, procs)
		if err != nil {
			return nil, time.Time{}, err
		}
		now := time.Now()
		all := true
		for _, s := range st {
			all = all && done(s)
		}
		if all {
			return st, now, nil
		}
		if now.After(deadline) {
			return st, now, fmt.Errorf("readers: not done after %v: %+v", timeout, brief(st))
		}
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func brief(st []readerStat) []int64 {
	out := make([]int64, len(st))
	for i, s := range st {
		out[i] = s.Count
	}
	return out
}
