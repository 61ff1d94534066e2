package datapath

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Kernel support (C1). This host runs a recent kernel, so an older one is
// played by forcing the probes' answers: what Open loads and what CheckNode
// asks for must follow from the configuration and those answers alone.

// forceSetRetval makes the bpf_set_retval probe answer as a kernel before
// 6.1 (false) or after, until the test ends.
func forceSetRetval(t *testing.T, have bool) {
	t.Helper()
	override(t, &haveSetRetval, func() error {
		if have {
			return nil
		}
		return fmt.Errorf("forced: %w", ebpf.ErrNotSupported)
	})
}

// needNames returns what CheckNode would probe for p, one per line.
func needNames(t *testing.T, p Prerequisites) string {
	t.Helper()
	needs, err := kernelNeeds(p)
	if err != nil {
		t.Fatal(err)
	}
	var whats []string
	for _, n := range needs {
		whats = append(whats, n.what)
	}
	return strings.Join(whats, "\n")
}

// TestCheckNodeAsksOnlyForWhatIsLoaded: with --socket-lb=false --xdp=off
// the node is checked for the per-packet programs and the conntrack GC
// only: no cgroup sock_addr hooks, no XDP, no bpf_set_retval (before,
// every object was checked and loaded in every mode, so a 5.x kernel was
// refused even for the per-packet path alone). With socket load balancing
// on a kernel without bpf_set_retval in sock_addr programs (before 6.1),
// the helper is not asked for either: the _eperm variants are loaded.
func TestCheckNodeAsksOnlyForWhatIsLoaded(t *testing.T) {
	testutil.Privileged(t)
	forceSetRetval(t, true)
	minimal := needNames(t, Prerequisites{XDP: XDPOff})
	for _, absent := range []string{"CGroupSockAddr", "program type XDP", "FnSetRetval"} {
		if strings.Contains(minimal, absent) {
			t.Errorf("with --socket-lb=false --xdp=off the node is asked for %s:\n%s", absent, minimal)
		}
	}
	for _, present := range []string{"program type SchedCLS", "program type Syscall", "helper FnForEachMapElem in Syscall programs"} {
		if !strings.Contains(minimal, present) {
			t.Errorf("the per-packet path's needs lack %q:\n%s", present, minimal)
		}
	}

	all := needNames(t, Prerequisites{Cgroup: "/sys/fs/cgroup", XDP: XDPNative})
	for _, present := range []string{"program type CGroupSockAddr", "program type XDP", "helper FnSetRetval in CGroupSockAddr programs"} {
		if !strings.Contains(all, present) {
			t.Errorf("with socket LB and XDP the needs lack %q:\n%s", present, all)
		}
	}

	forceSetRetval(t, false)
	old := needNames(t, Prerequisites{Cgroup: "/sys/fs/cgroup", XDP: XDPOff})
	if strings.Contains(old, "FnSetRetval") {
		t.Errorf("without bpf_set_retval in sock_addr programs, it is still asked for:\n%s", old)
	}
	if !strings.Contains(old, "attach type CgroupInet4GetPeername of CGroupSockAddr programs") {
		t.Errorf("socket LB's needs lack getpeername4:\n%s", old)
	}
}

// TestOpenLoadsOnlyWhatIsConfigured: the socket programs only with socket
// load balancing, the XDP program only in an XDP mode; tc and the GC
// always.
func TestOpenLoadsOnlyWhatIsConfigured(t *testing.T) {
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	cfg.DisableSocketLB = true
	d := openTest(t, cfg)
	if d.TCIngress() == nil || d.TCEgress() == nil || d.gc.SluiceCtGc == nil {
		t.Fatal("tc programs or the conntrack GC not loaded")
	}
	if d.sock.Connect4 != nil || d.XDP() != nil || d.maps.sockTerm != nil {
		t.Errorf("loaded with --socket-lb=false --xdp=off: socket %v, XDP %v, socket destroy %v",
			d.sock.Connect4, d.XDP(), d.maps.sockTerm)
	}
	if err := d.AttachCgroup(newTestCgroup(t).Path); err == nil || !strings.Contains(err.Error(), "socket load balancing is off") {
		t.Errorf("AttachCgroup with socket LB off: %v", err)
	}
	d.Close()

	d = openTest(t, xdpConfig(cfg.BPFFS))
	if d.sock.Connect4 == nil || d.XDP() == nil {
		t.Errorf("socket programs %v, XDP %v: want both loaded", d.sock.Connect4, d.XDP())
	}
}

