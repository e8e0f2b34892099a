package catchup

import (
	"net/http"

	"github.com/weft-dev/weft/internal/httpx"
)

// errorBody is the JSON of every non-200 answer.
type errorBody = httpx.ErrorBody

// writeError answers code with an errorBody; field names the query
// parameter at fault, if any.
func writeError(w http.ResponseWriter, code int, reason, field string) {
	httpx.WriteError(w, code, reason, field)
}
