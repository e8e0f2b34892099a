package catchup

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// errorBody is the JSON of every non-200 answer.
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// writeError answers code with an errorBody; field names the query
// parameter at fault, if any.
func writeError(w http.ResponseWriter, code int, reason, field string) {
	b, _ := json.Marshal(errorBody{Error: reason, Field: field})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}
