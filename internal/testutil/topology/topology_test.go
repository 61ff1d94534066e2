package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

func TestLBTopologyCarriesTrafficAndCleansUp(t *testing.T) {
	testutil.Privileged(t)
	topo, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = topo.Close() })

	lb, err := topo.BuildLB(2)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{lb.Client.Name, lb.Node.Name, lb.Backends[0].Name, lb.Backends[1].Name}
	for _, n := range names {
		if !strings.HasPrefix(n, topo.Prefix()) {
			t.Errorf("namespace %q lacks the run's prefix %q", n, topo.Prefix())
		}
		if _, err := os.Stat(filepath.Join(netnsDir, n)); err != nil {
			t.Errorf("namespace %s not visible: %v", n, err)
		}
	}

	for i, be := range lb.Backends {
		if _, err := be.ServeHTTP(net.JoinHostPort(lb.BackendAddrs[i].String(), "8080"), be.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lb.Backends[0].ServeTCPEcho(lb.BackendAddrs[0].String()+":9000", "tcp-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := lb.Backends[1].ServeUDPEcho(lb.BackendAddrs[1].String()+":5353", "udp-b"); err != nil {
		t.Fatal(err)
	}

	// The node reaches each backend over its veth.
	hc := lb.Node.HTTPClient(3 * time.Second)
	for i, be := range lb.Backends {
		got, err := WhoAnswered(hc, "http://"+lb.BackendAddrs[i].String()+":8080/")
		if err != nil {
			t.Fatalf("GET backend %d from node: %v", i+1, err)
		}
		if got != be.Name {
			t.Errorf("backend %d answered as %q, want %q", i+1, got, be.Name)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := lb.Node.DialContext(ctx, "tcp4", lb.BackendAddrs[0].String()+":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	r := bufio.NewReader(c)
	for _, msg := range []string{"one", "two"} {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := "tcp-a " + msg + "\n"; line != want {
			t.Errorf("tcp echo = %q, want %q", line, want)
		}
	}

	u, err := lb.Node.DialContext(ctx, "udp4", lb.BackendAddrs[1].String()+":5353")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := u.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	k, err := u.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:k]); got != "udp-b ping" {
		t.Errorf("udp echo = %q, want %q", got, "udp-b ping")
	}

	// The client reaches backends only through a service: it has no route
	// to the backend subnets, and none to the host.
	if _, err := lb.Client.DialContext(ctx, "tcp4", lb.BackendAddrs[0].String()+":9000"); err == nil {
		t.Errorf("client reached a backend directly; it should have no route there")
	}

	// Commands run through nsenter see the namespace's devices.
	out, err := lb.Node.Command(ctx, "cat", "/proc/self/net/dev").Output()
	if err != nil {
		t.Fatalf("nsenter: %v", err)
	}
	for _, dev := range append([]string{lb.NodeDev}, lb.NodeBackendDevs...) {
		if !strings.Contains(string(out), dev+":") {
			t.Errorf("node's /proc/net/dev lacks %s:\n%s", dev, out)
		}
	}

	c.Close()
	u.Close()
	if err := topo.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, n)); !os.IsNotExist(err) {
			t.Errorf("namespace %s still present after Close (stat: %v)", n, err)
		}
	}
}

func TestDoRestoresThreadNamespace(t *testing.T) {
	testutil.Privileged(t)
	topo := NewT(t)
	ns, err := topo.AddNS("solo")
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := ns.Do(func() error {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Fatalf("Do ran in the caller's namespace %s", inside)
	}
	// No thread of the process is left in the test namespace.
	for _, now := range threadNamespaces(20) {
		if now == inside {
			t.Fatal("a thread was left in the test namespace")
		}
	}
}

// threadNamespaces returns the network namespaces n goroutines find their
// threads in: goroutines land on arbitrary threads of the process.
func threadNamespaces(n int) []string {
	done := make(chan string)
	for range n {
		go func() {
			now, _ := os.Readlink("/proc/thread-self/ns/net")
			done <- now
		}()
	}
	var out []string
	for range n {
		out = append(out, <-done)
	}
	return out
}

func TestCgroupPutsChildAndCleansUp(t *testing.T) {
	testutil.Privileged(t)
	mount, err := datapath.CgroupV2Mount()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = topo.Close() })
	cg, err := topo.AddCgroup(mount, "cg")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "cat /proc/self/cgroup; sleep 60")
	cg.Put(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var line string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "0::") {
			line = sc.Text()
			break
		}
	}
	if want := "/" + filepath.Base(cg.Path); !strings.HasSuffix(line, want) {
		t.Errorf("child's cgroup v2 line %q does not end in %s", line, want)
	}
	// Close kills what is left in the cgroup (the sleep) and removes it.
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(cg.Path); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still present (stat: %v)", cg.Path, err)
	}
}

