package catchup

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
)

// BenchmarkCatchup100k catches up 100,000 rows (about 100 bytes of JSON
// each) of one writer in pages of 10,000: "raw" is the floor (a pgx range
// read per page plus the JSON encoding of the response), "http" the whole
// path (Client.Updates over a real HTTP server backed by the SQLSource).
// Compare their rows/s.
func BenchmarkCatchup100k(b *testing.B) {
	const total, page = 100000, 10000
	pool, _ := testenv.NewPool(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE events (id bigint NOT NULL, writer text NOT NULL, rows jsonb NOT NULL, PRIMARY KEY (writer, id))`); err != nil {
		b.Fatal(err)
	}
	pad := strings.Repeat("x", 40)
	input := make([][]any, total)
	for i := range input {
		id := int64(i + 1)
		input[i] = []any{id, "w1", fmt.Sprintf(`[{"room":"!r%d:example.org","type":"m.text","body":"%s"}]`, id%97, pad)}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"id", "writer", "rows"}, pgx.CopyFromRows(input)); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE events"); err != nil {
		b.Fatal(err)
	}
	src := &SQLSource{Pool: pool, Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}

	report := func(b *testing.B, bytes int64) {
		secs := b.Elapsed().Seconds()
		b.ReportMetric(float64(total*b.N)/secs, "rows/s")
		b.ReportMetric(float64(total/page*b.N)/secs, "pages/s")
		b.ReportMetric(float64(bytes)/float64(total*b.N), "bytes/row")
	}

	b.Run("raw", func(b *testing.B) {
		// One range read of all rows, encoded as the same pages the server
		// sends: the floor under any catch-up path.
		var bytes int64
		buf := make([]byte, 0, 2<<20)
		for b.Loop() {
			n := 0
			var last int64
			buf = append(buf[:0], `{"rows":[`...)
			closePage := func(upto int64) {
				buf = append(buf, `],"upto":`...)
				buf = strconv.AppendInt(buf, upto, 10)
				buf = append(buf, `,"limited":`...)
				buf = strconv.AppendBool(buf, upto < total)
				buf = append(buf, '}')
				bytes += int64(len(buf))
				buf = append(buf[:0], `{"rows":[`...)
			}
			_, err := src.StreamUpdates(ctx, "w1", 0, total, total, func(pos int64, rows []byte) error {
				if n%page != 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, `{"pos":`...)
				buf = strconv.AppendInt(buf, pos, 10)
				buf = append(buf, `,"rows":`...)
				buf = append(buf, rows...)
				buf = append(buf, '}')
				n++
				last = pos
				if n%page == 0 {
					closePage(last)
				}
				return nil
			})
			if err != nil || n != total {
				b.Fatal(n, err)
			}
		}
		report(b, bytes)
	})

	b.Run("http", func(b *testing.B) {
		s, err := NewServer(ServerConfig{Secret: testSecret, Sources: map[string]Source{"events": src}})
		if err != nil {
			b.Fatal(err)
		}
		hs := httptest.NewServer(s)
		defer hs.Close()
		c, err := NewClient(ClientConfig{Secret: testSecret, Limit: page})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		for b.Loop() {
			rows, err := c.Updates(ctx, hs.URL, "events", "w1", 0, total)
			if err != nil {
				b.Fatal(err)
			}
			if len(rows) != total {
				b.Fatalf("%d rows", len(rows))
			}
		}
		report(b, int64(value(b, s.m.bytes.WithLabelValues("events"))))
	})
}
