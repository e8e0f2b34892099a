package main

import (
	"bytes"
	"strings"
	"testing"
)

// dump-acct's lines for: a go build (compile), the e2e binary test.test
// (pid 100) with a worker (101) and its private postgres (102, one
// backend 103); a second test binary whose name the kernel cut to 15
// bytes (pid 200), started after test.test ended and given pid 101 for
// its redis-server thread (pid reuse); a backend of the shared
// PostgreSQL; a child of the second pid 101, which must not be counted
// under the first; and a line that is not one.
const acctLines = `compile         |v3|   500.00|   100.00|   800.00|     0|     0|  2592.00|     0.00|      50|      40|     |       0|__      |Tue Dec  8 00:00:00 2026
worker          |v3|  2000.00|   500.00|  5000.00|     0|     0|  2592.00|     0.00|     101|     100|     |       0|__      |Tue Dec  8 00:00:10 2026
postgres        |v3|   300.00|   100.00|  5000.00|     0|     0|  2592.00|     0.00|     103|     102|     |       0|__      |Tue Dec  8 00:00:11 2026
postgres        |v3|   100.00|     0.00|  5000.00|     0|     0|  2592.00|     0.00|     102|     100|     |       0|__      |Tue Dec  8 00:00:10 2026
test.test       |v3|  1000.00|   200.00|  6000.00|     0|     0|  2592.00|     0.00|     100|      99|     |       0|__      |Tue Dec  8 00:00:05 2026
bio_lazy_free   |v3|    50.00|    50.00|  1000.00|     0|     0|  2592.00|     0.00|     101|     200|     |       0|__      |Tue Dec  8 00:02:00 2026
weft-testrun.te |v3|   100.00|     0.00|  2000.00|     0|     0|  2592.00|     0.00|     200|      99|     |       0|__      |Tue Dec  8 00:01:55 2026
redis-check     |v3|   100.00|     0.00|   100.00|     0|     0|  2592.00|     0.00|     104|     101|     |       0|__      |Tue Dec  8 00:02:01 2026
postgres        |v3|   700.00|     0.00|   100.00|     0|     0|  2592.00|     0.00|     300|       1|     |       0|__      |Tue Dec  8 00:00:30 2026
not a line
`

func TestCPU(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"cpu"}, strings.NewReader(acctLines), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	lacks(t, "cpu", got,
		"58 CPU-seconds in 9 processes that ended (1 lines not read)",
		"    42.0  72.4%  test.test: worker 25, test.test 12, postgres 5\n",
		"     7.0  12.1%  (PostgreSQL not started by a test: the shared server): postgres 7\n",
		"     6.0  10.3%  (go build, vet): compile 6\n",
		"     3.0   5.2%  weft-testrun.te: redis-check 1, redis-server 1, weft-testrun.te 1\n",
	)
}
