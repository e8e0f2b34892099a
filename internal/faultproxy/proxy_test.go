package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/testenv"
)

// waitTimeout bounds every wait of these tests; the machine may be busy.
const waitTimeout = 20 * time.Second

// proxied is one run of a proxy test: a private redis-server, a proxy in
// front of it, and the RESP version the clients speak.
type proxied struct {
	r     *testenv.Redis
	p     *Proxy
	proto int
}

// client is a client through the proxy.
func (x proxied) client(t *testing.T) *redis.Client { return newClient(t, x.p.Addr(), x.proto) }

// direct is a client of the server itself, past the proxy.
func (x proxied) direct(t *testing.T) *redis.Client { return newClient(t, x.r.Addr(), x.proto) }

// protocols runs f once per RESP version go-redis speaks, each run with a
// server and proxy of its own (setup) and a context bounded by
// waitTimeout.
func protocols(t *testing.T, f func(t *testing.T, ctx context.Context, x proxied)) {
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			r, p := setup(t)
			f(t, ctx, proxied{r: r, p: p, proto: proto})
		})
	}
}

// setup starts a private redis-server and a proxy in front of it.
func setup(t *testing.T) (*testenv.Redis, *Proxy) {
	t.Helper()
	r := testenv.StartRedis(t)
	p, err := Start(context.Background(), r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return r, p
}

// newClient is a go-redis client of addr speaking proto.
func newClient(t *testing.T, addr string, proto int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: proto, MaxRetries: -1, PoolSize: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

// subscribe subscribes through c and waits for the confirmation.
func subscribe(t *testing.T, ctx context.Context, c *redis.Client, channel string) *redis.PubSub {
	t.Helper()
	sub := c.Subscribe(ctx, channel)
	t.Cleanup(func() { sub.Close() })
	msg, err := sub.Receive(ctx)
	if err != nil {
		t.Fatalf("subscribe %s: %v", channel, err)
	}
	if s, ok := msg.(*redis.Subscription); !ok || s.Kind != "subscribe" || s.Count != 1 {
		t.Fatalf("subscribe %s: got %#v", channel, msg)
	}
	return sub
}

// expectPong pings on the subscriber's connection and checks that the next
// thing it receives is the pong: no delivery is left before it.
func expectPong(t *testing.T, ctx context.Context, sub *redis.PubSub) {
	t.Helper()
	if err := sub.Ping(ctx, "probe"); err != nil {
		t.Fatalf("ping on the subscriber: %v", err)
	}
	msg, err := sub.Receive(ctx)
	if err != nil {
		t.Fatalf("receive pong: %v", err)
	}
	if p, ok := msg.(*redis.Pong); !ok || p.Payload != "probe" {
		t.Fatalf("subscriber received %#v, want the pong", msg)
	}
}

// checkHealthy runs ordinary commands through c and checks their replies.
func checkHealthy(t *testing.T, ctx context.Context, c *redis.Client, key string) {
	t.Helper()
	if err := c.Set(ctx, key, "v-"+key, 0).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	if got, err := c.Get(ctx, key).Result(); err != nil || got != "v-"+key {
		t.Fatalf("GET %s = %q, %v", key, got, err)
	}
	if n, err := c.Incr(ctx, key+":n").Result(); err != nil || n != 1 {
		t.Fatalf("INCR %s:n = %d, %v", key, n, err)
	}
}

// checkPipelined sends n INCRs of counter, a key not set yet, through c in
// one pipeline and checks that each reply matches its own command.
func checkPipelined(t *testing.T, ctx context.Context, c *redis.Client, n int) {
	t.Helper()
	cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for range n {
			pipe.Incr(ctx, "counter")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		if n := cmd.(*redis.IntCmd).Val(); n != int64(i+1) {
			t.Fatalf("pipelined INCR %d = %d", i, n)
		}
	}
}

func TestPassThrough(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		c := x.client(t)
		checkHealthy(t, ctx, c, "k")

		// A list whose first element is "message" is a reply, not a delivery.
		c.RPush(ctx, "list", "message", "ch", "payload")
		if got, err := c.LRange(ctx, "list", 0, -1).Result(); err != nil || strings.Join(got, ",") != "message,ch,payload" {
			t.Fatalf("LRANGE = %q, %v", got, err)
		}
		big := strings.Repeat("x", 3<<20)
		c.Set(ctx, "big", big, 0)
		if got, err := c.Get(ctx, "big").Result(); err != nil || got != big {
			t.Fatalf("GET big: %d bytes, %v", len(got), err)
		}
		c.HSet(ctx, "h", "a", "1", "b", "2")
		if got, err := c.HGetAll(ctx, "h").Result(); err != nil || len(got) != 2 || got["a"] != "1" || got["b"] != "2" {
			t.Fatalf("HGETALL = %v, %v", got, err)
		}
		checkPipelined(t, ctx, c, 200)
		if err := c.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) {
			t.Fatalf("GET missing: %v, want redis.Nil", err)
		}
		if err := c.Do(ctx, "NOSUCHCOMMAND").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Fatalf("unknown command: %v", err)
		}
		st := x.p.Stats()
		if st.Conns == 0 || st.Frames < 200 || st.Deliveries != 0 || st.Dropped != 0 || st.ProtoErrors != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestDropAll(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		x.p.SetDropRate(1)
		c := x.client(t)
		direct := x.direct(t)
		sub := subscribe(t, ctx, c, "ch")

		const n = 50
		for i := range n {
			if got, err := direct.Publish(ctx, "ch", strconv.Itoa(i)).Result(); err != nil || got != 1 {
				t.Fatalf("PUBLISH %d: %d receivers, %v", i, got, err)
			}
		}
		testenv.Eventually(t, waitTimeout, func() bool { return x.p.Stats().Deliveries == n },
			"the proxy saw %d deliveries; stats %+v", n, x.p.Stats())
		if st := x.p.Stats(); st.Dropped != n {
			t.Fatalf("dropped %d of %d: %+v", st.Dropped, n, st)
		}
		expectPong(t, ctx, sub)
		checkHealthy(t, ctx, c, "after")
	})
}

