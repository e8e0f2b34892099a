package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/catchup"
)

// The catch-up measurement: 100,000 rows of one writer (about 200 bytes of
// JSON each) read back over the real catch-up path, a catchup.Client
// paging through the HTTP endpoint of a catchup.Server backed by the
// SQLSource, against the floor under any catch-up: one range read of the
// same rows plus the JSON encoding of the same pages. Each side runs
// twice per run and keeps its faster pass (the first warms the caches).
const (
	catchupRows = 100_000
	catchupPage = 10_000
)

func measureCatchup(ctx context.Context, e *benchEnv) ([]Sample, error) {
	db, err := newDatabase(ctx, e.adminURL, 8, e.syncCommit)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	input := make([][]any, catchupRows)
	for i := range input {
		id := int64(i + 1)
		input[i] = []any{id, "w1", string(makeRow(id, 0))}
	}
	if _, err := db.Pool.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"stream_id", "writer", "rows"}, pgx.CopyFromRows(input)); err != nil {
		return nil, fmt.Errorf("load rows: %w", err)
	}
	if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE events"); err != nil {
		return nil, err
	}
	src := sqlSource(db.Pool)

	raw := func() (time.Duration, error) {
		start := time.Now()
		buf := make([]byte, 0, 4<<20)
		n := 0
		closePage := func(upto int64) {
			buf = append(buf, `],"upto":`...)
			buf = strconv.AppendInt(buf, upto, 10)
			buf = append(buf, `,"limited":`...)
			buf = strconv.AppendBool(buf, upto < catchupRows)
			buf = append(buf, '}')
			buf = append(buf[:0], `{"rows":[`...)
		}
		buf = append(buf, `{"rows":[`...)
		_, err := src.StreamUpdates(ctx, "w1", 0, catchupRows, catchupRows, func(pos int64, rows []byte) error {
			if n%catchupPage != 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"pos":`...)
			buf = strconv.AppendInt(buf, pos, 10)
			buf = append(buf, `,"rows":`...)
			buf = append(buf, rows...)
			buf = append(buf, '}')
			n++
			if n%catchupPage == 0 {
				closePage(pos)
			}
			return nil
		})
		if err == nil && n != catchupRows {
			err = fmt.Errorf("raw read %d rows", n)
		}
		return time.Since(start), err
	}

	url, stopServing, err := serveCatchup(src, e.log)
	if err != nil {
		return nil, err
	}
	defer stopServing()
	client, err := catchup.NewClient(catchup.ClientConfig{Secret: benchSecret, Limit: catchupPage})
	if err != nil {
		return nil, err
	}
	defer client.Close()
	weft := func() (time.Duration, error) {
		start := time.Now()
		rows, err := client.Updates(ctx, url, "events", "w1", 0, catchupRows)
		if err == nil && len(rows) != catchupRows {
			err = fmt.Errorf("caught up %d rows", len(rows))
		}
		return time.Since(start), err
	}

	best := func(f func() (time.Duration, error)) (float64, error) {
		var b time.Duration
		for i := range 2 {
			d, err := f()
			if err != nil {
				return 0, err
			}
			if i == 0 || d < b {
				b = d
			}
		}
		return b.Seconds(), nil
	}
	rawSecs, err := best(raw)
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}
	weftSecs, err := best(weft)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return nil, fmt.Errorf("weft: %w", err)
	}
	e.log.Info("catch-up", "weft_s", weftSecs, "raw_s", rawSecs)
	const group = "Catch-up"
	return []Sample{{ID: "catchup.100k", Group: group, Unit: "s",
		Name: "100,000 rows over HTTP (catchup.Client, pages of 10,000)",
		Weft: weftSecs, Raw: rawSecs, HasRaw: true, Goal: &Goal{Kind: GoalRatioAtMost, Value: 1.3},
		Note: "raw: one range read of the rows plus the JSON encoding of the same pages"}}, nil
}

// serveCatchup serves the events stream from src over HTTP on a free
// local port until the returned stop is called, and returns its base URL.
func serveCatchup(src catchup.Source, log *slog.Logger) (base string, stop func(), err error) {
	srv, err := catchup.NewServer(catchup.ServerConfig{Secret: benchSecret, Sources: map[string]catchup.Source{"events": src}, Logger: log})
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := catchup.NewHTTPServer(l.Addr().String(), srv)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(l) }()
	return "http://" + l.Addr().String(), func() {
		_ = hs.Close()
		<-served
	}, nil
}
