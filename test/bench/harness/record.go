package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// The three benchmark commands (this harness through package report,
// test/bench/nodeport and test/bench/kubeproxy) record a run the same way:
// when it started and finished, and the results as indented JSON (the
// record) beside a Markdown rendering (what a person reads).

// Span is when a run started and finished, in UTC. A report's result
// embeds it first, so that its JSON begins with "started" and "finished".
type Span struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
}

// StartSpan is a Span started now.
func StartSpan() Span { return Span{Started: time.Now().UTC()} }

// Finish records now as the end of the run.
func (s *Span) Finish() { s.Finished = time.Now().UTC() }

// Times says when the run started and finished and how long it took, as
// the reports' Markdown states it: "Started 2026-11-22 13:36:50Z, finished
// 13:52:11Z (15m21s)".
func (s Span) Times() string {
	return fmt.Sprintf("Started %s, finished %s (%s)", s.Started.Format("2006-01-02 15:04:05Z"),
		s.Finished.Format("15:04:05Z"), s.Finished.Sub(s.Started).Round(time.Second))
}

// WriteRecord writes v as <dir>/<name>.json and markdown as
// <dir>/<name>.md, creating dir, and returns the two paths in that order.
func WriteRecord(dir, name string, v any, markdown []byte) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	base := filepath.Join(dir, name)
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".md", markdown, 0o644); err != nil {
		return nil, err
	}
	return []string{base + ".json", base + ".md"}, nil
}

// TempDir makes a temporary directory for a run's files (the agent it
// builds, a per-mode state: bpffs mounts among them) and returns a
// function that removes it, detaching every mount left under it first (a
// failed or interrupted run may not have closed its modes), and logs a
// failure to. The directory is named prefix<pid>-*: it first removes, the
// same way, those of earlier runs whose process is gone (killed: SIGKILL,
// a test binary's timeout), as a later run does with their namespaces.
func TempDir(prefix string, log *slog.Logger) (string, func(), error) {
	removeStaleTempDirs(os.TempDir(), prefix, log)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	return dir, func() {
		if err := removeTempDir(dir); err != nil {
			log.Warn("remove temporary directory", "dir", dir, "err", err)
		}
	}, nil
}

// RunAndReadBack is a benchmark command's end-to-end test: it runs the
// benchmark (run, bounded by timeout, logging to stderr), writes its
// report (write), and returns the record decoded back from the JSON file
// and the Markdown file's text, failing tb on any error.
func RunAndReadBack[R any](tb testing.TB, timeout time.Duration, run func(context.Context, *slog.Logger) (*R, error), write func(*R) ([]string, error)) (R, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := run(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	files, err := write(res)
	if err != nil {
		tb.Fatal(err)
	}
	md, err := os.ReadFile(files[1])
	if err != nil {
		tb.Fatal(err)
	}
	return testutil.DecodeJSONFile[R](tb, files[0]), string(md)
}
