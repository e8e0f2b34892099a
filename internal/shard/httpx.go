package shard

import (
	"encoding/json"
	"net/http"

	"github.com/weft-dev/weft/internal/httpx"
)

// Route and bounds of the forwarding endpoint.
const (
	// PathPrefix is the route: PathPrefix + the key escaped as one path
	// segment, the dots of "." and ".." included (no router may clean it
	// away).
	PathPrefix = "/_weft/v1/shard/"
	// MaxRequestBody bounds a request body.
	MaxRequestBody = 1 << 20
	// MaxKeyLen bounds a key, in bytes.
	MaxKeyLen = 1024
	// MaxIdempotencyKeyLen bounds an idempotency key, in bytes.
	MaxIdempotencyKeyLen = 256
	// maxResponseBody bounds an answer the Forwarder reads.
	maxResponseBody = 16 << 20
	// shortSecret is the length below which a secret is worth a warning.
	shortSecret = 16
)

// request is the body of a forwarded task.
type request struct {
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	IdempotencyKey string          `json:"idempotency_key"`
	Batchable      bool            `json:"batchable,omitempty"`
	// Epoch is the shard map epoch the sender forwarded by (with a
	// Placement); 0 means unknown.
	Epoch int64 `json:"epoch,omitempty"`
}

// answerBody is the JSON of every answer: value on 200, error (and field or
// owner) otherwise.
type answerBody struct {
	Value json.RawMessage `json:"value,omitempty"`
	Error string          `json:"error,omitempty"`
	Field string          `json:"field,omitempty"`
	Owner string          `json:"owner,omitempty"`
	Epoch int64           `json:"epoch,omitempty"` // with owner: the map epoch it is the owner at
}

// answer is a rendered response; a 200's body is what the idempotency
// table keeps for replays.
type answer struct {
	code int
	body string
}

// errorAnswer renders a non-200 answer.
func errorAnswer(code int, b answerBody) answer {
	out, _ := json.Marshal(b) // strings only: cannot fail
	return answer{code: code, body: string(append(out, '\n'))}
}

// write sends a.
func (a answer) write(w http.ResponseWriter) {
	httpx.WriteJSON(w, a.code, []byte(a.body), http.MethodPost)
}
