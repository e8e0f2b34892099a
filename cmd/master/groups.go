package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/weft-dev/weft/internal/control"
)

// groupsCmd lists the consumer groups stored in the database: what
// `master status` cannot, since the instances it asks are not members.
type groupsCmd struct {
	databaseURL
}

func (c groupsCmd) run(ctx context.Context, o out) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	groups, err := control.Groups(ctx, pool)
	if err != nil {
		return explainWritersError(pool, err)
	}
	printGroups(o.stdout, groups)
	return nil
}

// printGroups writes a line per group, then a line per member: whether it
// is live, the partitions it owns and its lag.
func printGroups(out io.Writer, groups []control.Group) {
	if len(groups) == 0 {
		fmt.Fprintln(out, "no consumer groups")
		return
	}
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	for i, g := range groups {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s of %s: key %s, %d partitions, %d unowned\n", g.Name, g.Stream, g.Key, g.Partitions, len(g.Unowned))
		fmt.Fprintln(w, "MEMBER\tLIVE\tOWNS\tLAG\tPARTITIONS")
		for _, m := range g.Members {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", m.Member, yesNo(m.Live), len(m.Partitions), m.LagPositions, ranges(m.Partitions))
		}
	}
	w.Flush()
}

// ranges writes ascending partitions as runs: 0-3,7,9-10.
func ranges(ps []int) string {
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ps[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ps[j]))
		}
		i = j + 1
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}
