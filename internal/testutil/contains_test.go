package testutil

import (
	"fmt"
	"testing"
)

// errorsTB records the errors reported to it.
type errorsTB struct {
	testing.TB
	errs []string
}

func (e *errorsTB) Helper() {}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

func TestContainsAll(t *testing.T) {
	var tb errorsTB
	ContainsAll(&tb, "the table", "a\nb\n", "a\n", "c", "b", "d")
	want := []string{"the table lacks \"c\":\na\nb\n", "the table lacks \"d\":\na\nb\n"}
	if fmt.Sprint(tb.errs) != fmt.Sprint(want) {
		t.Errorf("errors %q, want %q", tb.errs, want)
	}
}
