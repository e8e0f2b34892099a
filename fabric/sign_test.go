package fabric

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/testenv"
)

func TestSignerRoundTripAndTamper(t *testing.T) {
	s := newSigner("k1")
	line := []byte(`RDATA events w-aaaaaaaa 1 2 [{"a":" #x"}]`)
	signed := s.sign(append([]byte(nil), line...))
	got, ok := s.verify(signed)
	if !ok || string(got) != string(line) {
		t.Fatalf("verify(sign(x)) = %q, %v", got, ok)
	}
	for name, bad := range map[string][]byte{
		"unsigned":    line,
		"other key":   newSigner("k2").sign(append([]byte(nil), line...)),
		"tampered":    []byte(strings.Replace(string(signed), " 1 2 ", " 1 9 ", 1)),
		"short":       []byte("BYE x"),
		"sig mangled": append(append([]byte(nil), signed[:len(signed)-1]...), 'A'),
	} {
		if _, ok := s.verify(bad); ok {
			t.Errorf("%s line verified", name)
		}
	}
	if newSigner("") != nil {
		t.Fatal("an empty secret must mean no signing")
	}
}

// With a cluster secret, a forged position far ahead (the attack that
// would make readers skip a writer's rows) is counted and ignored, and the
// reader still gets every real row exactly once.
func TestNodeRejectsForgedCommands(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	signed := clusterOpts{tune: func(c *Config) { c.Secret = "cluster-secret" }}
	w1 := startMember(t, pool, rds.URL(), "persister1", signed)
	reader := startMember(t, pool, rds.URL(), "reader", signed)
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() }, "not ready")
	opts, _ := redis.ParseURL(rds.URL())
	rc := redis.NewClient(opts)
	defer rc.Close()
	ctx := context.Background()
	for i := range 50 {
		if _, err := w1.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			for _, forged := range []string{
				`POSITION events persister1-aaaaaaaa 1000000 1000000`,
				`RDATA events persister1-aaaaaaaa 999999 1000000 [{"forged":true}]`,
				string(newSigner("wrong-secret").sign([]byte(`POSITION events persister1-aaaaaaaa 2000000 2000000`))),
			} {
				if err := rc.Publish(ctx, "weft:test", forged).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	converged(t, pool, reader, "persister1")
	if v := metricSum(reader.node.m.invalid.WithLabelValues("bad_signature")); v < 3 {
		t.Fatalf("%v forged lines counted, want 3", v)
	}
	if got := reader.node.View(eventsKey("persister1")); got >= 1000000 {
		t.Fatalf("view jumped to the forged position %d", got)
	}
}
