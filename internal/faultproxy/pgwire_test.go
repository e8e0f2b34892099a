package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// encoder is a pgproto3 message, the encoder pgx itself uses.
type encoder interface {
	Encode(dst []byte) ([]byte, error)
}

// encode encodes messages one after another.
func encode(tb testing.TB, msgs ...encoder) []byte {
	tb.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			tb.Fatalf("encode %T: %v", m, err)
		}
	}
	return b
}

// clientSample is a pgx session as the client sends it: TLS asked and
// refused, startup, a transaction whose INSERT is prepared by name, run,
// run again by name alone, and committed; a batch; COPY; the end.
func clientSample(tb testing.TB) []byte {
	ins := "INSERT INTO events VALUES ($1) RETURNING id"
	return encode(tb,
		&pgproto3.SSLRequest{},
		&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
			Parameters: map[string]string{"user": "postgres", "database": "test"}},
		&pgproto3.PasswordMessage{Password: "secret"},
		&pgproto3.Query{String: "begin"},
		&pgproto3.Parse{Name: "s1", Query: ins},
		&pgproto3.Describe{ObjectType: 'S', Name: "s1"},
		&pgproto3.Sync{},
		&pgproto3.Bind{PreparedStatement: "s1", Parameters: [][]byte{[]byte("1")}},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
		&pgproto3.Bind{PreparedStatement: "s1", Parameters: [][]byte{[]byte("2")}},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
		&pgproto3.Query{String: "commit"},
		&pgproto3.Parse{Query: "SELECT 1"},
		&pgproto3.Bind{},
		&pgproto3.Execute{MaxRows: 1},
		&pgproto3.Close{ObjectType: 'S', Name: "s1"},
		&pgproto3.Flush{},
		&pgproto3.Sync{},
		&pgproto3.Query{String: "COPY events FROM STDIN"},
		&pgproto3.CopyData{Data: []byte("3\n")},
		&pgproto3.CopyDone{},
		&pgproto3.Query{String: "BEGIN; INSERT INTO events VALUES (4); COMMIT"},
		&pgproto3.Query{String: ""},
		&pgproto3.Terminate{},
	)
}

// serverSample is what a server sends: startup, a transaction, rows, an
// error, a notice and a notification.
func serverSample(tb testing.TB) []byte {
	return encode(tb,
		&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "17.0"},
		&pgproto3.BackendKeyData{ProcessID: 7, SecretKey: []byte{1, 2, 3, 4}},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
		&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")},
		&pgproto3.ReadyForQuery{TxStatus: 'T'},
		&pgproto3.ParseComplete{},
		&pgproto3.ParameterDescription{ParameterOIDs: []uint32{23}},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("id"), DataTypeOID: 20}}},
		&pgproto3.ReadyForQuery{TxStatus: 'T'},
		&pgproto3.BindComplete{},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1")}},
		&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'T'},
		&pgproto3.NoticeResponse{Severity: "NOTICE", Message: "hello"},
		&pgproto3.ErrorResponse{Severity: "ERROR", Code: "23505", Message: "duplicate key"},
		&pgproto3.ReadyForQuery{TxStatus: 'E'},
		&pgproto3.CommandComplete{CommandTag: []byte("ROLLBACK")},
		&pgproto3.EmptyQueryResponse{},
		&pgproto3.PortalSuspended{},
		&pgproto3.NotificationResponse{PID: 7, Channel: "ch", Payload: "x"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
}

// pgMsg is one message as readPGAll split it.
type pgMsg struct {
	startup bool
	raw     string
}

// readPGAll splits a stream as the proxy's pumps do: for a client,
// startup messages first (another after each SSLRequest or
// GSSENCRequest), then typed messages; for a server, typed messages only.
// It reads through a bufio.Reader of size and returns the error that
// stopped it.
func readPGAll(r io.Reader, size int, client bool) ([]pgMsg, error) {
	rd := newPGReader(bufio.NewReaderSize(r, size))
	var msgs []pgMsg
	for client {
		code, msg, err := rd.startup()
		if err != nil {
			return msgs, errClass(err)
		}
		msgs = append(msgs, pgMsg{true, string(msg)})
		if k := startupKindOf(code); k != sslRequest && k != gssencRequest {
			break
		}
	}
	for {
		_, msg, err := rd.next()
		if err != nil {
			return msgs, errClass(err)
		}
		msgs = append(msgs, pgMsg{false, string(msg)})
	}
}

