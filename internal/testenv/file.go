package testenv

import (
	"os"
	"testing"
)

// ReadFile is the content of the file at path; it fails t if the file
// cannot be read.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