func TestDropHalf(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		x.p.SetDropRate(0.5)
		c := x.client(t)
		sub := subscribe(t, ctx, c, "ch")

		// Publish through the proxy too: PUBLISH replies must never drop.
		const n = 2000
		for start := 0; start < n; start += 100 {
			cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				for i := start; i < start+100; i++ {
					pipe.Publish(ctx, "ch", strconv.Itoa(i))
				}
				return nil
			})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			for _, cmd := range cmds {
				if cmd.(*redis.IntCmd).Val() != 1 {
					t.Fatalf("%v: want 1 receiver", cmd)
				}
			}
		}
		testenv.Eventually(t, waitTimeout, func() bool { return x.p.Stats().Deliveries == n },
			"the proxy saw %d deliveries; stats %+v", n, x.p.Stats())
		dropped := x.p.Stats().Dropped
		// Binomial(2000, 0.5): mean 1000, sd 22.4; +-150 is over 6 sd.
		if dropped < 850 || dropped > 1150 {
			t.Fatalf("dropped %d of %d at rate 0.5", dropped, n)
		}
		last := -1
		for range n - dropped {
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatalf("after %d: %v", last, err)
			}
			i, err := strconv.Atoi(msg.Payload)
			if err != nil || i <= last || msg.Channel != "ch" {
				t.Fatalf("message %q on %q after %d", msg.Payload, msg.Channel, last)
			}
			last = i
		}
		expectPong(t, ctx, sub)
		checkHealthy(t, ctx, c, "after")
	})
}

