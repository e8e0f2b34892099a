package catchup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/fabric"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memSource is an in-memory Source over fixed rows, by writer.
type memSource struct {
	mu     sync.Mutex
	rows   map[string][]fabric.Row
	gone   bool
	err    error
	calls  atomic.Int64
	limits []int // limits asked for, in order
}

func newMemSource(rows map[string][]fabric.Row) *memSource { return &memSource{rows: rows} }

func (s *memSource) Updates(ctx context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
	s.calls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = append(s.limits, limit)
	switch {
	case s.gone:
		return nil, 0, fmt.Errorf("mem: writer %s restarted: %w", writer, fabric.ErrGone)
	case s.err != nil:
		return nil, 0, s.err
	}
	var out []fabric.Row
	for _, r := range s.rows[writer] {
		if r.Pos <= from || r.Pos > to {
			continue
		}
		if len(out) == limit {
			return out, out[len(out)-1].Pos, nil
		}
		out = append(out, r)
	}
	return out, to, nil
}

func (s *memSource) lastLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.limits) == 0 {
		return 0
	}
	return s.limits[len(s.limits)-1]
}

// rowsAt builds rows at the given positions, each {"p":pos}.
func rowsAt(pos ...int64) []fabric.Row {
	out := make([]fabric.Row, len(pos))
	for i, p := range pos {
		out[i] = fabric.Row{Pos: p, Rows: []byte(fmt.Sprintf(`[{"p": %d}]`, p))}
	}
	return out
}

var errBoom = errors.New("boom")

// goroutinesIn counts goroutines whose stack contains every one of fns
// (a function, a state such as "[select"): a test's way to know that
// callers are parked where it expects, without sleeping.
func goroutinesIn(fns ...string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !slices.ContainsFunc(fns, func(fn string) bool { return !strings.Contains(g, fn) }) {
			count++
		}
	}
	return count
}

// value reads a counter or gauge.
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}
