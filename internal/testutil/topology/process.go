package topology

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is a long-running child started inside a namespace.
type Process struct {
	Cmd *exec.Cmd

	stopOnce sync.Once
	waitErr  error
	exited   chan struct{}
}

// Start runs name with args inside the namespace (through nsenter), its
// stdout and stderr going to out. The process is stopped when the topology
// closes, if it has not been stopped before. cg, if not nil, is the cgroup
// it starts in.
func (n *NS) Start(out io.Writer, cg *Cgroup, name string, args ...string) (*Process, error) {
	cmd := n.Command(context.Background(), name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// If this process is killed before it can clean up, the child gets
	// SIGTERM rather than living on in a namespace nobody will remove.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if cg != nil {
		cg.Put(cmd)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", name, n.Name, err)
	}
	p := &Process{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	n.topo.Defer(func() error {
		err := p.Stop(5 * time.Second)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil // it ran; how it ended is the test's business
		}
		return err
	})
	return p, nil
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err returns how the process ended; valid once Exited is closed.
func (p *Process) Err() error {
	<-p.exited
	return p.waitErr
}

// Stop sends SIGTERM, waits up to grace for the process to exit, then kills
// it. It returns how the process ended (nil for exit status 0). Calling it
// again returns the same result.
func (p *Process) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = p.Cmd.Process.Kill()
			<-p.exited
		}
	})
	return p.Err()
}
