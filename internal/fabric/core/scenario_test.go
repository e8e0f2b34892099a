package core

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scenarios")

// A scenario file is a list of blocks: one directive, "----", then the
// actions it must produce, one per line, then a blank line. Directives:
//
//	new self=ID streams=a,b:ephemeral [views=a/w1=3,...] [writes=a=0,...] [writers=a/w1,...]
//	connect | disconnect | shutdown | tick DURATION
//	lost STREAM,... | regained STREAM,...   (StreamsLost, StreamsRegained)
//	recv LINE                      (a wire line, decoded by the codec)
//	fetched ID upto=N [err] [gone]
//	apply-failed STREAM/WRITER PREV POS
//	rows STREAM POS JSON           (LocalRows)
//	position STREAM POS            (LocalPosition)
//	committed STREAM POS           (LocalCommitted)
//	stored STREAM/WRITER POS       (Stored)
//	state                          (views, readiness)
//	peers                          (the peer table)
//	subscribed AGO                 (SubscribedSince now-AGO)
//	holders NAME=INSTANCE@EPOCH... (LearnHolders)
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type block struct {
	line     int
	lead     string // the comments and blank lines before the directive, kept by -rewrite
	cmd      string
	expected string
}

func parseScenario(t *testing.T, path string) []block {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	var cur *block
	inExpect := false
	var lead strings.Builder
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && (strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#")):
			lead.WriteString(line + "\n")
		case cur == nil:
			blocks = append(blocks, block{line: n, lead: lead.String(), cmd: line})
			lead.Reset()
			cur = &blocks[len(blocks)-1]
		case !inExpect && line == "----":
			inExpect = true
		case !inExpect:
			t.Fatalf("%s:%d: want ---- after the directive", path, n)
		case line == "":
			cur, inExpect = nil, false
		default:
			cur.expected += line + "\n"
		}
	}
	return blocks
}

