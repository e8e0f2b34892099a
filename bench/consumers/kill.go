package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The kill scenario: one consumer, a process of its own, is killed -9
// while producers offer killRate rows/s, and a new one is started at
// once. It counts the rows applied twice (a peer that acks after its
// effect commits applies again the rows it had not acked) and the time
// from the kill to the next effect committed (the new process's start
// included).
const killRate = 2000 // rows/s, over the producers

// consumeMain runs members consumers until it is stopped (SIGTERM) or
// killed: the kill scenario's consumer process.
func consumeMain(ctx context.Context, args []string) error {
	var e env
	fs := flag.NewFlagSet("consume", flag.ExitOnError)
	peerName := fs.String("peer", "", "peer")
	members := fs.Int("members", 1, "consumers")
	fs.StringVar(&e.DB, "db", "", "database URL")
	fs.StringVar(&e.Redis, "redis", "", "Redis URL")
	fs.StringVar(&e.NATS, "nats", "", "NATS URL")
	fs.StringVar(&e.Cluster, "cluster", "", "weft cluster")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := peerByName(*peerName)
	if err != nil {
		return err
	}
	stop, err := p.Consume(ctx, e, consumeOpts{Members: *members, Applied: new(atomic.Int64)})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	return stop()
}

// consumerProcess starts a consume process and waits for it to be ready.
func (o runOpts) consumerProcess(ctx context.Context, peer string, e env) (*exec.Cmd, error) {
	cmd := exec.Command(o.self, "consume", "-peer", peer, "-db", e.DB, "-redis", e.Redis, "-nats", e.NATS, "-cluster", e.Cluster)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("consumer process: %q %v", line, err)
	}
	return cmd, nil
}

// killRun runs the kill scenario; it fills r.Rows, r.Done, r.ResumeSecs
// and sent.
func (o runOpts) killRun(ctx context.Context, p peer, e env, r *result, sent map[int]int) error {
	sz := o.sizes()
	r.Rows = sz.Kill
	first, err := o.consumerProcess(ctx, p.Name(), e)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, e.DB)
	if err != nil {
		_ = first.Process.Kill()
		return errors.Join(err, first.Wait())
	}
	defer conn.Close(context.Background())
	count := func() (int, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n)
		return n, err
	}
	ps := o.split(r.Rows, sent)
	for i := range ps {
		ps[i].Rate = killRate / len(ps)
	}
	var wg sync.WaitGroup
	var perr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, perr = o.produce(ctx, p.Name(), e, ps)
	}()
	defer wg.Wait()
	// Kill it a third of the way through.
	var n int
	for deadline := time.Now().Add(sz.Timeout); n < r.Rows/3; time.Sleep(5 * time.Millisecond) {
		if n, err = count(); err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("%d of %d rows applied in %v: no kill", n, r.Rows, sz.Timeout)
		}
		if err != nil {
			_ = first.Process.Kill()
			return errors.Join(err, first.Wait())
		}
	}
	_ = first.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	_ = first.Wait()
	atKill, err := count()
	if err != nil {
		return err
	}
	second, err := o.consumerProcess(ctx, p.Name(), e)
	if err != nil {
		return err
	}
	defer func() {
		_ = second.Process.Signal(syscall.SIGTERM)
		_ = second.Wait()
	}()
	for deadline := time.Now().Add(sz.Timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n, err = count(); err != nil {
			return err
		}
		if n > atKill {
			r.ResumeSecs = time.Since(killed).Seconds()
			break
		}
	}
	wg.Wait()
	if perr != nil {
		return perr
	}
	r.Done, err = o.waitApplied(ctx, e.DB, new(atomic.Int64), r.Rows, sz.Timeout)
	return err
}