func TestDelay(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		const d = 200 * time.Millisecond
		c := x.client(t)
		direct := x.direct(t)
		sub := subscribe(t, ctx, c, "ch")
		x.p.SetDelay(d)

		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if rtt := time.Since(start); rtt < d {
			t.Fatalf("PING took %v through a %v delay", rtt, d)
		}
		checkPipelined(t, ctx, c, 100)

		// Deliveries published straight to Redis arrive in order, each at
		// least d after it was published.
		const n = 20
		sent := make([]time.Time, n)
		for i := range n {
			sent[i] = time.Now()
			if err := direct.Publish(ctx, "ch", strconv.Itoa(i)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Payload != strconv.Itoa(i) {
				t.Fatalf("message %d is %q", i, msg.Payload)
			}
			if lag := time.Since(sent[i]); lag < d {
				t.Fatalf("message %d arrived %v after PUBLISH, delay %v", i, lag, d)
			}
		}
		x.p.SetDelay(0)
		checkHealthy(t, ctx, c, "after")
	})
}

func TestCut(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		c := x.client(t)
		direct := x.direct(t)
		sub := subscribe(t, ctx, c, "ch")
		checkHealthy(t, ctx, c, "before")
		if st := x.p.Stats(); st.Active != 2 {
			t.Fatalf("active %d, want 2 (subscriber, pool): %+v", st.Active, st)
		}

		errc := make(chan error, 1)
		go func() {
			_, err := sub.ReceiveMessage(ctx)
			errc <- err
		}()
		x.p.Cut()
		if err := <-errc; err == nil {
			t.Fatal("the subscriber received a message after Cut, want an error")
		}
		if st := x.p.Stats(); st.Cut != 2 {
			t.Fatalf("cut %d, want 2: %+v", st.Cut, st)
		}

		// go-redis reconnects and resubscribes on the next receive.
		msgc := make(chan *redis.Message, 1)
		go func() {
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				errc <- err
				return
			}
			msgc <- msg
		}()
		testenv.Eventually(t, waitTimeout, func() bool {
			return direct.Publish(ctx, "ch", "again").Val() == 1
		}, "the subscriber resubscribed")
		select {
		case msg := <-msgc:
			if msg.Payload != "again" {
				t.Fatalf("after reconnect: %q", msg.Payload)
			}
		case err := <-errc:
			t.Fatalf("after reconnect: %v", err)
		}
		checkHealthy(t, ctx, c, "after")
		if st := x.p.Stats(); st.Conns < 4 {
			t.Fatalf("conns %d, want the two reconnections: %+v", st.Conns, st)
		}
	})
}

func TestRefuse(t *testing.T) {
	protocols(t, func(t *testing.T, ctx context.Context, x proxied) {
		open := x.client(t)
		checkHealthy(t, ctx, open, "open")

		x.p.SetRefuse(true)
		fresh := x.client(t)
		if err := fresh.Ping(ctx).Err(); err == nil {
			t.Fatal("PING on a new connection succeeded while refusing")
		}
		if st := x.p.Stats(); st.Refused == 0 {
			t.Fatalf("nothing refused: %+v", st)
		}
		if err := open.Ping(ctx).Err(); err != nil {
			t.Fatalf("a connection opened before refusing: %v", err)
		}

		x.p.SetRefuse(false)
		if err := fresh.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after refusing ends: %v", err)
		}
	})
}

func TestStopByContext(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	p, err := Start(ctx, r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, p.Addr(), 3)
	checkHealthy(t, ctx, c, "k")
	cancel()
	testenv.Eventually(t, waitTimeout, func() bool { return p.Stats().Active == 0 },
		"connections closed after cancel; stats %+v", p.Stats())
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING through a stopped proxy succeeded")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDialError(t *testing.T) {
	p, err := Start(context.Background(), "127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := newClient(t, p.Addr(), 3)
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING through a proxy to nothing succeeded")
	}
	if st := p.Stats(); st.DialErrors == 0 {
		t.Fatalf("no dial error counted: %+v", st)
	}
}
