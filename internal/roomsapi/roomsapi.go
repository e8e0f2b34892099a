// Package roomsapi is the rooms HTTP API as the black-box tests (test/
// and deploy/enginetest) see it from outside the processes: one JSON
// call, a sync response as a client decodes it, and the checks every
// response one client gets must pass against those it got before.
//
// Its types are written from the API's documented JSON, not shared with
// package rooms, so a change to the wire format fails these tests.
package roomsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Event is one room event of a sync response.
type Event struct {
	EventID   string          `json:"event_id"`
	Room      string          `json:"room"`
	Sender    string          `json:"sender"`
	Kind      string          `json:"kind"`
	StateKey  *string         `json:"state_key"`
	Content   json.RawMessage `json:"content"`
	StreamPos int64           `json:"stream_pos"`
	Writer    string          `json:"writer"`
}

// SyncResponse is the body of GET /v1/sync.
type SyncResponse struct {
	Rooms map[string]struct {
		Events []Event `json:"events"`
	} `json:"rooms"`
	Typing    map[string][]string `json:"typing"`
	NextBatch string              `json:"next_batch"`
}

// TxnOf is the transaction ID the tests' workloads put in an event's
// content: a message's body, or a state event's value.txn.
func TxnOf(e Event) string {
	var c struct {
		Body  string `json:"body"`
		Value struct {
			Txn string `json:"txn"`
		} `json:"value"`
	}
	_ = json.Unmarshal(e.Content, &c)
	if c.Body != "" {
		return c.Body
	}
	return c.Value.Txn
}

// Call does one request with body (nil for none) encoded as JSON, and
// decodes a 2xx answer into out (nil to ignore it). It returns the status
// code, 0 when no answer came; any other status is an error with the
// answer's body.
func Call(ctx context.Context, method, url string, body, out any) (int, error) {
	code, _, data, err := Do(ctx, method, url, body)
	if err != nil {
		return code, err
	}
	if code/100 != 2 {
		return code, fmt.Errorf("%s %s: %d %s", method, url, code, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return code, fmt.Errorf("%s %s: answer %q: %w", method, url, data, err)
		}
	}
	return code, nil
}

// Do does one request with body (nil for none) encoded as JSON and
// returns the answer whatever its status: its code (0 when none came),
// header and body.
func Do(ctx context.Context, method, url string, body any) (code int, header http.Header, data []byte, err error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data, err
}
