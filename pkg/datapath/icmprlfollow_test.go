package datapath

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// writeICMPSysctls writes the ICMP rate limit sysctls of l under dir as
// the kernel shows them in /proc/sys/net.
func writeICMPSysctls(t *testing.T, dir string, l ICMPRateLimits, mask6 string) {
	t.Helper()
	for name, v := range map[string]string{
		"ipv4/icmp_ratelimit":    itoa(l.PerDestination.Milliseconds()),
		"ipv6/icmp/ratelimit":    itoa(l.PerDestination6.Milliseconds()),
		"ipv4/icmp_ratemask":     itoa(int64(int32(l.Mask))),
		"ipv4/icmp_msgs_per_sec": itoa(int64(l.MsgsPerSec)),
		"ipv4/icmp_msgs_burst":   itoa(int64(l.MsgsBurst)),
		"ipv6/icmp/ratemask":     mask6,
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestICMPRateLimitFollowsSysctls: the agent re-reads the ICMP rate
// limit sysctls (here from a directory standing for /proc/sys/net) and the
// loaded programs follow what it reads at their next error, without a
// reload, as the kernel follows `sysctl -w` at once; the map is written
// only when the values changed. A: 10 s an error, a source gets 6 of 7
// answered. B: port unreachable out of the ratemask, the same source,
// over its limit, gets every packet answered. C: the mask back, no
// per-destination limit (ratelimit 0): still every one. D, through
// FollowICMPRateLimits's loop: the map takes the new values. Per family.
func TestICMPRateLimitFollowsSysctls(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		h := newRejectHarness(t, v6, slowRefill)
		dir := t.TempDir()
		a := DefaultICMPRateLimits()
		a.PerDestination, a.PerDestination6 = 10*time.Second, 10*time.Second
		if got := h.answered(t, "10.0.0.1", 7); got != 6 {
			t.Fatalf("A: 7 packets from one source: %d answered, want 6", got)
		}

		writeICMPSysctls(t, dir, a, "0-1,3-127")
		if l, changed, err := h.d.refreshICMPRateLimits(dir); err != nil || changed || l != a {
			t.Fatalf("A read again: %+v, changed %v, %v; want %+v unchanged", l, changed, err, a)
		}

		b := a
		b.Mask &^= 1 << 3  // destination unreachable
		b.Mask6 &^= 1 << 1 // ICMPv6 destination unreachable
		writeICMPSysctls(t, dir, b, "0,3-127")
		if l, changed, err := h.d.refreshICMPRateLimits(dir); err != nil || !changed || l != b {
			t.Fatalf("B: %+v, changed %v, %v; want %+v changed", l, changed, err, b)
		}
		limited := counters(t, h.d)["tc_icmp_ratelimited"]
		if got := h.answered(t, "10.0.0.1", 5); got != 5 {
			t.Errorf("B, unreachable not limited: 5 packets from the source over its limit: %d answered, want 5", got)
		}

		c := a
		c.PerDestination, c.PerDestination6 = 0, 0
		writeICMPSysctls(t, dir, c, "0-1,3-127")
		if _, changed, err := h.d.refreshICMPRateLimits(dir); err != nil || !changed {
			t.Fatalf("C: changed %v, %v; want changed", changed, err)
		}
		if got := h.answered(t, "10.0.0.1", 10); got != 10 {
			t.Errorf("C, no per-destination limit: 10 packets from the source: %d answered, want 10", got)
		}
		if got := counters(t, h.d)["tc_icmp_ratelimited"]; got != limited {
			t.Errorf("tc_icmp_ratelimited %d after B and C, want %d as before", got, limited)
		}

		// The agent's loop, with a short period.
		d := c
		d.MsgsPerSec, d.MsgsBurst = 7, 3
		writeICMPSysctls(t, dir, d, "0-1,3-127")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.d.FollowICMPRateLimits(ctx, dir, time.Millisecond, slog.New(slog.DiscardHandler))
		}()
		defer func() { cancel(); <-done }()
		want := d.conf()
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			var got tcIcmpRlConf
			if err := h.d.tc.SluiceIcmpLimitsV1.Lookup(uint32(0), &got); err != nil {
				t.Fatal(err)
			}
			if got == want {
				break
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("D: the map holds %+v, want %+v", got, want)
			}
		}
	})
}

// TestICMPLimitsOntoOlderPins: pins without sluice_icmp_limits_v1 (an
// agent of the previous release, whose programs had the limits as
// constants) get it: Open creates and pins it, and writes the limits of
// its configuration, which the programs follow. Opened again over it,
// the map keeps its pin and takes the new configuration's values.
func TestICMPLimitsOntoOlderPins(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	pin := filepath.Join(bpffs, "sluice", mapICMPLimits)
	d := openTest(t, smallConfig(bpffs))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pin); err != nil {
		t.Fatalf("remove %s, as older pins lack it: %v", pin, err)
	}
	for i, rl := range []ICMPRateLimits{{PerDestination: 10 * time.Second, PerDestination6: time.Second, Mask: 0x1818, Mask6: 2, MsgsPerSec: 10, MsgsBurst: 20}, DefaultICMPRateLimits()} {
		cfg := smallConfig(bpffs)
		cfg.ICMPRateLimits = &rl
		d := openTest(t, cfg)
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			t.Fatalf("open %d: %s not pinned: %v", i, mapICMPLimits, err)
		}
		var got tcIcmpRlConf
		err = m.Lookup(uint32(0), &got)
		m.Close()
		if err != nil || got != rl.conf() {
			t.Errorf("open %d: %s holds %+v (%v), want %+v", i, mapICMPLimits, got, err, rl.conf())
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
