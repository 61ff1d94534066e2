package testutil

import (
	"maps"
	"strings"
	"testing"
)

func TestSamples(t *testing.T) {
	text := "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1 2\"} 3\nb 1.5e+06\n\nc NaN\n"
	got, err := Samples(strings.NewReader(text), func(l string) bool { return !strings.HasPrefix(l, "c ") })
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{`a_total{x="1 2"}`: 3, "b": 1.5e6}; !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"novalue\n", "a x\n"} {
		if _, err := Samples(strings.NewReader(bad), nil); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
