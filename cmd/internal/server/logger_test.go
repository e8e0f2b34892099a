package server

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A log line is read by people and by machines: a duration is text in
// both formats, and a map is a group of fields, not Go's map syntax.
func TestLoggerFieldsReadable(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		c := Config{LogFormat: format, LogLevel: "info"}
		c.LoggerTo(&buf).Info("sealed", "final", map[string]int64{"typing": 3, "events": 25}, "took", 1500*time.Millisecond)
		line := buf.String()
		if strings.Contains(line, "map[") {
			t.Errorf("%s: %q prints a Go map", format, line)
		}
		switch format {
		case "text":
			for _, want := range []string{"final.events=25", "final.typing=3", "took=1.5s"} {
				if !strings.Contains(line, want) {
					t.Errorf("text: %q lacks %s", line, want)
				}
			}
			if strings.Index(line, "final.events") > strings.Index(line, "final.typing") {
				t.Errorf("text: %q: map keys not sorted", line)
			}
		case "json":
			var v struct {
				Final map[string]int64 `json:"final"`
				Took  string           `json:"took"`
			}
			if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
				t.Fatalf("json: %q: %v", line, err)
			}
			if v.Final["events"] != 25 || v.Final["typing"] != 3 || v.Took != "1.5s" {
				t.Errorf("json: %q: final %v took %q, want {events:25 typing:3} and 1.5s", line, v.Final, v.Took)
			}
		}
	}
}

// The level flag is honoured: debug lines are dropped at info.
func TestLoggerLevel(t *testing.T) {
	var buf bytes.Buffer
	c := Config{LogFormat: "text", LogLevel: "warn"}
	log := c.LoggerTo(&buf)
	log.Info("hidden")
	log.Warn("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "level=WARN msg=shown") {
		t.Fatalf("--log-level warn wrote %q", out)
	}
}
