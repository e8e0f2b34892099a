package test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// A successor started beside its predecessor (the surge of a rolling
// restart) opens with the persisted-upto stored then, and the predecessor
// goes on storing and handing out more. The successor's /status must not
// hand out less than the predecessor already did: the persisted-upto a
// client of the name sees never goes backwards (docs/DESIGN.md, invariant
// 2). The successor's announce interval is an hour, so its own refreshes
// and stores, which would catch it up within one, do not run: only
// reading what the other instances stored can bring it there.
func TestSuccessorPersistedUptoNotBehind(t *testing.T) {
	untimed(t)
	c, _, _, _, sync1 := smallCluster(t)
	ctx := context.Background()
	write := func(n int, tag string) {
		t.Helper()
		for i := range n {
			room := url.PathEscape(fmt.Sprintf("!puto%d:test", i%7))
			if _, err := roomsapi.Call(ctx, "POST", sync1.url+"/v1/rooms/"+room+"/messages",
				map[string]string{"sender": "@puto:test", "body": "x", "txn_id": tag + fmt.Sprint(i)}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	persisted := func(p *proc) int64 {
		var st statusDoc
		if err := get(ctx, 5*time.Second, p.url+"/status", &st); err != nil || st.Token == "" {
			return -1
		}
		return st.PersistedUpto
	}
	write(20, "a")

	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	succ := &proc{name: sync1.name, bin: sync1.bin, url: "http://" + addr,
		args: []string{"--name", sync1.name, "--http-addr", addr}, env: []string{"WEFT_ANNOUNCE_INTERVAL=1h"}}
	c.procs["sync1-successor"] = succ // stopped at the end with the others
	c.launch(succ)
	var opened int64
	testenv.Eventually(t, 30*time.Second, func() bool { opened = persisted(succ); return opened >= 0 },
		"the successor never served /status")

	// The predecessor stores and hands out more than the successor opened
	// with.
	write(20, "b")
	var handed int64
	testenv.Eventually(t, 30*time.Second, func() bool { handed = persisted(sync1); return handed > opened },
		"the predecessor's persisted-upto stayed at %d", opened)
	if got := persisted(succ); got < handed {
		t.Errorf("the successor hands out persisted-upto %d after its predecessor handed out %d (it opened at %d)", got, handed, opened)
	}
}
