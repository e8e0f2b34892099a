package rooms

import "testing"

// The events table is stated twice, for weft (Streams) and for the lower
// packages (Events): both must name the same table, sequence and columns.
func TestStreamsAgreeWithEvents(t *testing.T) {
	s, e := Streams(), Events()
	ev, typing := s[0], s[1]
	tb := e.Tables[0]
	if ev.Name != e.Name || ev.Sequence != e.Sequence || ev.Table != tb.Name || ev.IDColumn != tb.IDColumn || ev.WriterColumn != tb.WriterColumn ||
		ev.DataColumn != "rows" || !ev.Arrays || len(e.Tables) != 1 {
		t.Errorf("Streams()[0] %+v disagrees with Events() %+v", ev, e)
	}
	if typing.Name != TypingStream || !typing.Ephemeral {
		t.Errorf("Streams()[1] %+v, want the ephemeral typing stream", typing)
	}
}
