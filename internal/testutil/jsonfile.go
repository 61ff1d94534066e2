package testutil

import (
	"encoding/json"
	"os"
	"testing"
)

// DecodeJSONFile reads the JSON file at path into a T, failing tb if it
// cannot be read or does not parse: a test's check that a report it had
// written reads back.
func DecodeJSONFile[T any](tb testing.TB, path string) T {
	tb.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatalf("%s does not parse: %v", path, err)
	}
	return v
}
