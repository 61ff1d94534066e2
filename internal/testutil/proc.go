package testutil

// The benchmarks measure the processes they start (an agent, kube-proxy)
// from /proc: memory from /proc/<pid>/status, CPU time from
// /proc/<pid>/stat. Each tool used to parse those files itself; the
// parsing lives here once, and each tool keeps the arithmetic and units of
// its own report (seconds, MiB or bytes), so that the figures it writes
// are unchanged.

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture Go runs on).
const ClockTicks = 100

// ProcTicks are a process's CPU times from /proc/<pid>/stat in ClockTicks:
// its own (utime, stime) and those of the children it waited for (cutime,
// cstime).
type ProcTicks struct {
	UTime, STime, CUTime, CSTime float64
}

// ReadProcTicks reads pid's CPU times from /proc/<pid>/stat.
func ReadProcTicks(pid int) (ProcTicks, error) {
	var t ProcTicks
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return t, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: field 3 (state) is rest[0], so utime (14) is rest[11]
	// and cstime (17) rest[14].
	i := strings.LastIndexByte(string(stat), ')')
	rest := strings.Fields(string(stat)[i+1:])
	if len(rest) < 15 {
		return t, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(rest)+2)
	}
	for j, dst := range []*float64{&t.UTime, &t.STime, &t.CUTime, &t.CSTime} {
		*dst, _ = strconv.ParseFloat(rest[11+j], 64)
	}
	return t, nil
}

// ReadProcStatusKB reads the named fields of /proc/<pid>/status (VmRSS,
// VmHWM: the ones counted in kB) as kB. A field the file lacks is absent
// from the map.
func ReadProcStatusKB(pid int, fields ...string) (map[string]int64, error) {
	out := map[string]int64{}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		for _, f := range fields {
			if k == f {
				out[f], _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	return out, nil
}

// LastLines is the last n lines of s (a process's log, for an error
// message), without a trailing newline.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
