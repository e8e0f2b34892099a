package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoDeadLetter: no dead letter of that consumer at that position.
// weft re-exports it.
var ErrNoDeadLetter = errors.New("weft: no such dead letter")

// DeadLetter is a stored dead letter: weft's DeadLetter with its rows'
// data as stored.
type DeadLetter struct {
	Stream   string
	Consumer string
	Pos      int64
	// Partition is the group's partition; -1 for a single consumer.
	Partition int
	// Key is the group's key of the rows ("" for a single consumer).
	Key    string
	Writer string
	// Rows are the data of the position's table rows (of Partition, for
	// a group), as the function was given them.
	Rows             []json.RawMessage
	Error            string
	Attempts         int
	FirstFailedAt    time.Time
	LastFailedAt     time.Time
	DeadAt           time.Time
	RetryRequestedAt time.Time
}

// Bounds of one DeadLetters answer: a dead letter holds its rows, and an
// operator's listing must not take a process's memory.
const (
	// MaxDeadLettersRead is the most dead letters one read returns.
	MaxDeadLettersRead = 1000
	// MaxDeadLetterBytesRead bounds the rows' data one read returns: it
	// stops before the letter that would pass it (but returns at least
	// one).
	MaxDeadLetterBytesRead = 8 << 20
)

// DeadLetters reads the dead letters stored in db: those of consumer
// (single or group) of stream, or of every consumer of stream when
// consumer is "", or every one when stream is "" too; by stream,
// consumer, position and partition, the first MaxDeadLettersRead of them
// and at most MaxDeadLetterBytesRead of their rows' data (discard or
// retry those to see the rest).
func DeadLetters(ctx context.Context, db *pgxpool.Pool, stream, consumer string) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `SELECT stream, name, pos, partition, coalesce(key, ''), writer, rows::text, error, attempts,
			first_failed_at, last_failed_at, dead_at, retry_requested_at
		FROM weft_dead_letters WHERE ($1 = '' OR stream = $1) AND ($2 = '' OR name = $2)
		ORDER BY stream, name, pos, partition LIMIT $3`, stream, consumer, MaxDeadLettersRead)
	if err != nil {
		return nil, fmt.Errorf("weft: read dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	size := 0
	for rows.Next() {
		var d DeadLetter
		var data string
		var retry *time.Time
		if err := rows.Scan(&d.Stream, &d.Consumer, &d.Pos, &d.Partition, &d.Key, &d.Writer, &data, &d.Error, &d.Attempts,
			&d.FirstFailedAt, &d.LastFailedAt, &d.DeadAt, &retry); err != nil {
			return nil, fmt.Errorf("weft: read dead letters: %w", err)
		}
		if size += len(data); size > MaxDeadLetterBytesRead && len(out) > 0 {
			break
		}
		if retry != nil {
			d.RetryRequestedAt = *retry
		}
		if err := json.Unmarshal([]byte(data), &d.Rows); err != nil {
			return nil, fmt.Errorf("weft: read dead letters: dead letter %d of %s: %w", d.Pos, d.Stream, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("weft: read dead letters: %w", err)
	}
	return out, nil
}

// RetryDeadLetter asks that the dead letters of consumer of stream at pos
// (one per failed partition, for a group) be applied again: a process
// that runs the consumer (the member that owns the partition, for a
// group) applies them with its function within about its
// Config.AnnounceInterval, in a transaction that holds the cursor's lock
// (fenced, for a group) and deletes the dead letter. If the function
// fails again, the dead letter stays, with one more attempt and the new
// error. It returns once the request is stored (ErrNoDeadLetter if there
// is no such dead letter); DeadLetters shows when it is carried out.
func RetryDeadLetter(ctx context.Context, db *pgxpool.Pool, stream, consumer string, pos int64) error {
	tag, err := db.Exec(ctx, `UPDATE weft_dead_letters SET retry_requested_at = now() WHERE stream = $1 AND name = $2 AND pos = $3`,
		stream, consumer, pos)
	if err != nil {
		return fmt.Errorf("weft: retry dead letter %d of %s of %s: %w", pos, consumer, stream, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d of %s of %s", ErrNoDeadLetter, pos, consumer, stream)
	}
	return nil
}

// DiscardDeadLetter deletes the dead letters of consumer of stream at pos
// (every partition's, for a group): they are never applied
// (ErrNoDeadLetter if there is none). A retry being carried out at that
// moment finishes first.
func DiscardDeadLetter(ctx context.Context, db *pgxpool.Pool, stream, consumer string, pos int64) error {
	tag, err := db.Exec(ctx, `DELETE FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3`, stream, consumer, pos)
	if err != nil {
		return fmt.Errorf("weft: discard dead letter %d of %s of %s: %w", pos, consumer, stream, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d of %s of %s", ErrNoDeadLetter, pos, consumer, stream)
	}
	return nil
}
