package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/control"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
)

// consumersCmd lists the consumers and groups stored in the database and
// changes their control state (internal/control, which weft.Node's
// PauseConsumer, ResumeConsumer and SeekConsumer run on too):
// a running consumer notices within about a second, in every process.
type consumersCmd struct {
	List   consumersListCmd `cmd:"" default:"withargs" help:"List every consumer and group (the default): stream, kind, cursor, lag, paused, failing positions, dead letters."`
	Pause  consumerCmd      `cmd:"" help:"Pause a consumer or group: it finishes its batches in flight and applies nothing until resumed."`
	Resume consumerCmd      `cmd:"" help:"Resume a paused consumer or group."`
	Seek   consumerSeekCmd  `cmd:"" help:"Move a consumer's or group's cursor: the rows after it are applied (again, if they were)."`

	DeadLetters deadLettersCmd `cmd:"" name:"dead-letters" help:"List, retry or discard a consumer's dead letters (rows its function failed on after its last attempt)."`
}

type consumersListCmd struct {
	databaseURL
}

// consumerCmd names one consumer or group.
type consumerCmd struct {
	databaseURL
	Stream string `arg:"" help:"The stream."`
	Name   string `arg:"" help:"The consumer's or group's name."`
}

type consumerSeekCmd struct {
	consumerCmd
	To string `name:"to" required:"" placeholder:"start|end|POS|TIME" help:"Where: start (every row again), end (skip every row written so far), a position, or an RFC 3339 time (by the database's clock, to about a second)."`
}

func (c consumerCmd) validate() error {
	if !wire.ValidName(c.Stream) {
		return fmt.Errorf("STREAM %q: want 1-128 of [A-Za-z0-9_.:-]", c.Stream)
	}
	if err := instance.ValidName(c.Name); err != nil {
		return fmt.Errorf("NAME: %w", err)
	}
	return nil
}

func (c consumerSeekCmd) target() (control.Target, error) {
	if err := c.validate(); err != nil {
		return control.Target{}, err
	}
	to, err := control.ParseTarget(c.To)
	if err != nil {
		return control.Target{}, fmt.Errorf("--to: %w", err)
	}
	return to, nil
}

func (c consumersListCmd) run(ctx context.Context, o out) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cs, err := control.Consumers(ctx, pool)
	if err != nil {
		return explainConsumersError(pool, err)
	}
	printConsumers(o.stdout, cs)
	return nil
}

// printConsumers writes a line per consumer or group.
func printConsumers(out io.Writer, cs []control.Consumer) {
	if len(cs) == 0 {
		fmt.Fprintln(out, "no consumers")
		return
	}
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "STREAM\tNAME\tKIND\tCURSOR\tLAG\tPAUSED\tFAILING\tDEAD")
	for _, c := range cs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", c.Stream, c.Name, c.Kind(), c.Pos, c.LagPositions, yesNo(c.Paused),
			count(c.Failing), count(c.DeadLetters))
	}
	w.Flush()
}

// count is a count that may be unknown ("-": the database has no such
// table yet).
func count(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

// change runs pause or resume.
func (c consumerCmd) change(ctx context.Context, o out, pause bool) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	verb, change := "resumed", control.Resume
	if pause {
		verb, change = "paused", control.Pause
	}
	if err := change(ctx, pool, c.Stream, c.Name); err != nil {
		return explainConsumerError(pool, c, err)
	}
	fmt.Fprintf(o.stdout, "%s of %s: %s\n", c.Name, c.Stream, verb)
	return nil
}

func (c consumerSeekCmd) seek(ctx context.Context, o out, to control.Target) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	pos, err := control.Seek(ctx, pool, c.Stream, c.Name, to)
	if err != nil {
		return explainConsumerError(pool, c.consumerCmd, err)
	}
	fmt.Fprintf(o.stdout, "%s of %s: cursor at %d (seek to %s)\n", c.Name, c.Stream, pos, to)
	return nil
}

// explainConsumerError says how to find a consumer's name when none is
// stored by that one, and what to do when the tables are older than the
// command.
func explainConsumerError(pool *pgxpool.Pool, c consumerCmd, err error) error {
	if errors.Is(err, control.ErrUnknownConsumer) {
		return fmt.Errorf("no consumer or group %s of stream %s is stored (`master consumers` lists them)", c.Name, c.Stream)
	}
	return explainConsumersError(pool, err)
}

// sqlUndefinedColumn is the SQLSTATE of a query on a column that does
// not exist: a database migrated by an older master.
const sqlUndefinedColumn = "42703"

func explainConsumersError(pool *pgxpool.Pool, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == sqlUndefinedTable || pe.Code == sqlUndefinedColumn) {
		return fmt.Errorf("the database's weft tables are older than this command (%s): run `master migrate` first", pe.Message)
	}
	return server.ExplainDBError(pool, err)
}
