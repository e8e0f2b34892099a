package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/testenv"
)

// The binaries' /status is the library's document extended: a process
// of the library (weft.Open, Node.Handler) and a master on the same
// database and cluster serve the same keys of weft.Status, the master's
// per-writer views are weft's (streams[].writers), and its own sections
// sit beside them.
func TestStatusIsTheLibrarysDocumentExtended(t *testing.T) {
	db, rds := testenv.NewDatabase(t), testenv.SharedRedisURL(t)
	cluster := fmt.Sprintf("status-%d", time.Now().UnixNano())
	cfg := parse(t, instanceArgs(db, rds, cluster, "127.0.0.1:0", "master")...)
	base := "http://" + serve(t, cfg, RoleMaster)
	awaitReady(t, http.DefaultClient, base)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lib, err := weft.Open(ctx, weft.Config{Name: "lib", DatabaseURL: db, RedisURL: rds, Cluster: cluster, Secret: testSecret,
		AnnounceInterval: 100 * time.Millisecond, Streams: rooms.Streams(), Logger: slog.New(slog.DiscardHandler),
		StatusSections: func(context.Context) map[string]any {
			return map[string]any{"app": map[string]int{"depth": 3}, "streams": "a clash: weft's own key wins"}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Close() }()
	libSrv := httptest.NewServer(lib.Handler())
	defer libSrv.Close()

	read := func(url string) (map[string]json.RawMessage, weft.Status) {
		code, body := call(t, "GET", url+"/status", "")
		if code != 200 {
			t.Fatalf("GET %s/status: %d %.300s", url, code, body)
		}
		var keys map[string]json.RawMessage
		var st weft.Status
		if err := json.Unmarshal([]byte(body), &keys); err != nil {
			t.Fatalf("%s/status is not one JSON object: %v\n%s", url, err, body)
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatal(err)
		}
		return keys, st
	}
	following := func(st weft.Status) bool {
		for _, s := range st.Streams {
			if s.Name == rooms.EventsStream && slices.ContainsFunc(s.Writers, func(w weft.StreamWriter) bool { return w.Writer == "master" }) {
				return true
			}
		}
		return false
	}
	var libKeys, binKeys map[string]json.RawMessage
	var libSt, binSt weft.Status
	testenv.Eventually(t, 30*time.Second, func() bool {
		libKeys, libSt = read(libSrv.URL)
		binKeys, binSt = read(base)
		return following(libSt) && following(binSt)
	}, "the library's and the master's /status never both showed the master's events writer: %+v / %+v", libSt, binSt)

	var own map[string]json.RawMessage // weft's keys that are always there
	zero, _ := json.Marshal(weft.Status{})
	_ = json.Unmarshal(zero, &own)
	for k := range own {
		_, inLib := libKeys[k]
		_, inBin := binKeys[k]
		if !inLib || !inBin {
			t.Errorf("weft's key %q: in the library's /status %v, in the master's %v", k, inLib, inBin)
		}
	}
	for _, k := range []string{"role", "version", "token", "peers", "queue_depth", "persisted_upto"} {
		if _, ok := binKeys[k]; !ok {
			t.Errorf("the master's /status lacks its own section %q", k)
		}
	}
	if string(libKeys["app"]) == "" || binSt.Name != "master" || libSt.Name != "lib" || binSt.Instance == "" {
		t.Errorf("the application's section or the names are wrong: app %s, names %q %q", libKeys["app"], libSt.Name, binSt.Name)
	}
	var app struct{ Depth int }
	if err := json.Unmarshal(libKeys["app"], &app); err != nil || app.Depth != 3 {
		t.Errorf("the application's section: %s (%v)", libKeys["app"], err)
	}
	if len(libSt.Streams) != len(rooms.Streams()) {
		t.Errorf("a section named streams replaced weft's own: %s", libKeys["streams"])
	}
}
