package faultproxy

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
)

// FreezeAtRows stops every byte once a matching statement's first row
// arrives: the server, sending an answer larger than the buffers between,
// waits on the client (ClientWrite) for as long as the freeze lasts; a
// new connection gets no answer; Close ends it all.
func TestPGFreezeAtRows(t *testing.T) {
	s := setupPG(t)
	s.p.SetUpstreamReadBuffer(16 << 10)
	arm(t, s.p, Rule{Fault: FreezeAtRows, Match: "generate_series"})
	conn := connect(t, s.through)
	done := make(chan error, 1)
	go func() {
		rows, err := conn.Query(context.Background(), "SELECT repeat('x', 1 << 20) FROM generate_series(1, 16)")
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
		}
		done <- err
	}()
	if !testenv.Poll(waitTimeout, func() bool { return s.p.Stats().Frozen }) {
		t.Fatalf("never froze: %+v", s.p.Stats())
	}
	direct := connect(t, s.direct)
	waiting := func() bool {
		var n int
		_ = direct.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE '%generate_series(1, 16)%' AND state = 'active' AND wait_event = 'ClientWrite'`).Scan(&n)
		return n == 1
	}
	if !testenv.Poll(waitTimeout, waiting) {
		t.Fatal("the server does not wait on the frozen client")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if c, err := pgx.Connect(ctx, s.through); err == nil {
		c.Close(context.Background())
		t.Fatal("a new connection through the frozen proxy was answered")
	}
	select {
	case err := <-done:
		t.Fatalf("the query ended during the freeze: %v", err)
	default:
	}
	s.p.Close()
	if err := <-done; err == nil {
		t.Fatal("the frozen query ended well once the proxy closed")
	}
}
