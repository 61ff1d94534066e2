package harness

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// DescribeMachine says where a benchmark runs: CPU, memory, kernel, Go,
// load and the versions of the tools the modes use.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: map[string]string{}}
	m.Kernel = ReadTrim("/proc/sys/kernel/osrelease")
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.MemBytes = kb * 1024
			}
		}
	}
	m.Load = ReadTrim("/proc/loadavg")
	for name, argv := range map[string][]string{
		"iptables": {"iptables-legacy", "--version"},
		"nft":      {"nft", "--version"},
		"bpftool":  {"bpftool", "version"},
	} {
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			m.Tools[name] = "missing"
			continue
		}
		m.Tools[name] = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	return m
}

// ReadTrim returns the contents of a /proc or /sys file, trimmed, or "?".
func ReadTrim(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
