package faultproxy

import (
	"strings"
)

// splitSQL splits a simple Query's text into its statements the way the
// server runs them: at semicolons outside string literals, quoted
// identifiers, dollar quotes and comments; statements holding nothing but
// space and comments are left out, as the server skips them. (The server
// answers such a statement with nothing, and a Query of none with one
// EmptyQueryResponse.) It does not know the body of BEGIN ATOMIC ... END,
// whose semicolons it takes for separators.
func splitSQL(sql string) []string {
	var stmts []string
	start, empty := 0, true
	end := func(at int) {
		if !empty {
			stmts = append(stmts, strings.TrimSpace(sql[start:at]))
		}
		start, empty = at+1, true
	}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ';':
			end(i)
			i++
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			i = skipLineComment(sql, i)
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			i = skipBlockComment(sql, i)
		case c == '\'':
			empty = false
			i = skipQuoted(sql, i, '\'', escapeString(sql, i))
		case c == '"':
			empty = false
			i = skipQuoted(sql, i, '"', false)
		case c == '$' && (i == 0 || !identByte(sql[i-1])):
			empty = false
			i = skipDollar(sql, i)
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		default:
			empty = false
			i++
		}
	}
	end(len(sql))
	return stmts
}

// skipLineComment returns the index after the "--" comment at i.
func skipLineComment(sql string, i int) int {
	if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(sql)
}

// skipBlockComment returns the index after the "/*" comment at i; block
// comments nest.
func skipBlockComment(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case strings.HasPrefix(sql[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(sql[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(sql)
}

// escapeString reports whether the quote at i opens an E'...' string, in
// which a backslash escapes the next byte.
func escapeString(sql string, i int) bool {
	return i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i == 1 || !identByte(sql[i-2]))
}

// skipQuoted returns the index after the literal or identifier opened by
// quote q at i; a doubled q is part of it.
func skipQuoted(sql string, i int, q byte, backslash bool) int {
	for i++; i < len(sql); i++ {
		switch sql[i] {
		case '\\':
			if backslash {
				i++
			}
		case q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(sql)
}

// skipDollar returns the index after the dollar-quoted string opened at i,
// or i+1 when the '$' opens none (a parameter such as $1).
func skipDollar(sql string, i int) int {
	j := i + 1
	for j < len(sql) && sql[j] != '$' && identByte(sql[j]) && !(j == i+1 && sql[j] >= '0' && sql[j] <= '9') {
		j++
	}
	if j >= len(sql) || sql[j] != '$' {
		return i + 1
	}
	tag := sql[i : j+1]
	if k := strings.Index(sql[j+1:], tag); k >= 0 {
		return j + 1 + k + len(tag)
	}
	return len(sql)
}

// identByte reports whether b may continue an identifier.
func identByte(b byte) bool {
	return b == '_' || b == '$' || b >= 0x80 ||
		('a' <= b && b <= 'z') || ('A' <= b && b <= 'Z') || ('0' <= b && b <= '9')
}

// txVerb is what a statement does to the transaction it runs in.
type txVerb int

const (
	txNone   txVerb = iota
	txBegin         // BEGIN, START TRANSACTION
	txCommit        // COMMIT, END (with WORK, TRANSACTION, AND CHAIN)
	txEnd           // ROLLBACK, ABORT, PREPARE TRANSACTION: ends it without committing
)

// classify tells what one statement does to the transaction. COMMIT
// PREPARED and ROLLBACK PREPARED finish another, prepared transaction, and
// ROLLBACK TO a savepoint ends none: they are txNone.
func classify(stmt string) txVerb {
	first, rest := keyword(stmt)
	second, _ := keyword(rest)
	switch first {
	case "begin":
		return txBegin
	case "start":
		if second == "transaction" {
			return txBegin
		}
	case "commit", "end":
		if second != "prepared" {
			return txCommit
		}
	case "rollback", "abort":
		if second != "prepared" && second != "to" {
			return txEnd
		}
	case "prepare":
		if second == "transaction" {
			return txEnd
		}
	}
	return txNone
}

// keyword returns the first word of s, lower-cased, after space and
// comments, and what follows it.
func keyword(s string) (word, rest string) {
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case strings.HasPrefix(s[i:], "--"):
			i = skipLineComment(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = skipBlockComment(s, i)
		default:
			j := i
			for j < len(s) && (('a' <= s[j] && s[j] <= 'z') || ('A' <= s[j] && s[j] <= 'Z')) {
				j++
			}
			return strings.ToLower(s[i:j]), s[j:]
		}
	}
	return "", ""
}
