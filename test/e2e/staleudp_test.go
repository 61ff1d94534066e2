package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// TestStaleUDPAtAgentStart (audit 6, finding 6): the real agent taking a
// node over from kube-proxy. A node process's UDP socket connected to a
// ClusterIP while kube-proxy's DNAT (OUTPUT, to endpoint A) served it
// rides kube-proxy's conntrack entry: connect4 translates at connect
// only. kube-proxy and A go; the agent starts (--cgroup the process's,
// the Service's endpoint B) and, after its first sync, ends the socket
// (ECONNABORTED) and deletes the entry: connected again, the client
// reaches B. The counts are in /metrics and the log. Before, the socket
// went on sending to A.
func TestStaleUDPAtAgentStart(t *testing.T) {
	requirePrivileges(t)
	testutil.NeedCommands(t, "iptables")
	if !kernelAtLeast(t, 6, 5) {
		t.Skip("no bpf_sock_destroy (Linux 6.5+)")
	}
	const (
		vip = "10.96.7.53"
		a   = "10.200.7.2"
		b   = "10.200.7.3"
	)
	bins := agentproc.Shared(t)
	topo := topology.NewT(t)
	node := topo.AddNST(t, "udpstale")
	mount, err := datapath.CgroupV2Mount()
	if err != nil {
		t.Fatal(err)
	}
	cg, err := topo.AddCgroup(mount, "udpstale")
	if err != nil {
		t.Fatal(err)
	}
	cg.Join(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, addr := range []string{a, b} {
		must(node.AddAddr("lo", netip.MustParsePrefix(addr+"/32")))
	}
	// The node's route to the VIP (its default route, elsewhere).
	must(node.AddRouteDev(netip.MustParsePrefix(vip+"/32"), "lo"))
	// Each answers "<addr> got <datagram>": the client checks the address.
	serve := func(addr string) *topology.Server {
		srv, err := node.ServeUDPEcho(addr+":5353", addr+" got")
		must(err)
		return srv
	}
	srvA := serve(a)
	serve(b)
	dnat := func(op string) error {
		return node.Run(context.Background(), "iptables", "-t", "nat", op, "OUTPUT", "-d", vip, "-p", "udp", "--dport", "53",
			"-j", "DNAT", "--to-destination", a+":5353")
	}
	must(dnat("-A"))

	// The client, in the node's namespace and the agent's cgroup.
	var fd int
	must(node.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	}))
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(2 * time.Second))
	must(unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	must(unix.Connect(fd, &unix.SockaddrInet4{Addr: netip.MustParseAddr(vip).As4(), Port: 53}))
	exchange := func(fd int, msg string) (string, error) {
		if _, err := unix.Write(fd, []byte(msg)); err != nil {
			return "", err
		}
		buf := make([]byte, 1500)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return "", err
		}
		return strings.Fields(string(buf[:n]))[0], nil
	}
	if who, err := exchange(fd, "k0"); err != nil || who != a {
		t.Fatalf("through kube-proxy's DNAT the client reached %q (%v), want %s", who, err, a)
	}

	// kube-proxy goes, and A with it; the agent starts.
	must(dnat("-D"))
	srvA.Close()
	manifest := filepath.Join(t.TempDir(), "services.yaml")
	must(agentproc.WriteFile(manifest, agentproc.Manifest(agentproc.Service{
		Name: "dns", ClusterIP: vip, Endpoints: []string{b},
		Ports: []agentproc.Port{agentproc.UDP("dns", 53, 5353)},
	}.YAML())))
	ag := agentproc.StartAgent(t, bins, node, agentproc.AgentConfig{
		Manifests: manifest,
		Cgroup:    cg.Path,
		BPFFS:     filepath.Join(testutil.BPFFS, topo.Prefix()+"udpstale"),
	}, 30*time.Second)

	// Ready: the first sync, and the pass after it, are done.
	if _, err := unix.Read(fd, make([]byte, 100)); !errors.Is(err, unix.ECONNABORTED) {
		t.Errorf("receive on the socket connected to %s before the agent: %v, want ECONNABORTED", vip, err)
		who, err := exchange(fd, "k1")
		t.Errorf("its next datagram reached %q (%v): kube-proxy's entry sends it to %s, which no longer serves", who, err, a)
	}
	var again int
	must(node.Do(func() error {
		var err error
		again, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	}))
	t.Cleanup(func() { unix.Close(again) })
	must(unix.SetsockoptTimeval(again, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	must(unix.Connect(again, &unix.SockaddrInet4{Addr: netip.MustParseAddr(vip).As4(), Port: 53}))
	if who, err := exchange(again, "s1"); err != nil || who != b {
		t.Errorf("connected again, the client reached %q (%v), want %s", who, err, b)
	}
	m, err := ag.Metrics()
	must(err)
	for _, want := range []string{"sluice_stale_udp_conntrack_deleted_total 1\n",
		`sluice_socket_terminations_total{method="bpf",result="destroyed"} 1` + "\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics has no %q", strings.TrimSpace(want))
		}
	}
	if log := ag.Log.String(); !strings.Contains(log, "component=stale-udp") || !strings.Contains(log, "conntrack_deleted=1") || !strings.Contains(log, "sockets_ended=1") {
		t.Errorf("the agent logged no line of the stale UDP pass with its counts:\n%s", log)
	}
}

// kernelAtLeast says whether the running kernel is major.minor or newer.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var maj, min int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &maj, &min); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release[:], err)
	}
	return maj > major || maj == major && min >= minor
}
