package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"

	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/rooms"
)

// WritersPath is the master's HTTP form of master writers list|add|remove:
//
//	GET    /_weft/v1/writers          the rooms' shard map
//	POST   /_weft/v1/writers/{name}   add a writer (?force=true: though no instance holds it)
//	DELETE /_weft/v1/writers/{name}   remove a writer
//
// with the bearer secret of every /_weft/ endpoint. A change answers the
// new version (200), or the current one with "unchanged": true when the
// name already was (or was not) a writer; removing the last writer, or
// adding a name no running instance holds (without force), is a 409.
// Every instance hears of the change (NOTIFY) and hands the moved rooms
// over fenced.
const WritersPath = "/_weft/v1/writers"

// writersAPI serves WritersPath on the master.
type writersAPI struct {
	store  *membership.Store
	secret httpx.Secret
	log    *slog.Logger
}

// writersAnswer is the JSON of a shard map version.
type writersAnswer struct {
	Map       string   `json:"map"`
	Epoch     int64    `json:"epoch"`
	Writers   []string `json:"writers"`
	Unchanged bool     `json:"unchanged,omitempty"`
}

func (a *writersAPI) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+WritersPath, a.list)
	mux.HandleFunc("POST "+WritersPath+"/{name}", a.change)
	mux.HandleFunc("DELETE "+WritersPath+"/{name}", a.change)
}

func (a *writersAPI) list(w http.ResponseWriter, r *http.Request) {
	if !a.secret.Allows(r) {
		httpx.WriteError(w, http.StatusUnauthorized, "missing or wrong bearer secret", "")
		return
	}
	v, err := a.store.Current(r.Context(), rooms.EventsStream)
	if err != nil {
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), "")
		return
	}
	a.answer(w, v, false)
}

func (a *writersAPI) change(w http.ResponseWriter, r *http.Request) {
	if !a.secret.Allows(r) {
		httpx.WriteError(w, http.StatusUnauthorized, "missing or wrong bearer secret", "")
		return
	}
	name := r.PathValue("name")
	if err := instance.ValidName(name); err != nil {
		httpx.WriteError(w, http.StatusBadRequest, err.Error(), "name")
		return
	}
	change, verb := a.store.Add, "added"
	if r.Method == http.MethodDelete {
		change, verb = a.store.Remove, "removed"
	} else if r.URL.Query().Get("force") != "true" {
		cur, err := a.store.Current(r.Context(), rooms.EventsStream)
		if err == nil && !slices.Contains(cur.Writers, name) {
			held, herr := a.store.Held(r.Context(), name)
			switch {
			case herr != nil:
				httpx.WriteError(w, http.StatusServiceUnavailable, herr.Error(), "")
				return
			case !held:
				httpx.WriteError(w, http.StatusConflict, "no running instance holds writer name "+name+
					": start one with --event-writer first, or add it with ?force=true (its rooms then wait until one does)", "name")
				return
			}
		}
	}
	v, err := change(r.Context(), rooms.EventsStream, name)
	switch {
	case errors.Is(err, membership.ErrUnchanged):
		a.answer(w, v, true)
	case errors.Is(err, membership.ErrLastWriter):
		httpx.WriteError(w, http.StatusConflict, err.Error(), "name")
	case err != nil:
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error(), "")
	default:
		a.log.Info("shard map changed over HTTP", "map", v.Map, "epoch", v.Epoch, verb, name, "writers", v.Writers)
		a.answer(w, v, false)
	}
}

func (a *writersAPI) answer(w http.ResponseWriter, v membership.Version, unchanged bool) {
	body, _ := json.Marshal(writersAnswer{Map: v.Map, Epoch: v.Epoch, Writers: v.Writers, Unchanged: unchanged}) // strings and ints
	httpx.WriteJSON(w, http.StatusOK, append(body, '\n'), "")
}
