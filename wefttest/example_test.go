package wefttest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// databaseURL is the examples' database (a test has wefttest.Database).
var databaseURL string

func TestMain(m *testing.M) {
	u, drop, err := testenv.MainDatabase()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
		os.Exit(1)
	}
	databaseURL = u
	code := m.Run()
	drop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type order struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// ship is the consumer's function under test: it ships each order, and
// refuses one of no items for good.
func ship(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
	for _, r := range rows {
		var o order
		if err := r.Decode(&o); err != nil {
			return weft.Permanent(err)
		}
		if o.Qty <= 0 {
			return weft.Permanent(fmt.Errorf("order at %d: %d items", r.Pos, o.Qty))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO shipped (pos, item, qty) VALUES ($1, $2, $3)`, r.Pos, o.Item, o.Qty); err != nil {
			return err
		}
	}
	return nil
}

// A consumer's function tested on its own, against a real database: no
// node, no Redis. Its effects commit when it succeeds; when it fails,
// none of them stays.
func ExampleApply() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, databaseURL) // in a test: wefttest.Database(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE shipped (item text PRIMARY KEY, pos bigint, qty int)`); err != nil {
		fmt.Println(err)
		return
	}

	err = wefttest.Apply(ctx, db, ship, wefttest.RowsOf("orders", order{"lamp", 1}, order{"desk", 2})...)
	fmt.Println("applied:", err)

	err = wefttest.Apply(ctx, db, ship, wefttest.RowsOf("orders", order{"chair", 4}, order{"sofa", 0})...)
	fmt.Println(err)

	rows, _ := db.Query(ctx, `SELECT item FROM shipped ORDER BY pos`)
	items, err := pgx.CollectRows(rows, pgx.RowTo[string])
	fmt.Println("shipped:", items, err)
	// Output:
	// applied: <nil>
	// wefttest: apply: the function failed: permanent: order at 2: 0 items
	// shipped: [lamp desk] <nil>
}
