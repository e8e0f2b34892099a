package schema

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// migration is one SQL file: its version (the number its name starts
// with), the statements of its Up section, and whether they run in a
// transaction.
type migration struct {
	version int64
	file    string
	stmts   []string
	useTx   bool
}

// errFormat marks a migration file that cannot be read as one.
var errFormat = errors.New("schema: bad migration file")

// collect reads every *.sql file at the top of fsys, in version order.
// A name is <version>_<anything>.sql with version a positive integer,
// each version used once.
func collect(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("schema: list migrations: %w", err)
	}
	var out []migration
	seen := map[int64]string{}
	for _, name := range names {
		v, err := fileVersion(name)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("%w: %s and %s have the same version %d", errFormat, other, name, v)
		}
		seen[v] = name
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("schema: read %s: %w", name, err)
		}
		stmts, useTx, err := parseUp(string(data))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errFormat, name, err)
		}
		out = append(out, migration{version: v, file: name, stmts: stmts, useTx: useTx})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

func fileVersion(name string) (int64, error) {
	base := strings.TrimSuffix(path.Base(name), ".sql")
	num, _, ok := strings.Cut(base, "_")
	v, err := strconv.ParseInt(num, 10, 64)
	if !ok || err != nil || v < 1 {
		return 0, fmt.Errorf("%w: %s: want <version>_<name>.sql with a version of 1 or more", errFormat, name)
	}
	return v, nil
}

// parseUp returns the statements of a migration's Up section, in goose's
// SQL format: "-- +goose Up" then "-- +goose Down" sections, a statement
// ending at a line that ends with a semicolon unless it is between
// "-- +goose StatementBegin" and "-- +goose StatementEnd", and "-- +goose
// NO TRANSACTION" to run the file outside a transaction.
func parseUp(src string) (stmts []string, useTx bool, err error) {
	const (
		start = iota
		up
		down
	)
	section, block, useTx := start, false, true
	var buf strings.Builder
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") && strings.Contains(trimmed, "+goose") {
			word := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(trimmed, "--")), "+goose"))
			switch strings.ToUpper(word) {
			case "UP":
				if section != start {
					return nil, false, fmt.Errorf("line %d: a second Up annotation", n)
				}
				section = up
			case "DOWN":
				if section != up || block {
					return nil, false, fmt.Errorf("line %d: Down before Up or inside a StatementBegin block", n)
				}
				if rest := strings.TrimSpace(buf.String()); rest != "" && section == up {
					return nil, false, fmt.Errorf("line %d: the Up statement before it does not end with a semicolon: %q", n, rest)
				}
				section = down
			case "STATEMENTBEGIN":
				if section == start || block {
					return nil, false, fmt.Errorf("line %d: StatementBegin before Up or inside another", n)
				}
				block = true
			case "STATEMENTEND":
				if !block {
					return nil, false, fmt.Errorf("line %d: StatementEnd without StatementBegin", n)
				}
				block = false
				if section == up {
					stmts = append(stmts, strings.TrimSpace(buf.String()))
				}
				buf.Reset()
			case "NO TRANSACTION":
				useTx = false
			default:
				return nil, false, fmt.Errorf("line %d: annotation %q is not supported (Up, Down, StatementBegin, StatementEnd, NO TRANSACTION are)", n, word)
			}
			continue
		}
		if section == start {
			if trimmed == "" || strings.HasPrefix(trimmed, "--") {
				continue
			}
			return nil, false, fmt.Errorf("line %d: SQL before the '-- +goose Up' annotation", n)
		}
		if buf.Len() == 0 && !block && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue // comments and blank lines between statements
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
		if !block && endsWithSemicolon(line) {
			if section == up {
				stmts = append(stmts, strings.TrimSpace(buf.String()))
			}
			buf.Reset()
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	switch {
	case section == start:
		return nil, false, errors.New("no '-- +goose Up' annotation")
	case block:
		return nil, false, errors.New("a StatementBegin without its StatementEnd")
	case strings.TrimSpace(buf.String()) != "":
		return nil, false, fmt.Errorf("the last statement does not end with a semicolon: %q", strings.TrimSpace(buf.String()))
	}
	return stmts, useTx, nil
}

// endsWithSemicolon reports whether line's SQL, less a trailing "--"
// comment, ends with a semicolon (as goose decides it).
func endsWithSemicolon(line string) bool {
	prev := ""
	for _, word := range strings.Fields(line) {
		if strings.HasPrefix(word, "--") {
			break
		}
		prev = word
	}
	return strings.HasSuffix(prev, ";")
}
