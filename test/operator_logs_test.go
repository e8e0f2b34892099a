package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// What an operator reads: helpers that parse an instance's log and hold
// every line to the rules (one JSON object or one slog text record, each
// key once, a level and a message).

// logLine is one parsed log record.
type logLine struct {
	raw    string
	level  string
	msg    string
	fields map[string]any // flattened: a group's keys as "group.key"
}

func (l logLine) str(key string) string {
	v, ok := l.fields[key]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// startWith is cluster.start with environment of its own (after the
// cluster's, so it wins).
func (c *cluster) startWith(bin, name string, env []string, extra ...string) *proc {
	c.t.Helper()
	return c.startNamed(bin, name, name, env, extra...)
}

// startNamed starts an instance whose --name is name, known to the
// cluster (and its log file) as label: two processes of one writer name.
func (c *cluster) startNamed(bin, label, name string, env []string, extra ...string) *proc {
	c.t.Helper()
	port := testenv.FreePort(c.t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := &proc{name: label, bin: bin, url: "http://" + addr, env: env}
	p.args = append([]string{"--name", name, "--http-addr", addr}, extra...)
	c.procs[label] = p
	c.launch(p)
	return p
}

// logOf reads and checks everything name has logged so far: each line
// must parse, with each key once, a level and a message. Lines that do
// not look like log records (a panic) fail the test too.
func (c *cluster) logOf(t *testing.T, name string) []logLine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1] // a last line being written waits
	var out []logLine
	for raw := range strings.Lines(string(data)) {
		raw = strings.TrimRight(raw, "\n")
		if raw == "" {
			continue
		}
		l, err := parseLogLine(raw)
		if err != nil {
			t.Fatalf("%s: log line %q: %v", name, raw, err)
		}
		out = append(out, l)
	}
	return out
}

// parseLogLine reads a slog JSON or text record.
func parseLogLine(raw string) (logLine, error) {
	l := logLine{raw: raw, fields: map[string]any{}}
	var err error
	if strings.HasPrefix(raw, "{") {
		err = parseJSONRecord(json.NewDecoder(strings.NewReader(raw)), "", l.fields)
	} else {
		err = parseTextRecord(raw, l.fields)
	}
	if err != nil {
		return l, err
	}
	l.level, l.msg = l.str("level"), l.str("msg")
	switch l.level {
	case "DEBUG", "INFO", "WARN", "ERROR":
	default:
		return l, fmt.Errorf("level %q", l.level)
	}
	if l.msg == "" {
		return l, errors.New("no message")
	}
	return l, nil
}

// parseJSONRecord reads one object into fields, refusing a key seen twice
// (encoding/json would keep the last one silently).
func parseJSONRecord(dec *json.Decoder, prefix string, fields map[string]any) error {
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("want an object, got %v (%v)", tok, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := prefix + tok.(string)
		if _, dup := fields[key]; dup {
			return fmt.Errorf("key %q twice", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if bytes.HasPrefix(v, []byte("{")) {
			fields[key] = nil
			if err := parseJSONRecord(json.NewDecoder(bytes.NewReader(v)), key+".", fields); err != nil {
				return err
			}
			continue
		}
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return err
		}
		fields[key] = x
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

// parseTextRecord reads key=value pairs as slog's TextHandler writes them
// (a value with spaces, quotes or = is quoted with Go's rules).
func parseTextRecord(raw string, fields map[string]any) error {
	s := raw
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], ` "`) {
			return fmt.Errorf("no key=value at %q", s)
		}
		key := s[:eq]
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			end := 1
			for ; end < len(s); end++ {
				if s[end] == '\\' {
					end++
				} else if s[end] == '"' {
					break
				}
			}
			if end >= len(s) {
				return fmt.Errorf("unterminated quote in %q", s)
			}
			var err error
			if val, err = strconv.Unquote(s[:end+1]); err != nil {
				return err
			}
			s = s[end+1:]
		} else {
			sp := strings.IndexByte(s, ' ')
			if sp < 0 {
				sp = len(s)
			}
			val, s = s[:sp], s[sp:]
		}
		if _, dup := fields[key]; dup {
			return fmt.Errorf("key %q twice", key)
		}
		fields[key] = val
		if s != "" && s[0] != ' ' {
			return fmt.Errorf("no space after %s", key)
		}
		s = strings.TrimPrefix(s, " ")
	}
	return nil
}

// linesWith returns the lines whose message contains msg.
func linesWith(lines []logLine, msg string) []logLine {
	var out []logLine
	for _, l := range lines {
		if strings.Contains(l.msg, msg) {
			out = append(out, l)
		}
	}
	return out
}

// awaitLog waits until name has logged a line whose message contains msg,
// and returns every line logged by then.
func (c *cluster) awaitLog(t *testing.T, name, msg string, timeout time.Duration) []logLine {
	t.Helper()
	var lines []logLine
	testenv.WaitFor(t, timeout, func() error {
		lines = c.logOf(t, name)
		if len(linesWith(lines, msg)) == 0 {
			return fmt.Errorf("%s has not logged %q; last lines:\n%s", name, msg, tail(lines, 8))
		}
		return nil
	})
	return lines
}

func tail(lines []logLine, n int) string {
	var b strings.Builder
	for _, l := range lines[max(0, len(lines)-n):] {
		b.WriteString(l.raw)
		b.WriteByte('\n')
	}
	return b.String()
}

// exitCode waits for p to end by itself and returns its status.
func exitCode(t *testing.T, p *proc, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v", p.name, timeout)
	}
	code := p.cmd.ProcessState.ExitCode()
	p.log.Close()
	p.cmd = nil
	return code
}

// stopCode sends SIGTERM to p and returns its exit status.
func (c *cluster) stopCode(t *testing.T, p *proc) int {
	t.Helper()
	cmd := p.cmd
	c.stop(p, syscall.SIGTERM)
	return cmd.ProcessState.ExitCode()
}
