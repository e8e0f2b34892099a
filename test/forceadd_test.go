package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/testenv"
)

// A name no instance runs, force-added (issue 45, case 3): only the rooms
// that moved to it wait, and a write to one answers 503 at the server's
// deadline instead of hanging; the rooms that stayed are written through
// every instance as before; removing the name brings the moved rooms
// back. On 1995db6 every write of the cluster hung until an instance
// named ghost started.
func TestForceAddOfANameNobodyRuns(t *testing.T) {
	timed(t)
	_, c, master, ws := newFleet(t, nil, "persister1", "persister2")
	p1, p2 := ws[0], ws[1]
	procs := []*proc{master, p1, p2}

	with := []string{"persister1", "persister2", "ghost"}
	var stayed, moved []string
	for i := 0; len(stayed) < 12 || len(moved) < 2; i++ {
		room := fmt.Sprintf("!f%d:test", i)
		if shard.Owner(room, with) == "ghost" {
			moved = append(moved, room)
		} else {
			stayed = append(stayed, room)
		}
	}
	moved, stayed = moved[:2], stayed[:12]
	n := 0
	write := func(p *proc, room string, timeout time.Duration) (int, time.Duration, error) {
		n++
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		code, err := roomsapi.Call(ctx, "POST", messagesURL(p.url, room),
			map[string]string{"sender": "@a:x", "body": "hi", "txn_id": fmt.Sprint("t", n)}, nil)
		return code, time.Since(start), err
	}
	for _, room := range append(slices.Clone(stayed), moved...) { // every room has a writer already
		if _, _, err := write(master, room, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	writers(t, c, "add", "ghost", "--force")
	awaitEpoch(t, procs, 2)
	var took []time.Duration
	for i, room := range stayed {
		p := procs[i%len(procs)]
		code, d, err := write(p, room, 30*time.Second)
		if err != nil {
			t.Fatalf("write to %s (stayed with %s) through %s: %d %v", room, shard.Owner(room, with), p.name, code, err)
		}
		took = append(took, d)
	}
	slices.Sort(took)
	t.Logf("writes to rooms that stayed, with ghost in the map: median %v, slowest %v", took[len(took)/2], took[len(took)-1])
	// The issue asks for 1 s; a starved host (load 20) gets more room for
	// its slowest, never the 70 s of a write that waits on ghost.
	if took[len(took)/2] > time.Second || took[len(took)-1] > 5*time.Second {
		t.Errorf("writes to rooms that stayed took %v (median) and %v (slowest): want within 1 s and 5 s", took[len(took)/2], took[len(took)-1])
	}
	code, d, err := write(p1, moved[0], time.Minute)
	if code != 503 || err == nil || d > 40*time.Second {
		t.Errorf("a write to %s (moved to ghost): %d after %v (%v), want 503 within the server's deadline (15 s)", moved[0], code, d.Round(time.Millisecond), err)
	}
	t.Logf("a write to a room of ghost answered %d after %v", code, d.Round(time.Millisecond))

	writers(t, c, "remove", "ghost")
	awaitEpoch(t, procs, 3)
	for _, room := range moved {
		testenv.WaitFor(t, 30*time.Second, func() error {
			_, _, err := write(p2, room, 5*time.Second)
			return err
		})
	}
}

// writers runs `master writers <args>` against the cluster's database.
func writers(t *testing.T, c *cluster, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "master"), append([]string{"writers"}, args...)...)
	cmd.Env = append(os.Environ(), "WEFT_DATABASE_URL="+c.dbURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("master writers %v: %v\n%s", args, err, out)
	}
	t.Logf("master writers %v: %s", args, out)
}

// awaitEpoch waits until every one of procs follows the map at epoch.
func awaitEpoch(t *testing.T, procs []*proc, epoch int64) {
	t.Helper()
	for _, p := range procs {
		testenv.WaitFor(t, 30*time.Second, func() error {
			var st struct {
				ShardMap *struct {
					Epoch int64 `json:"epoch"`
				} `json:"shard_map"`
			}
			if err := get(context.Background(), 2*time.Second, p.url+"/status", &st); err != nil {
				return err
			}
			if st.ShardMap == nil || st.ShardMap.Epoch < epoch {
				return fmt.Errorf("%s: shard map %+v, want epoch %d", p.name, st.ShardMap, epoch)
			}
			return nil
		})
	}
}
