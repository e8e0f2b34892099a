package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/app"
	"github.com/weft-dev/weft/instance"
	"github.com/weft-dev/weft/rooms"
	"github.com/weft-dev/weft/streams"
)

// allStreams are the durable streams the checks cover.
var allStreams = []streams.Config{rooms.Events()}

type migrateCmd struct{}

func (migrateCmd) Run(ctx context.Context, cfg *instance.Config) error {
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := rooms.Migrate(ctx, pool, cfg.Logger()); err != nil {
		return err
	}
	fmt.Println("schema up to date")
	return nil
}

type checkCmd struct {
	Repair bool `help:"Fix what the checks find (raise the sequence), in one locked transaction per stream."`
}

func (c checkCmd) Run(ctx context.Context, cfg *instance.Config) error {
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	failed := false
	for _, s := range allStreams {
		err := streams.Check(ctx, pool, s)
		switch {
		case err == nil:
			fmt.Printf("%s: ok\n", s.Name)
		case c.Repair:
			set, rerr := streams.Repair(ctx, pool, s)
			if rerr != nil {
				return rerr
			}
			fmt.Printf("%s: repaired: %s set to %d\n", s.Name, s.Sequence, set)
		default:
			failed = true
			fmt.Printf("%s: %v\n", s.Name, err)
		}
	}
	if failed {
		return errors.New("checks failed; run `master check --repair` to apply the fixes above")
	}
	return nil
}

type statusCmd struct {
	JSON bool   `name:"json" help:"Print the status as JSON."`
	URL  string `name:"url" help:"Base URL of the instance to ask; default the master's --advertise-url."`
}

func (c statusCmd) Run(ctx context.Context, cfg *instance.Config) error {
	base := c.URL
	if base == "" {
		base = cfg.Advertise()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/status", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("ask %s: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/status: %s", base, resp.Status)
	}
	if c.JSON {
		_, err := os.Stdout.Write(body)
		return err
	}
	var st app.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return err
	}
	return printStatus(os.Stdout, st)
}

func printStatus(out io.Writer, st app.Status) error {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "asked\t%s (%s, ready=%v, persisted-upto %d, token %s)\n\n", st.Instance, st.Role, st.Ready, st.PersistedUpto, st.Token)
	fmt.Fprintln(w, "INSTANCE\tNAME\tROLE\tURL\tWRITES")
	ids := make([]string, 0, len(st.Peers))
	for id := range st.Peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t(this instance)\n", st.Instance, st.Name, st.Role, st.URL)
	for _, id := range ids {
		p := st.Peers[id]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\n", id, p.Name, p.Role, p.URL, p.Writes)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "STREAM\tWRITER\tINSTANCE\tPOSITION\tANNOUNCED\tLAG\tCATCHING UP")
	for _, v := range st.Streams {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%v\n", v.Stream, v.Writer, v.Instance, v.Position, v.Announced, v.Lag, v.Catching)
	}
	if len(st.Writers) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "WRITER\tHOLDER\tLEASE UNTIL\tSEALED\tEPOCH")
		for _, wr := range st.Writers {
			until := "-"
			if !wr.LeaseUntil.IsZero() {
				until = wr.LeaseUntil.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%d\n", wr.Name, wr.Instance, until, wr.Sealed, wr.Epoch)
		}
	}
	return w.Flush()
}
