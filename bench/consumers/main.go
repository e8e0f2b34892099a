// Command consumers measures weft's Consumer and consumer groups beside
// what a Go team would pick for the same job: River (jobs in PostgreSQL),
// NATS JetStream (a durable pull consumer, the effect committed to
// PostgreSQL then acked) and a raw SELECT ... FOR UPDATE SKIP LOCKED loop.
// Every peer applies each row with one effect (an INSERT into an effects
// table in the consumer's transaction); the passes interleave the peers,
// and every figure is set beside raw's in the same pass.
//
//	consumers run -pg URL -redis URL [-quick] [-passes 3]   (run.sh starts the servers)
//	consumers produce ...   (a producer process the run starts)
//	consumers natsd ...     (a nats-server process the run starts)
//
// It writes JSON lines (one per pass, peer and scenario) and a markdown
// summary; the effects table of every scenario is checked for rows
// missing, doubled and out of order.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: consumers run|produce|natsd [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runMain(ctx, os.Args[2:])
	case "produce":
		err = produceMain(ctx, os.Args[2:])
	case "consume":
		err = consumeMain(ctx, os.Args[2:])
	case "natsd":
		err = natsdMain(ctx, os.Args[2:])
	case "render":
		err = renderMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		slog.Error("consumers", "err", err)
		os.Exit(1)
	}
}
