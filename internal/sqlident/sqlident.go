// Package sqlident is the one rule for the SQL identifiers weft writes
// into statements (table, column, sequence and version-table names from
// configuration): plain lower-case names, which read the same quoted or
// not, so no statement can be broken out of and PostgreSQL's folding of
// unquoted names changes nothing.
package sqlident

// Rule describes what Valid accepts, for error messages.
const Rule = "a plain lower-case SQL identifier: a-z or _, then a-z, 0-9 or _, at most 63 bytes"

// Valid reports whether s is a plain lower-case SQL identifier.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