func runScenario(t *testing.T, path string) {
	blocks := parseScenario(t, path)
	codec := wire.NewCodec(wire.Config{})
	var c *Core
	now := time.Unix(1_700_000_000, 0)
	var seq uint64
	var out strings.Builder
	failed := false
	for i := range blocks {
		b := &blocks[i]
		actions, err := step(&c, codec, &now, &seq, b.cmd)
		var got strings.Builder
		if err != nil {
			fmt.Fprintf(&got, "error: %v\n", err)
		}
		for _, a := range actions {
			got.WriteString(a.String() + "\n")
		}
		if c != nil && b.cmd == "state" {
			for _, v := range c.Views() {
				fmt.Fprintf(&got, "view %s pos=%d announced=%d catching=%v instance=%s\n", v.Key, v.Pos, v.Announced, v.Catching, v.Instance)
			}
			fmt.Fprintf(&got, "established=%v ready=%v\n", c.IsEstablished(), c.Ready())
			if why := c.NotReady(); why != "" {
				fmt.Fprintf(&got, "not ready: %s\n", why)
			}
		}
		if c != nil && b.cmd == "peers" {
			peers := c.Peers()
			names := make([]string, 0, len(peers))
			for inst := range peers {
				names = append(names, inst)
			}
			slices.Sort(names)
			for _, inst := range names {
				p := peers[inst]
				fmt.Fprintf(&got, "peer %s name=%s epoch=%d helloed=%v url=%s\n", inst, p.Hello.Name, p.Epoch, p.Helloed, p.Hello.URL)
			}
			live, gone, holders := c.PeerCounts()
			fmt.Fprintf(&got, "live=%d departed=%d holders=%d\n", live, gone, holders)
		}
		if *rewrite {
			b.expected = got.String()
		} else if got.String() != b.expected {
			t.Errorf("%s:%d: %s\n got:\n%s want:\n%s", path, b.line, b.cmd, got.String(), b.expected)
			failed = true
		}
		fmt.Fprintf(&out, "%s%s\n----\n%s\n", b.lead, b.cmd, b.expected)
	}
	if *rewrite && !failed {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func step(cp **Core, codec *wire.Codec, now *time.Time, seq *uint64, line string) ([]Action, error) {
	f := strings.Fields(line)
	c := *cp
	if len(f) == 0 {
		return nil, fmt.Errorf("empty directive")
	}
	if f[0] != "new" && c == nil {
		return nil, fmt.Errorf("no core: start with new")
	}
	switch f[0] {
	case "new":
		cfg := Config{Hello: wire.Hello{Name: "x", URL: "http://x"}, Views: map[Key]int64{}, Writes: map[string]int64{}}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "self":
				cfg.Instance = v
				cfg.Hello.Name, _, _ = strings.Cut(v, "-")
			case "streams":
				for _, s := range strings.Split(v, ",") {
					name, opt, _ := strings.Cut(s, ":")
					cfg.Streams = append(cfg.Streams, StreamSpec{Name: name, Ephemeral: opt == "ephemeral"})
				}
			case "views":
				for _, s := range strings.Split(v, ",") {
					kw, p, _ := strings.Cut(s, "=")
					st, w, _ := strings.Cut(kw, "/")
					n, _ := strconv.ParseInt(p, 10, 64)
					cfg.Views[Key{st, w}] = n
				}
			case "writes":
				for _, s := range strings.Split(v, ",") {
					st, p, _ := strings.Cut(s, "=")
					n, _ := strconv.ParseInt(p, 10, 64)
					cfg.Writes[st] = n
				}
			case "writers":
				for _, s := range strings.Split(v, ",") {
					st, w, _ := strings.Cut(s, "/")
					for i := range cfg.Streams {
						if cfg.Streams[i].Name == st {
							cfg.Streams[i].Writers = append(cfg.Streams[i].Writers, w)
						}
					}
				}
			case "buffer":
				cfg.MaxBuffer, _ = strconv.Atoi(v)
			case "maxrows":
				cfg.MaxRowsBytes, _ = strconv.Atoi(v)
			default:
				return nil, fmt.Errorf("unknown option %s", k)
			}
		}
		nc, err := New(cfg)
		if err != nil {
			return nil, err
		}
		*cp = nc
		return nc.Tick(*now), nil
	case "connect":
		return c.Connected(), nil
	case "disconnect":
		return c.Disconnected(), nil
	case "lost":
		return c.StreamsLost(strings.Split(f[1], ",")), nil
	case "regained":
		return c.StreamsRegained(strings.Split(f[1], ",")), nil
	case "shutdown":
		return c.Shutdown(), nil
	case "state", "peers":
		return nil, nil
	case "subscribed":
		// subscribed AGO: the subscription was sent AGO before now.
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, err
		}
		c.SubscribedSince(now.Add(-d))
		return nil, nil
	case "holders":
		// holders NAME=INSTANCE@EPOCH ...
		var hs []Holding
		for _, kv := range f[1:] {
			name, rest, _ := strings.Cut(kv, "=")
			inst, ep, _ := strings.Cut(rest, "@")
			e, err := strconv.ParseUint(ep, 10, 64)
			if err != nil {
				return nil, err
			}
			hs = append(hs, Holding{Name: name, Instance: inst, Epoch: e})
		}
		return c.LearnHolders(hs), nil
	case "tick":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, err
		}
		*now = now.Add(d)
		return c.Tick(*now), nil
	case "recv":
		// A line with a stamp (" #epoch.seq") is received with it; one
		// without gets the next of a sequence that starts at the clock, as
		// a live sender's would.
		raw := []byte(strings.TrimPrefix(line, "recv "))
		cmdLine, st, _, stamped := wire.CutStamp(raw)
		if !stamped {
			cmdLine = raw
			*seq = max(*seq+1, uint64(now.UnixMicro()))
			st = wire.Stamp{Seq: *seq}
		}
		cmd, err := codec.Decode(cmdLine)
		if err != nil {
			return nil, err
		}
		return c.Receive(cmd, st), nil
	case "fetched":
		r := FetchResult{}
		id, err := strconv.ParseUint(strings.TrimPrefix(f[1], "#"), 10, 64)
		if err != nil {
			return nil, err
		}
		r.ID = id
		for _, a := range f[2:] {
			switch {
			case strings.HasPrefix(a, "upto="):
				r.Upto, _ = strconv.ParseInt(strings.TrimPrefix(a, "upto="), 10, 64)
			case a == "err":
				r.Err = fmt.Errorf("boom")
			case a == "gone":
				r.Gone = true
			}
		}
		return c.FetchDone(r), nil
	case "apply-failed":
		st, w, _ := strings.Cut(f[1], "/")
		prev, _ := strconv.ParseInt(f[2], 10, 64)
		pos, _ := strconv.ParseInt(f[3], 10, 64)
		return c.ApplyFailed(Key{st, w}, prev, pos), nil
	case "rows":
		pos, _ := strconv.ParseInt(f[2], 10, 64)
		return c.LocalRows(f[1], pos, []byte(strings.Join(f[3:], " "))), nil
	case "position":
		pos, _ := strconv.ParseInt(f[2], 10, 64)
		return c.LocalPosition(f[1], pos), nil
	case "committed":
		pos, _ := strconv.ParseInt(f[2], 10, 64)
		return c.LocalCommitted(f[1], pos), nil
	case "stored":
		st, w, _ := strings.Cut(f[1], "/")
		pos, _ := strconv.ParseInt(f[2], 10, 64)
		return c.Stored(Key{st, w}, pos), nil
	}
	return nil, fmt.Errorf("unknown directive %q", f[0])
}
