package testenv

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisPingTimeout bounds one PING, including the dial.
const redisPingTimeout = time.Second

// sharedRedisURL is WEFT_TEST_REDIS_URL, or the local default.
func sharedRedisURL() string {
	if u := os.Getenv("WEFT_TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// SharedRedisURL returns the URL of the shared Redis server
// (WEFT_TEST_REDIS_URL, or redis://127.0.0.1:6379/0) after RequireRedis.
// Tests share its keyspace, so keys must be unique per test.
func SharedRedisURL(t testing.TB) string {
	t.Helper()
	RequireRedis(t)
	return sharedRedisURL()
}

// RequireRedis PINGs the shared Redis server; if it does not answer, the test
// is skipped, or fails under CI=true.
func RequireRedis(t testing.TB) {
	t.Helper()
	u := sharedRedisURL()
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("testenv: WEFT_TEST_REDIS_URL %q: %v", u, err)
	}
	if err := pingRedis(context.Background(), opt); err != nil {
		unavailable(t, "redis at %s does not answer PING: %v", opt.Addr, err)
	}
}

// pingRedis sends one PING (after AUTH when opt has a password) on a new
// connection. It speaks RESP itself rather than through a go-redis client: a
// client whose dial fails logs, retries the dial with backoff and leaves a
// redial goroutine running past Close, all wrong for a readiness probe.
func pingRedis(ctx context.Context, opt *redis.Options) error {
	ctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", opt.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	if opt.TLSConfig != nil {
		conn = tls.Client(conn, opt.TLSConfig)
	}
	rd := bufio.NewReader(conn)
	if opt.Password != "" {
		auth := []string{"AUTH", opt.Password}
		if opt.Username != "" {
			auth = []string{"AUTH", opt.Username, opt.Password}
		}
		if _, err := redisCall(conn, rd, auth...); err != nil {
			return err
		}
	}
	reply, err := redisCall(conn, rd, "PING")
	if err != nil {
		return err
	}
	if reply != "+PONG" {
		return fmt.Errorf("PING answered %q", reply)
	}
	return nil
}

// redisCall sends one command and reads a one-line reply.
func redisCall(w io.Writer, rd *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return "", err
	}
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "-") {
		return "", fmt.Errorf("redis: %s", line[1:])
	}
	return line, nil
}
