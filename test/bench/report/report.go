// Package report writes a benchmark run as JSON (the record), Markdown (the
// table a person reads, with ratios to the direct-connection floor) and PNG
// plots drawn with the standard library only.
package report

import (
	"fmt"

	"github.com/sluice-lb/sluice/test/bench/harness"
)

// Write writes <dir>/<stamp>.json, .md and the plots, and returns their paths.
func Write(dir, stamp string, res *harness.Results) ([]string, error) {
	files, err := harness.WriteRecord(dir, stamp, res, Markdown(res, stamp))
	if err != nil {
		return nil, err
	}
	plots, err := Plots(dir, stamp, res)
	if err != nil {
		return files, fmt.Errorf("plots: %w", err)
	}
	return append(files, plots...), nil
}
