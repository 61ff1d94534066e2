package main

import (
	"bufio"
	"strings"
	"time"
)

// startPhases splits a Sluice agent's first sync by its own log (slog's
// text format, --log-level info): from the process's start to the Kubernetes
// source's "waiting for caches to sync" (the datapath opened and attached,
// the metrics served), and the wait for the informers' lists until
// "caches synced" (its after= field). What is left of the first sync is the
// sync itself. ok is false when the log lacks either line.
func startPhases(log string, started time.Time) (startup, caches float64, ok bool) {
	var waiting time.Time
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `msg="waiting for caches to sync"`):
			t, err := time.Parse(time.RFC3339Nano, field(line, "time"))
			if err != nil {
				return 0, 0, false
			}
			waiting = t
		case strings.Contains(line, `msg="caches synced"`) && !waiting.IsZero():
			d, err := time.ParseDuration(field(line, "after"))
			if err != nil {
				return 0, 0, false
			}
			return waiting.Sub(started).Seconds(), d.Seconds(), true
		}
	}
	return 0, 0, false
}

// field returns key's value in one slog text line ("" if absent): the
// token after " key=" (or at the line's start), unquoted values only.
func field(line, key string) string {
	i := strings.Index(" "+line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+1:]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}
