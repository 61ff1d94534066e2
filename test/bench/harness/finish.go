package harness

import (
	"fmt"
	"log/slog"
)

// Finish ends a benchmark command: it writes the report of what the run
// measured (write; nil when it measured nothing), prints the files
// written, and logs the run's error, which a report does not hide: a run
// that failed half way still reports the half it measured. It returns the
// process's exit code: 1 if the run or the report failed.
func Finish(log *slog.Logger, write func() ([]string, error), runErr error) int {
	if write != nil {
		files, err := write()
		if err != nil {
			log.Error("report", "err", err)
			return 1
		}
		for _, f := range files {
			fmt.Println(f)
		}
	}
	if runErr != nil {
		log.Error("run", "err", runErr)
		return 1
	}
	return 0
}
