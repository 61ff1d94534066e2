package topology

// A Prober is the test binary itself, started again as a child inside a
// namespace and, optionally, a cgroup, where it runs the probes it is sent
// on stdin (one JSON object a line) and writes their results on stdout.
// Socket load balancing follows the cgroup of the process that creates a
// socket, so the clients that must be under it (a node's own processes)
// cannot be goroutines of the test: they live in a Prober. The test
// binary's TestMain hands over to ProberMain when IsProber says so.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// proberEnv, set in a child's environment, makes the test binary a Prober.
const proberEnv = "SLUICE_TOPOLOGY_PROBER"

// IsProber reports whether this process was started as a Prober. A test
// binary that starts Probers calls it first thing in TestMain:
//
//	if topology.IsProber() {
//		os.Exit(topology.ProberMain())
//	}
func IsProber() bool { return os.Getenv(proberEnv) != "" }

type proberRequest struct {
	ID    uint64 `json:"id"`
	Probe Probe  `json:"probe"`
}

type proberResponse struct {
	ID     uint64      `json:"id"`
	Result ProbeResult `json:"result"`
}

// ProberMain runs probes read from stdin, concurrently, until stdin
// closes, and returns the exit status.
func ProberMain() int {
	var out sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	var wg sync.WaitGroup
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var req proberRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "prober: bad request %q: %v\n", sc.Text(), err)
			return 2
		}
		wg.Go(func() {
			res := RunProbe(req.Probe)
			out.Lock()
			defer out.Unlock()
			// A response that cannot be written means the test side is
			// gone (its pipe closed): nobody is left to tell.
			_ = enc.Encode(proberResponse{ID: req.ID, Result: res})
		})
	}
	wg.Wait()
	return 0
}

// Prober is a running child that runs probes (see IsProber).
type Prober struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *testutil.Buffer

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]chan ProbeResult
	dead    error // set once the child's stdout ends
	exited  chan struct{}
}

// StartProber starts the test binary as a Prober inside the namespace and,
// if cg is not nil, inside the cgroup from its first instruction. It is
// stopped when the topology closes.
func (n *NS) StartProber(cg *Cgroup) (*Prober, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("prober: %w", err)
	}
	cmd := exec.Command("nsenter", "--net="+n.Path, "--", exe)
	cmd.Env = append(os.Environ(), proberEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cg != nil {
		cg.Put(cmd)
	}
	p := &Prober{cmd: cmd, stderr: &testutil.Buffer{}, waiting: map[uint64]chan ProbeResult{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start prober in %s: %w", n.Name, err)
	}
	go p.read(stdout)
	n.topo.Defer(p.Close)
	return p, nil
}

func (p *Prober) read(stdout io.Reader) {
	dec := json.NewDecoder(stdout)
	var err error
	for {
		var resp proberResponse
		if err = dec.Decode(&resp); err != nil {
			break
		}
		p.mu.Lock()
		ch := p.waiting[resp.ID]
		delete(p.waiting, resp.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- resp.Result
		}
	}
	// The exit status adds nothing to the read error and stderr kept below.
	_ = p.cmd.Wait()
	p.mu.Lock()
	p.dead = fmt.Errorf("prober exited (%v): %s", err, p.stderr.String())
	for id, ch := range p.waiting {
		ch <- ProbeResult{Outcome: Failed, Err: p.dead.Error()}
		delete(p.waiting, id)
	}
	p.mu.Unlock()
	close(p.exited)
}

// Probe runs pr in the child and waits for its result (up to the probe's
// own timeout and a margin).
func (p *Prober) Probe(pr Probe) ProbeResult {
	ch := make(chan ProbeResult, 1)
	p.mu.Lock()
	if p.dead != nil {
		p.mu.Unlock()
		return ProbeResult{Outcome: Failed, Err: p.dead.Error()}
	}
	p.nextID++
	id := p.nextID
	p.waiting[id] = ch
	line, _ := json.Marshal(proberRequest{ID: id, Probe: pr})
	_, err := p.stdin.Write(append(line, '\n'))
	p.mu.Unlock()
	if err != nil {
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
		return ProbeResult{Outcome: Failed, Err: fmt.Sprintf("send to prober: %v", err)}
	}
	select {
	case r := <-ch:
		return r
	case <-time.After(pr.Timeout + 10*time.Second):
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
		return ProbeResult{Outcome: Failed, Err: "prober did not answer"}
	}
}

// Close ends the child (closing its stdin lets it finish what runs) and
// waits for it.
func (p *Prober) Close() error {
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill() // it may have exited meanwhile; <-p.exited tells
		<-p.exited
	}
	return nil
}
