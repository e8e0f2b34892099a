package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// TestStopAnswersLongPollsOnceTheListenerIsClosed: a graceful stop answers
// the long-polls it holds only after its listener is closed, so a client
// that asks again the moment it is answered finds the port refused (and
// tries another instance). Answered before the close, its new request
// could land in the backlog that the closing listener resets: a request
// lost with EOF, what TestRollingRestart saw under load.
func TestStopAnswersLongPollsOnceTheListenerIsClosed(t *testing.T) {
	cfg := parse(t, instanceArgs(testenv.NewDatabase(t), testenv.SharedRedisURL(t),
		fmt.Sprintf("stop-%d", time.Now().UnixNano()), "127.0.0.1:0", "master")...)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, RoleMaster, func(a string) { addrc <- a }) }()
	addr := <-addrc
	base := "http://" + addr
	awaitReady(t, http.DefaultClient, base)

	code, body := call(t, "GET", base+"/v1/sync?since=m0&timeout_ms=0&rooms=%21idle%3Ax", "")
	var first struct {
		NextBatch string `json:"next_batch"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &first) != nil || first.NextBatch == "" {
		t.Fatalf("first sync: %d %s", code, body)
	}
	const polls = 50
	type outcome struct {
		code     int
		err      error
		redialed bool // a new connection was accepted right after the answer
	}
	outcomes := make(chan outcome, polls)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range polls {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			code, _, err := request(c, "GET", base+"/v1/sync?timeout_ms=60000&rooms=%21idle%3Ax&since="+first.NextBatch, "", "")
			var o outcome
			o.code, o.err = code, err
			if conn, derr := net.DialTimeout("tcp", addr, 5*time.Second); derr == nil {
				o.redialed = true
				_ = conn.Close()
			}
			outcomes <- o
		})
	}
	held := regexp.MustCompile(`(?m)^weft_rooms_long_polls (\S+)$`)
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body := call(t, "GET", base+"/metrics", testSecret)
		m := held.FindStringSubmatch(body)
		if code != http.StatusOK || m == nil {
			return fmt.Errorf("/metrics: %d, no weft_rooms_long_polls", code)
		}
		if n, _ := strconv.ParseFloat(m[1], 64); n < polls {
			return fmt.Errorf("%v long-polls held, want %d", n, polls)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	redialed := 0
	for range polls {
		o := <-outcomes
		if o.err != nil || o.code != http.StatusOK {
			t.Errorf("a held long-poll was not answered by the stop: %d %v", o.code, o.err)
		}
		if o.redialed {
			redialed++
		}
	}
	if redialed > 0 {
		t.Errorf("%d of %d clients, answered by the stop, connected again at once: the listener was still open", redialed, polls)
	}
}
