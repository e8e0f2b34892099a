package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weft-dev/weft/internal/control"
)

// deadLettersCmd lists, re-drives and discards a consumer's dead letters
// (internal/control, which weft.Node's DeadLetters,
// RetryDeadLetter and DiscardDeadLetter run on too).
type deadLettersCmd struct {
	List    consumerCmd   `cmd:"" help:"List a consumer's or group's dead letters: position, partition, key, attempts, when, retry asked, error."`
	Retry   deadLetterCmd `cmd:"" help:"Ask that a dead letter be applied again by a running process of the consumer (within about a second); if it fails again it stays."`
	Discard deadLetterCmd `cmd:"" help:"Delete a dead letter: it is never applied."`
}

// deadLetterCmd names one dead letter: a consumer's position (a group's
// every partition's at it).
type deadLetterCmd struct {
	consumerCmd
	Pos int64 `arg:"" help:"The dead letter's position."`
}

func (c deadLetterCmd) validate() error {
	if c.Pos <= 0 {
		return fmt.Errorf("POS %d: a position is above 0", c.Pos)
	}
	return c.consumerCmd.validate()
}

func (c consumerCmd) listDeadLetters(ctx context.Context, o out) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	ds, err := control.DeadLetters(ctx, pool, c.Stream, c.Name)
	if err != nil {
		return explainConsumersError(pool, err)
	}
	printDeadLetters(o.stdout, c, ds)
	return nil
}

// errorWidth bounds the error text printed of a dead letter (the whole
// is in weft_dead_letters and control.DeadLetters).
const errorWidth = 72

func printDeadLetters(out io.Writer, c consumerCmd, ds []control.DeadLetter) {
	if len(ds) == 0 {
		fmt.Fprintf(out, "no dead letters of %s of %s\n", c.Name, c.Stream)
		return
	}
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POS\tPARTITION\tKEY\tROWS\tATTEMPTS\tDEAD AT\tRETRY ASKED\tERROR")
	for _, d := range ds {
		part, retry := "-", "-"
		if d.Partition >= 0 {
			part = strconv.Itoa(d.Partition)
		}
		if !d.RetryRequestedAt.IsZero() {
			retry = d.RetryRequestedAt.UTC().Format(time.RFC3339)
		}
		msg := strings.Join(strings.Fields(d.Error), " ")
		if len(msg) > errorWidth {
			msg = msg[:errorWidth-3] + "..."
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.Pos, part, cmp(d.Key, "-"), len(d.Rows), d.Attempts,
			d.DeadAt.UTC().Format(time.RFC3339), retry, msg)
	}
	w.Flush()
}

func cmp(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

// change runs retry or discard.
func (c deadLetterCmd) change(ctx context.Context, o out, retry bool) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	what, change := "discarded", control.DiscardDeadLetter
	if retry {
		what, change = "retry requested (a running process of it applies it within about a second)", control.RetryDeadLetter
	}
	if err := change(ctx, pool, c.Stream, c.Name, c.Pos); err != nil {
		if errors.Is(err, control.ErrNoDeadLetter) {
			return fmt.Errorf("no dead letter at %d of %s of %s (`master consumers dead-letters list %s %s` lists them)",
				c.Pos, c.Name, c.Stream, c.Stream, c.Name)
		}
		return explainConsumersError(pool, err)
	}
	fmt.Fprintf(o.stdout, "dead letter %d of %s of %s: %s\n", c.Pos, c.Name, c.Stream, what)
	return nil
}
