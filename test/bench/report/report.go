// Package report writes a benchmark run as JSON (the record), Markdown (the
// table a person reads, with ratios to the direct-connection floor) and PNG
// plots drawn with the standard library only.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-lb/sluice/test/bench/harness"
)

// Write writes <dir>/<stamp>.json, .md and the plots, and returns their paths.
func Write(dir, stamp string, res *harness.Results) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, stamp+".json")
	if err := os.WriteFile(p, append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	files = append(files, p)
	p = filepath.Join(dir, stamp+".md")
	if err := os.WriteFile(p, Markdown(res, stamp), 0o644); err != nil {
		return nil, err
	}
	files = append(files, p)
	plots, err := Plots(dir, stamp, res)
	if err != nil {
		return files, fmt.Errorf("plots: %w", err)
	}
	return append(files, plots...), nil
}