// errClass keeps the errors the reader may return and flags any other.
func errClass(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF || errors.Is(err, errPGProtocol) {
		return err
	}
	return errors.New("unexpected error class: " + err.Error())
}

func TestPGReaderSamples(t *testing.T) {
	for _, tc := range []struct {
		name   string
		data   []byte
		client bool
		n      int
	}{
		{"client", clientSample(t), true, 27},
		{"server", serverSample(t), false, 22},
	} {
		for _, size := range []int{16, 4096} {
			msgs, err := readPGAll(bytes.NewReader(tc.data), size, tc.client)
			if err != io.EOF || len(msgs) != tc.n {
				t.Fatalf("%s: %d messages, %v; want %d, io.EOF", tc.name, len(msgs), err, tc.n)
			}
			var joined strings.Builder
			for _, m := range msgs {
				joined.WriteString(m.raw)
			}
			if joined.String() != string(tc.data) {
				t.Fatalf("%s: the messages are not the stream", tc.name)
			}
		}
	}
}

// TestPGReaderLarge reads a message longer than one read chunk, trickled
// in, between small ones.
func TestPGReaderLarge(t *testing.T) {
	big := strings.Repeat("x", 3*readChunk+7)
	data := encode(t, &pgproto3.ReadyForQuery{TxStatus: 'I'},
		&pgproto3.DataRow{Values: [][]byte{[]byte(big)}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
	msgs, err := readPGAll(&splitReader{data: data, at: readChunk + 3, chunk: 1000}, 16, false)
	if err != io.EOF || len(msgs) != 3 || len(msgs[1].raw) != 5+2+4+len(big) {
		t.Fatalf("%d messages, %v", len(msgs), err)
	}
	msgs, err = readPGAll(bytes.NewReader(data[:len(data)-1]), 4096, false)
	if err != io.ErrUnexpectedEOF || len(msgs) != 2 {
		t.Fatalf("truncated: %d messages, %v", len(msgs), err)
	}
}

func TestPGReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		in     string
		client bool
	}{
		{"\x00\x00\x00\x07\x00\x03\x00\x00", true},                  // startup shorter than its header
		{"\x00\x00\x27\x11\x00\x03\x00\x00", true},                  // longer than PostgreSQL takes
		{"\x16\x03\x01\x02\x00\x01\x00\x01", true},                  // a TLS ClientHello (sslnegotiation=direct)
		{"\x00\x00\x00\x09\x00\x03\x00\x00", true},                  // truncated startup
		{"Z\x00\x00\x00\x03", false},                                // length below 4
		{"Z\x80\x00\x00\x00", false},                                // negative length
		{"Z\x00\x00\x00\x05", false},                                // truncated body
		{"Z\x00\x00", false},                                        // truncated header
		{"\x00\x00\x00\x08\x04\xd2\x16\x2fZ\x00\x00\x00\x02", true}, // a bad message after SSLRequest
	} {
		msgs, err := readPGAll(strings.NewReader(tc.in), 16, tc.client)
		if err == nil || err == io.EOF {
			t.Errorf("%q: %d messages, err %v; want an error", tc.in, len(msgs), err)
		}
	}
}

func TestPGBodies(t *testing.T) {
	parse := encode(t, &pgproto3.Parse{Name: "s1", Query: "SELECT $1", ParameterOIDs: []uint32{23}})
	if name, sql, ok := parseMsg(parse[5:]); !ok || name != "s1" || sql != "SELECT $1" {
		t.Errorf("Parse: %q %q %v", name, sql, ok)
	}
	bind := encode(t, &pgproto3.Bind{DestinationPortal: "p", PreparedStatement: "s1", Parameters: [][]byte{{0}}})
	if portal, stmt, ok := bindMsg(bind[5:]); !ok || portal != "p" || stmt != "s1" {
		t.Errorf("Bind: %q %q %v", portal, stmt, ok)
	}
	closeS := encode(t, &pgproto3.Close{ObjectType: 'S', Name: "s1"})
	if kind, name, ok := closeMsg(closeS[5:]); !ok || kind != 'S' || name != "s1" {
		t.Errorf("Close: %q %q %v", kind, name, ok)
	}
	for _, body := range []string{"", "s1", "s1\x00SELECT"} {
		if _, _, ok := parseMsg([]byte(body)); ok {
			t.Errorf("Parse body %q decoded", body)
		}
	}
	if _, _, ok := closeMsg(nil); ok {
		t.Error("empty Close body decoded")
	}
}

