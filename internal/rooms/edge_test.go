package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/shard"
)

// Input accepted at the edge that used to fail, or be lost, later.

// A sync naming the rooms parameter twice was answered 200 from the first
// list only, and its next_batch moved past the events of the other rooms:
// they were never delivered. It is a 400 now.
func TestSyncRefusesRepeatedParameters(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := e.token(t)
	b := e.post(t, "!b:x")
	e.seen(t, b)
	w := e.call(context.Background(), "since="+url.QueryEscape(since)+"&timeout_ms=0&rooms=!a:x&rooms=!b:x")
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"field":"rooms"`) {
		t.Fatalf("rooms=!a:x&rooms=!b:x answered %d %s, want 400 naming rooms", w.Code, w.Body)
	}
	// Listed once, comma-separated, both rooms are read.
	r := decodeSync(t, e.call(context.Background(), "since="+url.QueryEscape(since)+"&timeout_ms=0&rooms=!a:x,!b:x"))
	if len(r.Rooms["!b:x"].Events) != 1 {
		t.Fatalf("rooms=!a:x,!b:x: %v, want the event of !b:x at %d", r.Rooms, b)
	}
}

// JSON that encoding/json accepts but PostgreSQL's jsonb cannot store (a
// lone surrogate escape, a number beyond numeric's range) got past the
// API's checks and failed on the owner as a 500 "retrying is safe" that
// failed again on every retry. It is a 400 naming value.
func TestStateValueJSONBCannotStoreIs400(t *testing.T) {
	w := newWriters(t)
	for i, v := range []string{`"\ud800"`, `1e1000000`, `{"a":1e-20000}`} {
		got := w.state(w.worker, "r", "k", "@u:x", fmt.Sprint("v", i), v)
		var e apiError
		_ = json.Unmarshal([]byte(got.body), &e)
		if got.code != http.StatusBadRequest || e.Field != "value" {
			t.Errorf("value %s: %d %s, want 400 naming value", v, got.code, strings.TrimSpace(got.body))
		}
	}
}

// A request the database refuses (here content holding U+0000, which the
// API refuses before forwarding) fails the transaction of its batch; it
// alone must fail, and the requests batched with it must be written.
func TestOneBadPersistFailsAlone(t *testing.T) {
	w := newWriters(t)
	task := func(txn, body string) shard.Task {
		p, _ := json.Marshal(persistReq{Sender: "@u:x", TxnID: txn, Kind: "message", Content: json.RawMessage(`{"body":` + body + `}`)})
		return shard.Task{Kind: KindPersist, Payload: p, Batchable: true}
	}
	res := w.exec(context.Background(), "!r:x", []shard.Task{task("1", `"a"`), task("2", `"b\u0000"`), task("3", `"c"`)})
	if res[0].Err != nil || res[2].Err != nil {
		t.Fatalf("the good requests of the batch failed: %v, %v", res[0].Err, res[2].Err)
	}
	if res[1].Err == nil {
		t.Fatal("the request PostgreSQL refuses succeeded")
	}
	var a, c persistAns
	_ = json.Unmarshal(res[0].Value, &a)
	_ = json.Unmarshal(res[2].Value, &c)
	if a.StreamPos == 0 || c.StreamPos <= a.StreamPos {
		t.Fatalf("answers %s and %s: want positions in request order", res[0].Value, res[2].Value)
	}
	if n := w.count(t, `room = '!r:x'`); n != 2 {
		t.Fatalf("%d events stored, want 2", n)
	}
}

// fakeTypingOut records what the typing writer publishes; fail makes the
// next Put fail once.
type fakeTypingOut struct {
	pos  int64
	puts []string
	fail error
}

func (f *fakeTypingOut) Put(_ context.Context, key string, rows json.RawMessage) (int64, error) {
	if err := f.fail; err != nil {
		f.fail = nil
		return 0, err
	}
	f.pos++
	f.puts = append(f.puts, key)
	return f.pos, nil
}

func (f *fakeTypingOut) Remove(_ context.Context, key string, rows json.RawMessage) (int64, error) {
	f.pos++
	return f.pos, nil
}

func (f *fakeTypingOut) Position() int64 { return f.pos }

func typingTask(user string, typing bool) shard.Task {
	p, _ := json.Marshal(typingReq{User: user, Typing: typing, TimeoutMS: 30000})
	return shard.Task{Kind: KindTyping, Payload: p}
}

// A typing request whose publish fails is answered 500 "retrying is
// safe"; the user must not stay recorded as typing, or the retry changes
// nothing, succeeds, and publishes nothing.
func TestTypingRetryAfterFailedPublishPublishes(t *testing.T) {
	out := &fakeTypingOut{fail: errors.New("fabric: ephemeral not bound to a node")}
	w := newTypingWriter(out)
	if r := w.Exec(context.Background(), "!r:x", []shard.Task{typingTask("@a:x", true)}); r[0].Err == nil {
		t.Fatal("the first publish did not fail")
	}
	r := w.Exec(context.Background(), "!r:x", []shard.Task{typingTask("@a:x", true)})
	if r[0].Err == nil && len(out.puts) == 0 {
		t.Fatalf("the retry succeeded with %s but nothing was published: readers never see @a:x typing", r[0].Value)
	}
}