// TestSockLBWithoutSetRetval: on a kernel whose sock_addr programs cannot
// call bpf_set_retval (before 6.1), the variants without it are loaded: a
// connect or sendto to a Service without endpoints is refused with the
// kernel's EPERM (instead of ECONNREFUSED), and translation works as
// ever, over IPv4, IPv6 and IPv4-mapped addresses (sockLBFamilies).
// Forced here; the probe says the same on such a kernel.
func TestSockLBWithoutSetRetval(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range []struct {
		setRetval bool
		want      unix.Errno
	}{{true, unix.ECONNREFUSED}, {false, unix.EPERM}} {
		t.Run(fmt.Sprintf("set_retval=%v", tc.setRetval), func(t *testing.T) {
			forceSetRetval(t, tc.setRetval)
			d := openTest(t, smallConfig(testPinDir(t)))
			if d.Features().SetRetval != tc.setRetval {
				t.Errorf("Features().SetRetval = %v", d.Features().SetRetval)
			}
			// The loaded connect4 (connect6) is the variant whose code
			// calls the helper, or its twin whose code does not.
			spec := specOf(t, loadSock)
			for _, p := range []struct {
				hook string
				prog *ebpf.Program
			}{{"connect4", d.sock.Connect4}, {"connect6", d.sock.Connect6}} {
				info := progInfo(t, p.prog)
				variant := "sluice_" + p.hook
				if !tc.setRetval {
					variant = "sluice_eperm_" + p.hook
				}
				// (The kernel keeps 15 characters of a name; cilium/ebpf
				// reads the rest from the BTF where it can.)
				if info.Name != variant && info.Name != variant[:15] {
					t.Errorf("loaded %s is %s, want %s", p.hook, info.Name, variant)
				}
				calls := false
				for _, in := range spec.Programs[variant].Instructions {
					calls = calls || (in.IsBuiltinCall() && asm.BuiltinFunc(in.Constant) == asm.FnSetRetval)
				}
				if calls != tc.setRetval {
					t.Errorf("%s calls bpf_set_retval: %v", variant, calls)
				}
			}

			ns, _ := sockNode(t, d, "retval", sockBackends...)
			addLoopbackAddrs(t, ns, sockBackends6...)
			startBackends(t, sockBackends6...)
			m := d.Maps()
			// IPv4 sockets, native IPv6 ones over the IPv6 maps, and
			// dual-stack ones reaching the IPv4 services (connect6,
			// sendmsg6 each).
			for _, f := range sockLBFamilies {
				id := reconciler.ServiceID(f.id)
				if f.name != "ipv4_mapped" {
					addService(t, m, id+1, f.tcp, testBackend{reconciler.BackendID(f.id + 1), l4(f.backends[0], 8080, model.TCP)})
					addService(t, m, id+3, f.empty)
					addService(t, m, id+4, f.emptyU)
				}
				fd := newSocketIn(t, f.domain, unix.SOCK_STREAM)
				if err := unix.Connect(fd, sockaddrIn(f.domain, f.tcp)); err != nil {
					t.Fatalf("%s: connect %s: %v", f.name, f.tcp, err)
				}
				fd = newSocketIn(t, f.domain, unix.SOCK_STREAM)
				if err := unix.Connect(fd, sockaddrIn(f.domain, f.empty)); !errors.Is(err, tc.want) {
					t.Errorf("%s: TCP connect to %s without endpoints: %v, want %v", f.name, f.empty, err, tc.want)
				}
				ufd := newSocketIn(t, f.domain, unix.SOCK_DGRAM)
				if err := unix.Sendto(ufd, []byte("hi"), 0, sockaddrIn(f.domain, f.emptyU)); !errors.Is(err, tc.want) {
					t.Errorf("%s: UDP sendto %s without endpoints: %v, want %v", f.name, f.emptyU, err, tc.want)
				}
			}
		})
	}
}