// FuzzPGMessages checks that the message reader never panics, that the
// messages it returns are exactly the stream's prefix, that each re-reads
// alone as itself, and that how the bytes arrive changes nothing; and
// that a session following the client's messages, with rules firing as
// mask says, numbers units by the messages that end them and holds or
// cuts only where a rule fired.
func FuzzPGMessages(f *testing.F) {
	client, server := clientSample(f), serverSample(f)
	f.Add(client, true, uint16(100), uint8(7), uint8(0))
	f.Add(client, true, uint16(9), uint8(1), uint8(0xff))
	f.Add(client, true, uint16(50), uint8(3), uint8(0x24))
	f.Add(server, false, uint16(60), uint8(5), uint8(0))
	f.Add([]byte("\x00\x00\x00\x10\x04\xd2\x16\x2e\x00\x00\x00\x07\x01\x02\x03\x04"), true, uint16(3), uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, client bool, at uint16, chunk uint8, mask uint8) {
		want, wantErr := readPGAll(bytes.NewReader(data), 4096, client)
		if wantErr == nil {
			t.Fatal("readPGAll ended without an error")
		}
		var prefix bytes.Buffer
		for _, m := range want {
			prefix.WriteString(m.raw)
			again, err := readPGAll(strings.NewReader(m.raw), 16, m.startup)
			if err != io.EOF || len(again) != 1 || again[0] != m {
				t.Fatalf("message %q re-reads as %+v, %v", m.raw, again, err)
			}
		}
		if !bytes.HasPrefix(data, prefix.Bytes()) {
			t.Fatalf("messages %+v are not a prefix of the input", want)
		}
		if wantErr == io.EOF && prefix.Len() != len(data) {
			t.Fatalf("clean EOF after %d of %d bytes", prefix.Len(), len(data))
		}
		split := &splitReader{data: data, at: int(at) % (len(data) + 1), chunk: max(int(chunk), 1, len(data)/256)}
		got, gotErr := readPGAll(split, 16, client)
		if gotErr.Error() != wantErr.Error() || len(got) != len(want) {
			t.Fatalf("split at %d in chunks of %d: %d messages, %v; whole: %d, %v",
				split.at, split.chunk, len(got), gotErr, len(want), wantErr)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("split: message %d = %q, want %q", i, got[i].raw, want[i].raw)
			}
		}
		if client {
			checkSession(t, want, mask)
		}
	})
}

// checkSession feeds the typed messages of msgs to a session whose rules
// fire on occasion i when bit i%8 of mask is set, with fault i%3+1.
func checkSession(t *testing.T, msgs []pgMsg, mask uint8) {
	occasion := 0
	var fired *Armed
	s := newPGSession(func(commit bool, stmt string, tx map[string]struct{}) *Armed {
		i := occasion
		occasion++
		if mask>>(i%8)&1 == 0 {
			return nil
		}
		f := Fault(i%3 + 1)
		if f.commit() != commit {
			return nil
		}
		fired = &Armed{rule: Rule{Fault: f}}
		return fired
	})
	var planned *plan
	unit := uint64(1)
	for _, m := range msgs {
		if m.startup {
			continue
		}
		fired = nil
		typ := m.raw[0]
		st, pl := s.client(typ, []byte(m.raw[5:]))
		if pl != nil {
			if planned != nil || fired == nil || pl.rule != fired || pl.unit != unit || pl.fault == CutBeforeCommit {
				t.Fatalf("message %q: plan %+v (already %+v), fired %+v, unit %d", m.raw, pl, planned, fired, unit)
			}
			planned = pl
		}
		ends := typ == 'Q' || typ == 'S' || typ == 'F'
		switch st {
		case stepCutBefore:
			if fired == nil || fired.rule.Fault != CutBeforeCommit || planned != nil {
				t.Fatalf("message %q: cut before, fired %+v, planned %+v", m.raw, fired, planned)
			}
			return
		case stepHold:
			if !ends || planned == nil || planned.unit != unit {
				t.Fatalf("message %q: hold, plan %+v, unit %d", m.raw, planned, unit)
			}
			return
		}
		if ends {
			if planned != nil {
				t.Fatalf("message %q ends planned unit %d without holding", m.raw, unit)
			}
			unit++
		}
		if s.unit != unit {
			t.Fatalf("after %q: session unit %d, want %d", m.raw, s.unit, unit)
		}
	}
}