func TestProcessRunsInNamespaceAndStops(t *testing.T) {
	testutil.Privileged(t)
	topo := NewT(t)
	ns, err := topo.AddNS("proc")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.AddAddr("lo", netip.MustParsePrefix("192.0.2.7/32")); err != nil {
		t.Fatal(err)
	}
	var out testutil.Buffer
	// The trap is set before anything is printed, so once the address shows
	// up, SIGTERM reaches the trap and not the default action.
	p, err := ns.Start(&out, nil, "sh", "-c", `trap "exit 3" TERM; cat /proc/net/fib_trie; while :; do sleep 0.05; done`)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the child to see the namespace's address", 5*time.Second, func() error {
		if !strings.Contains(out.String(), "192.0.2.7") {
			return fmt.Errorf("output:\n%s", out.String())
		}
		return nil
	})
	err = p.Stop(5 * time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("Stop = %v, want exit status 3 from the TERM trap", err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Exited not closed after Stop")
	}
}

func TestSweepStaleRemovesOnlyDeadRuns(t *testing.T) {
	dir := t.TempDir()
	// A pid that cannot be running: above the kernel's PID_MAX_LIMIT (2^22).
	dead := filepath.Join(dir, "sl-4194305-1-e2e")
	mine := filepath.Join(dir, fmt.Sprintf("sl-%d-1-e2e", os.Getpid()))
	other := filepath.Join(dir, "unrelated")
	for _, d := range []string{dead, mine, other} {
		if err := os.MkdirAll(filepath.Join(d, "sluice"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := SweepStale(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("stale %s not removed (stat: %v)", dead, err)
	}
	for _, d := range []string{mine, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
}

func TestEnterRunAndFd(t *testing.T) {
	testutil.Privileged(t)
	a, b := NewNS(t, "enter-a"), NewNS(t, "enter-b")
	if err := a.Run(t.Context(), "ip", "link", "add", "mv0", "type", "veth", "peer", "name", "mv1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Run(t.Context(), "ip", "link", "show", "nosuchdev"); err == nil || !strings.Contains(err.Error(), "nosuchdev") {
		t.Errorf("Run of a failing command = %v, want an error with its output", err)
	}
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("entered", func(t *testing.T) {
		a.Enter(t)
		inside, _ := os.Readlink("/proc/thread-self/ns/net")
		if inside == before {
			t.Fatal("Enter left the thread in the caller's namespace")
		}
		mv, err := netlink.LinkByName("mv0")
		if err != nil {
			t.Fatalf("the namespace's device is not visible after Enter: %v", err)
		}
		if err := netlink.LinkSetNsFd(mv, b.Fd()); err != nil {
			t.Fatal(err)
		}
	})
	// The subtest's cleanup moved its thread back; the device moved to b.
	if err := b.Run(t.Context(), "ip", "link", "show", "mv0"); err != nil {
		t.Errorf("device not moved into the namespace of Fd: %v", err)
	}
	for _, now := range threadNamespaces(20) {
		if now != before {
			t.Fatalf("a thread was left in namespace %s after Enter's test ended", now)
		}
	}
}

func TestCgroupJoin(t *testing.T) {
	testutil.Privileged(t)
	mount, err := datapath.CgroupV2Mount()
	if err != nil {
		t.Fatal(err)
	}
	orig, err := ownCgroup()
	if err != nil {
		t.Fatal(err)
	}
	cg, err := NewT(t).AddCgroup(mount, "join")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("joined", func(t *testing.T) {
		cg.Join(t)
		if now, _ := ownCgroup(); now != "/"+filepath.Base(cg.Path) {
			t.Errorf("process in cgroup %s after Join, want %s", now, cg.Path)
		}
	})
	if now, _ := ownCgroup(); now != orig {
		t.Errorf("process in cgroup %s after Join's test ended, want back in %s", now, orig)
	}
}

// TestPidsIn: the sweep of a stale namespace finds what still runs in it.
func TestPidsIn(t *testing.T) {
	testutil.Privileged(t)
	ns := NewNS(t, "pids")
	cmd := ns.Command(t.Context(), "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("kill sleep: %v", err)
		}
		_ = cmd.Wait() // killed: the error says so
	})
	// nsenter execs sleep after it has joined the namespace.
	testutil.Eventually(t, "sleep to run in the namespace", 5*time.Second, func() error {
		if pids := pidsIn(ns.Path); len(pids) != 1 || pids[0] != cmd.Process.Pid {
			return fmt.Errorf("pidsIn = %v, want [%d]", pids, cmd.Process.Pid)
		}
		return nil
	})
}
