package harness

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: map[string]string{}}
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
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
	m.Load = readTrim("/proc/loadavg")
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
