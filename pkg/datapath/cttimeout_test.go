package datapath

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// TestConntrackTimeoutsReachTheProgram: the conntrack timeouts of Config
// (the agent's --conntrack-*-timeout flags) are the constants of the
// program the kernel runs, read back from its .rodata map.
// (TestTCConntrackTimeout watches a flow expire at a short UDP timeout.)
func TestConntrackTimeoutsReachTheProgram(t *testing.T) {
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	cfg.CTTimeoutTCP = 90 * time.Minute
	cfg.CTTimeoutSYN = 7 * time.Second
	cfg.CTTimeoutUDP = 45 * time.Second
	cfg.CTTimeoutClose = 3 * time.Second
	d := openTest(t, cfg)

	// The IPv6 path is a program of its own (tc6.go), which the IPv4
	// entry tail-calls: it must see the same timeouts.
	for _, prog := range []struct {
		name string
		p    *ebpf.Program
	}{{"tc ingress", d.TCIngress()}, {"tc ingress (IPv6)", d.tc.Sluice6Ingress}} {
		rodata := loadedRodata(t, prog.p)
		for name, want := range map[string]time.Duration{"ct_timeout_tcp_ns": cfg.CTTimeoutTCP, "ct_timeout_syn_ns": cfg.CTTimeoutSYN,
			"ct_timeout_udp_ns": cfg.CTTimeoutUDP, "ct_timeout_close_ns": cfg.CTTimeoutClose} {
			off := rodataOffset(t, name)
			got := time.Duration(binary.LittleEndian.Uint64(rodata[off : off+8]))
			if got != want {
				t.Errorf("%s of the loaded program %s = %s, want %s", name, prog.name, got, want)
			}
		}
	}
}

// loadedRodata returns the contents of the .rodata map of a loaded program,
// as the kernel holds it.
func loadedRodata(t *testing.T, prog *ebpf.Program) []byte {
	t.Helper()
	info := progInfo(t, prog)
	ids, ok := info.MapIDs()
	if !ok {
		t.Skip("kernel does not report a program's maps")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		mi, err := m.Info()
		if err == nil && strings.HasSuffix(mi.Name, ".rodata") {
			buf := make([]byte, m.ValueSize())
			err = m.Lookup(uint32(0), &buf)
			_ = m.Close() // a read-only handle: closing cannot lose anything
			if err != nil {
				t.Fatal(err)
			}
			return buf
		}
		_ = m.Close() // a read-only handle: closing cannot lose anything
	}
	t.Fatal("no .rodata map in the loaded program")
	return nil
}

// rodataOffset returns where variable name lives in .rodata.
func rodataOffset(t *testing.T, name string) int {
	t.Helper()
	spec := specOf(t, loadTc)
	v := spec.Variables[name]
	if v == nil || v.SectionName != ".rodata" || v.Size() != 8 {
		t.Fatalf("%s: not a 64-bit constant in .rodata (%v)", name, v)
	}
	return int(v.Offset)
}
