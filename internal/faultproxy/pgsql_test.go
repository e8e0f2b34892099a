package faultproxy

import (
	"slices"
	"testing"
)

func TestSplitSQL(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{"commit", []string{"commit"}},
		{"  COMMIT ;  ", []string{"COMMIT"}},
		{"", nil},
		{" ; ;\n-- only a comment;\n/* and; another */", nil},
		{"BEGIN; INSERT INTO t VALUES (1); COMMIT", []string{"BEGIN", "INSERT INTO t VALUES (1)", "COMMIT"}},
		{"SELECT 'a;b'; END", []string{"SELECT 'a;b'", "END"}},
		{"SELECT 'it''s;'; commit", []string{"SELECT 'it''s;'", "commit"}},
		{`SELECT E'\';' ; commit`, []string{`SELECT E'\';'`, "commit"}},
		{`SELECT '\'; commit`, []string{`SELECT '\'`, "commit"}}, // standard strings: no escapes
		{`SELECT "a;""b"; commit`, []string{`SELECT "a;""b"`, "commit"}},
		{"SELECT $$a;b$$; commit", []string{"SELECT $$a;b$$", "commit"}},
		{"SELECT $f$ $$; $f$; commit", []string{"SELECT $f$ $$; $f$", "commit"}},
		{"SELECT $1; commit", []string{"SELECT $1", "commit"}},
		{"SELECT a$b; commit", []string{"SELECT a$b", "commit"}},
		{"SELECT 1 -- x; y\n; commit", []string{"SELECT 1 -- x; y", "commit"}},
		{"SELECT /* a /* b; */ c; */ 1; commit", []string{"SELECT /* a /* b; */ c; */ 1", "commit"}},
		{"SELECT 'unterminated; commit", []string{"SELECT 'unterminated; commit"}},
		{"SELECT $x$ unterminated; commit", []string{"SELECT $x$ unterminated; commit"}},
	} {
		if got := splitSQL(tc.sql); !slices.Equal(got, tc.want) {
			t.Errorf("splitSQL(%q) = %q, want %q", tc.sql, got, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		stmt string
		want txVerb
	}{
		{"commit", txCommit},
		{"COMMIT WORK", txCommit},
		{"Commit and chain", txCommit},
		{"END", txCommit},
		{"end transaction", txCommit},
		{"/* c */ -- d\n COMMIT", txCommit},
		{"COMMIT PREPARED 'x'", txNone},
		{"begin", txBegin},
		{"BEGIN ISOLATION LEVEL SERIALIZABLE", txBegin},
		{"START TRANSACTION", txBegin},
		{"START", txNone},
		{"ROLLBACK", txEnd},
		{"abort", txEnd},
		{"ROLLBACK TO SAVEPOINT s", txNone},
		{"rollback to s", txNone},
		{"ROLLBACK PREPARED 'x'", txNone},
		{"PREPARE TRANSACTION 'x'", txEnd},
		{"PREPARE p AS SELECT 1", txNone},
		{"INSERT INTO commits VALUES (1)", txNone},
		{"SELECT 'commit'", txNone},
		{"commitx", txNone},
		{"", txNone},
	} {
		if got := classify(tc.stmt); got != tc.want {
			t.Errorf("classify(%q) = %d, want %d", tc.stmt, got, tc.want)
		}
	}
}
