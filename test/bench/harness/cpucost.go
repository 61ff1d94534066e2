package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// CPU per connection (issue 14, sixty-fourth pass). Connections per second
// on this shared 2-vCPU machine move by +-25% from one run to the next,
// because the client and the server share the CPUs with whatever else
// runs; the CPU time the connections themselves took moves far less. So
// every client run also records the CPU of the processes that carry its
// connections, divided by the connections it made:
//
//   - the client: its rusage (utime+stime, which the kernel scales to the
//     exact sum of its threads' run time), start-up included (the same
//     target list in every mode);
//   - the backend server: its threads' run time
//     (/proc/<pid>/task/*/schedstat, ns) before and after the run;
//   - ksoftirqd (every CPU's): the softirq work the kernel deferred.
//
// On this kernel (no CONFIG_IRQ_TIME_ACCOUNTING) a softirq is charged to
// the task it runs on, and a veth transmit queues the packet to the
// sending CPU's backlog, which the sender itself processes when it
// re-enables bottom halves: every hop of a connection (the client's
// stack, the node's tc programs and forwarding, the backend's stack) runs
// in the client's or the server's context, or in ksoftirqd's when the
// softirq overran its budget. ksoftirqd also runs other work on the
// machine (it is machine wide), so the total is given with and without
// it. The agent's own CPU (its conntrack GC poll, every second) is kept
// apart: it is a cost per second, not per connection.

// CPUCost is one client run's CPU per connection, in microseconds.
type CPUCost struct {
	Conns      int     `json:"conns"`
	ClientUs   float64 `json:"client_us"`
	ServerUs   float64 `json:"server_us"`
	SoftirqdUs float64 `json:"ksoftirqd_us"`
	AgentUs    float64 `json:"agent_us,omitempty"`
	// TotalUs is client + server + ksoftirqd.
	TotalUs float64 `json:"total_us"`
	// Load1 is the machine's 1-minute load average when the run began.
	Load1 float64 `json:"load1"`
}

// cpuSnap is the run time (ns) of the processes a client run's CPU is
// read from, before the run.
type cpuSnap struct {
	server, softirqd, agent uint64
	load1                   float64
}

// ThreadsRunNs is the time every thread of process pid has spent on a
// CPU, in ns: the first field of each /proc/<pid>/task/*/schedstat (ns,
// where /proc/<pid>/stat counts 10 ms ticks). A thread that exits
// meanwhile is left out, and takes its time with it (Go ends none of its
// threads but locked ones). An error if pid has no threads (it is gone)
// or a field is not a number. The kube bench's CPU per change reads it
// too.
func ThreadsRunNs(pid int) (uint64, error) {
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("no threads of %d: %v", pid, err)
	}
	var sum uint64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		sum += n
	}
	return sum, nil
}

// procRunNs is ThreadsRunNs, 0 if the process is gone (or pid is none).
func procRunNs(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	n, _ := ThreadsRunNs(pid)
	return n
}

// softirqdPids are the ksoftirqd threads' pids.
func softirqdPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			out = append(out, pid)
		}
	}
	return out
}

func softirqdNs(pids []int) uint64 {
	var sum uint64
	for _, p := range pids {
		sum += procRunNs(p)
	}
	return sum
}

// load1 is the 1-minute load average.
func load1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// snapCPU reads what a run's CPU is measured from, before it.
func (r *runner) snapCPU(e *env) cpuSnap {
	return cpuSnap{
		server:   procRunNs(serverPid(e)),
		softirqd: softirqdNs(r.softirqd),
		agent:    procRunNs(agentPid(e)),
		load1:    load1(),
	}
}

// cpuCost is the run's CPU per connection, from the snapshot before it and
// the client's rusage.
func (r *runner) cpuCost(e *env, before cpuSnap, client *os.ProcessState, conns int) *CPUCost {
	if conns == 0 || client == nil {
		return nil
	}
	ru, ok := client.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil
	}
	us := func(after, before uint64) float64 {
		if after < before {
			return 0
		}
		return float64(after-before) / 1e3 / float64(conns)
	}
	c := &CPUCost{
		Conns:      conns,
		ClientUs:   float64(syscall.TimevalToNsec(ru.Utime)+syscall.TimevalToNsec(ru.Stime)) / 1e3 / float64(conns),
		ServerUs:   us(procRunNs(serverPid(e)), before.server),
		SoftirqdUs: us(softirqdNs(r.softirqd), before.softirqd),
		AgentUs:    us(procRunNs(agentPid(e)), before.agent),
		Load1:      before.load1,
	}
	c.TotalUs = c.ClientUs + c.ServerUs + c.SoftirqdUs
	return c
}

func serverPid(e *env) int {
	if e.server == nil || e.server.Process == nil {
		return 0
	}
	return e.server.Process.Pid
}

func agentPid(e *env) int {
	if sm, ok := e.m.(*sluiceMode); ok && sm.agent != nil {
		return sm.agent.Pid()
	}
	return 0
}
