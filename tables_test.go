package weft_test

import (
	"slices"
	"testing"

	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// A fresh database opened by weft.Open holds weft's own tables (those
// docs/OPERATIONS.md lists, "The database's tables") and the stream's:
// none of the binaries' workload (the shard maps, the rooms).
func TestOpenCreatesOnlyItsOwnTables(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	n := wefttest.Open(t, writerConfig(db, rds, jobs))
	got := testenv.Column[string](t, n.DB(), `SELECT c.relname::text FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = current_schema() AND c.relkind IN ('r', 'v', 'p') ORDER BY 1`)
	want := []string{"jobs", "stream_persisted", "stream_positions", "weft_consumer_attempts", "weft_consumers",
		"weft_dead_letters", "weft_group_cursors", "weft_group_members", "weft_group_partitions", "weft_group_progress",
		"weft_schema_version", "weft_stream_marks", "weft_stream_retention", "weft_writers"}
	if !slices.Equal(got, want) {
		t.Fatalf("tables after Open: %v\nwant %v", got, want)
	}
}
