package wefttest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// Apply gives the function the rows as given, in one transaction it
// commits; the function's error comes back findable with errors.Is, and
// nothing of the failed transaction stays.
func TestApply(t *testing.T) {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, wefttest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE seen (pos bigint, stream text, writer text, n int)`); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	record := func(fail bool) weft.ConsumerFunc {
		return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
			for _, r := range rows {
				var n int
				if err := r.Decode(&n); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4)`, r.Pos, r.Stream, r.Writer, n); err != nil {
					return err
				}
			}
			if fail {
				return boom
			}
			return nil
		}
	}
	if err := wefttest.Apply(ctx, db, record(false), wefttest.RowsOf("s", 10, 20)...); err != nil {
		t.Fatal(err)
	}
	if err := wefttest.Apply(ctx, db, record(true), wefttest.RowsOf("s", 30)...); !errors.Is(err, boom) {
		t.Fatalf("a failing function: %v; want boom", err)
	}
	var got []string
	rows, _ := db.Query(ctx, `SELECT format('%s@%s/%s=%s', stream, pos, writer, n) FROM seen ORDER BY pos`)
	if got, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{"s@1/wefttest=10", "s@2/wefttest=20"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("effects %v; want %v (the failed one's rolled back)", got, want)
	}
}
