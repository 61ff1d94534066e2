package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// The sysctls under DefaultProcSysNet.
var (
	sysctlReservedPorts = filepath.Join(DefaultProcSysNet, reservedPortsName)
	sysctlPortRange     = filepath.Join(DefaultProcSysNet, portRangeName)
)

// TestReserveSNATPortsProcSysNet: the reservation is read and written
// under the directory given (--proc-sys-net; the DaemonSet's
// /host/proc/sys/net, the node's mounted writable), not /proc/sys/net;
// a refusal and a failed write name the files there. In a namespace of
// its own, whose /proc/sys/net must stay as it was.
func TestReserveSNATPortsProcSysNet(t *testing.T) {
	testutil.Privileged(t)
	topology.NewNS(t, "psnet").Enter(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "ipv4"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(reservedPortsName, "8080")
	write(portRangeName, "32768\t60999")
	host, hostErr := os.ReadFile(sysctlReservedPorts)
	res, err := ReserveSNATPortRangeIn(dir, 61000, 65535)
	if err != nil || !res.Added {
		t.Fatalf("ReserveSNATPortRangeIn = %+v, %v", res, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, reservedPortsName))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "8080,61000-65535" {
		t.Errorf("%s = %q, want 8080,61000-65535", reservedPortsName, got)
	}
	if hostErr != nil {
		t.Fatal(hostErr)
	}
	if now, err := os.ReadFile(sysctlReservedPorts); err != nil || string(now) != string(host) {
		t.Errorf("%s changed: %q, was %q (%v)", sysctlReservedPorts, now, host, err)
	}
	// A range that would leave too few ephemeral ports: refused, naming
	// the file under the directory.
	_, err = ReserveSNATPortRangeIn(dir, 32768, 60000)
	if !errors.Is(err, ErrReservationRefused) || !strings.Contains(err.Error(), filepath.Join(dir, reservedPortsName)) {
		t.Errorf("refused reservation: %v, want ErrReservationRefused naming %s", err, filepath.Join(dir, reservedPortsName))
	}
}

// TestReserveSNATPorts (B9): the SNAT range is added to
// ip_local_reserved_ports of the namespace, after what is there (never
// removing an entry), once; the host's namespace is not touched.
func TestReserveSNATPorts(t *testing.T) {
	testutil.Privileged(t)
	// The namespace this thread is in before it enters the test's.
	hostNS, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer hostNS.Close()
	readHost := func() string {
		var s string
		if err := inNetns(fmt.Sprintf("/proc/self/fd/%d", hostNS.Fd()), func() error {
			b, err := os.ReadFile(sysctlReservedPorts)
			s = string(b)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	host := readHost()
	ns := topology.NewNS(t, "ports")
	ns.Enter(t)
	if err := os.WriteFile(sysctlReservedPorts, []byte("8080,9000-9100"), 0); err != nil {
		t.Fatal(err)
	}
	// A widened ephemeral range, as on many tuned nodes.
	if err := os.WriteFile(sysctlPortRange, []byte("1024 65535"), 0); err != nil {
		t.Fatal(err)
	}
	res, err := ReserveSNATPortRange(61000, 65535)
	if err != nil || !res.Added || res.Exposed != "" {
		t.Fatalf("ReserveSNATPorts = %+v, %v", res, err)
	}
	b, err := os.ReadFile(sysctlReservedPorts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "8080,9000-9100,61000-65535" {
		t.Errorf("ip_local_reserved_ports = %q, want the others' entries and the SNAT range", got)
	}
	// The reservation holds for both families (the kernel's IPv6 sockets
	// read net.ipv4's list, and the IPv6 datapath's SNAT ports are the
	// same range): with 20 ephemeral ports, 10 of them SNAT ports, the
	// kernel hands a socket of either family only the other 10.
	if err := os.WriteFile(sysctlPortRange, []byte("60990 61009"), 0); err != nil {
		t.Fatal(err)
	}
	forFamilies(t, func(t *testing.T, v6 bool) {
		network, wildcard := "udp4", "0.0.0.0:0"
		if v6 {
			network, wildcard = "udp6", "[::]:0"
		}
		var ports []int
		err := ns.Do(func() error {
			for range 20 {
				c, err := net.ListenPacket(network, wildcard)
				if errors.Is(err, unix.EADDRINUSE) {
					return nil // no ephemeral port left
				}
				if err != nil {
					return err
				}
				defer c.Close()
				ports = append(ports, c.LocalAddr().(*net.UDPAddr).Port)
			}
			return nil
		})
		slices.Sort(ports)
		if err != nil || len(ports) != 10 || ports[0] != 60990 || ports[9] != 60999 {
			t.Errorf("%s sockets were given ports %v (%v), want 60990-60999: none of the SNAT range", network, ports, err)
		}
	})
	if res, err := ReserveSNATPortRange(61000, 65535); err != nil || res.Added {
		t.Errorf("again: %+v, %v; want nothing to do", res, err)
	}
	// A range inside what is reserved already is not written again.
	if res, err := ReserveSNATPortRange(9010, 9020); err != nil || res.Added {
		t.Errorf("a reserved subrange: %+v, %v; want nothing to do", res, err)
	}
	if _, err := ReserveSNATPortRange(0, 0); err == nil {
		t.Error("an empty range was reserved")
	}
	// Through a datapath: its configured range, the default one here.
	d := openTest(t, smallConfig(testPinDir(t)))
	if res, err := d.ReserveSNATPorts(); err != nil || res.Added {
		t.Errorf("the default range, reserved already: %+v, %v", res, err)
	}
	if got := readHost(); got != host {
		t.Errorf("the host's ip_local_reserved_ports changed from %q to %q", host, got)
	}
}

// The ports the node may still hand out when the reservation cannot be
// written are named, ranges first.
func TestExposedPorts(t *testing.T) {
	rs, err := parsePortList("61000-62000, 62002\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lo, hi int
		want   string
	}{
		{61000, 62000, ""},
		{61000, 65535, "62001,62003-65535"},
		{60990, 61000, "60990-60999"},
	} {
		if got := exposed(rs, c.lo, c.hi); got != c.want {
			t.Errorf("exposed(%d-%d) = %q, want %q", c.lo, c.hi, got, c.want)
		}
	}
	if _, err := parsePortList("80,x"); err == nil {
		t.Error("a bad list parsed")
	}
}
