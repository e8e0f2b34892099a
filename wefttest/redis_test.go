package wefttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/wefttest"
)

// A killed server refuses, and answers again at the same URL once
// started: an outage a test can cause.
func TestRedisServerKillAndStart(t *testing.T) {
	s := wefttest.StartRedis(t)
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := ping(); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	s.Kill(t)
	if err := ping(); err == nil {
		t.Fatal("a killed server answered")
	}
	s.Start(t)
	if err := ping(); err != nil {
		t.Fatalf("the server started again: %v", err)
	}
}
