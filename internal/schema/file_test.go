package schema

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func TestParseUp(t *testing.T) {
	src := `-- a file comment
-- +goose Up
-- the table
CREATE TABLE a (
	id int -- a comment; not the end
);
INSERT INTO a VALUES (1); -- trailing comment

-- +goose StatementBegin
CREATE FUNCTION f() RETURNS int AS $$
BEGIN
	RETURN 1;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION f;
DROP TABLE a;
`
	stmts, useTx, err := parseUp(src)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"CREATE TABLE a (\n\tid int -- a comment; not the end\n);",
		"INSERT INTO a VALUES (1); -- trailing comment",
		"CREATE FUNCTION f() RETURNS int AS $$\nBEGIN\n\tRETURN 1;\nEND;\n$$ LANGUAGE plpgsql;",
	}
	if !reflect.DeepEqual(stmts, want) || !useTx {
		t.Fatalf("parseUp = %q, useTx %v; want %q, true", stmts, useTx, want)
	}

	stmts, useTx, err = parseUp("-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY i ON a (id);\n")
	if err != nil || useTx || len(stmts) != 1 {
		t.Fatalf("NO TRANSACTION: %q, useTx %v, %v; want one statement outside a transaction", stmts, useTx, err)
	}
}

// A file that is not a migration is refused with its name and what is
// wrong, before anything runs.
func TestCollectBadFiles(t *testing.T) {
	good := &fstest.MapFile{Data: []byte("-- +goose Up\nSELECT 1;\n")}
	for name, tc := range map[string]struct {
		files fstest.MapFS
		want  string
	}{
		"no up":          {fstest.MapFS{"00001_a.sql": {Data: []byte("CREATE TABLE a (id int);\n")}}, "00001_a.sql: line 1: SQL before"},
		"empty":          {fstest.MapFS{"00001_a.sql": {Data: nil}}, "00001_a.sql: no '-- +goose Up'"},
		"no semicolon":   {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (id int)\n")}}, "00001_a.sql: the last statement does not end"},
		"up unfinished":  {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\nSELECT 1\n-- +goose Down\nSELECT 2;\n")}}, "00001_a.sql: line 3: the Up statement"},
		"open block":     {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\n-- +goose StatementBegin\nSELECT 1;\n")}}, "without its StatementEnd"},
		"stray end":      {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\n-- +goose StatementEnd\n")}}, "line 2: StatementEnd without StatementBegin"},
		"two ups":        {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\n-- +goose Up\n")}}, "line 2: a second Up"},
		"unknown":        {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Up\n-- +goose ENVSUB ON\n")}}, `"ENVSUB ON" is not supported`},
		"name":           {fstest.MapFS{"init.sql": good}, "init.sql: want <version>_<name>.sql"},
		"zero version":   {fstest.MapFS{"0_init.sql": good}, "0_init.sql: want"},
		"same version":   {fstest.MapFS{"1_a.sql": good, "001_b.sql": good}, "001_b.sql and 1_a.sql have the same version 1"},
		"down before up": {fstest.MapFS{"00001_a.sql": {Data: []byte("-- +goose Down\nSELECT 1;\n")}}, "line 1: Down before Up"},
	} {
		_, err := collect(tc.files)
		if !errors.Is(err, errFormat) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: collect = %v; want a bad-file error containing %q", name, err, tc.want)
		}
	}
	migs, err := collect(fstest.MapFS{"00010_b.sql": good, "00002_a.sql": good, "README.md": {Data: []byte("x")}})
	if err != nil || len(migs) != 2 || migs[0].version != 2 || migs[1].version != 10 {
		t.Fatalf("collect = %+v, %v; want versions 2 then 10, README ignored", migs, err)
	}
}
