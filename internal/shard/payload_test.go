package shard

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// A task accepted before ctx ended still runs after Submit returned, when
// the caller may be reusing its Payload buffer: it runs on a copy.
func TestSubmitCopiesPayload(t *testing.T) {
	release, running := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	seen := make(chan string, 2)
	q := startQueue(t, QueueConfig{Workers: 1, Exec: func(ctx context.Context, key string, tasks []Task) []Result {
		if tasks[0].Kind == "block" {
			close(running)
			<-release
		} else {
			seen <- string(tasks[0].Payload)
		}
		return make([]Result, len(tasks))
	}})
	go q.Submit(context.Background(), "k", Task{Kind: "block"})
	<-running
	buf := []byte(`{"n":"good"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := q.Submit(ctx, "k", Task{Kind: "write", Payload: json.RawMessage(buf)}); err == nil {
		t.Fatal("Submit did not time out")
	}
	copy(buf, `{"n":"xxxx"}`) // the caller reuses its buffer once Submit returned
	close(release)
	if got := <-seen; got != `{"n":"good"}` {
		t.Fatalf("the task ran with payload %s, submitted as {\"n\":\"good\"}", got)
	}
}
