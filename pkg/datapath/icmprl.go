package datapath

// The rate limits of the ICMP (ICMPv6) errors tc sends in place of the
// kernel's (a port unreachable for a ClusterIP's unserved port or a
// Service without endpoints; a time exceeded where tc forwards): the
// kernel's own (bpf/lib/icmp.h, icmp_rl_allow), with the values of its
// sysctls, in sluice_icmp_limits_v1. The agent reads them from the
// node's /proc/sys/net (--proc-sys-net) when it starts
// (ReadICMPRateLimits, Config.ICMPRateLimits), and Open writes them
// before a program is attached;
// then it reads them again every 10 s (FollowICMPRateLimits: sysctls
// send no notification of a change) and writes the map when they
// changed: a change takes effect within that time, without a reload.
// Without them (Config.ICMPRateLimits nil) the programs follow Linux
// 6.18's defaults (DefaultICMPRateLimits).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ICMPRateLimits are the kernel's ICMP rate limits (Documentation/
// networking/ip-sysctl.rst), which tc's errors follow.
type ICMPRateLimits struct {
	// PerDestination is net.ipv4.icmp_ratelimit (PerDestination6
	// net.ipv6.icmp.ratelimit): the time an error to a destination
	// costs, of which it has up to six errors' worth; 0 means no
	// per-destination limit.
	PerDestination, PerDestination6 time.Duration
	// Mask is net.ipv4.icmp_ratemask: bit t set, ICMP type t is limited
	// (fragmentation needed never is). Mask6 is the bits of ICMPv6 types
	// 0-31 in net.ipv6.icmp.ratemask (tc sends types 1-3).
	Mask, Mask6 uint32
	// MsgsPerSec and MsgsBurst are net.ipv4.icmp_msgs_per_sec and
	// net.ipv4.icmp_msgs_burst: the node's bucket, both families'.
	MsgsPerSec, MsgsBurst uint32
}

// DefaultICMPRateLimits are Linux 6.18's defaults.
func DefaultICMPRateLimits() ICMPRateLimits {
	return ICMPRateLimits{
		PerDestination: time.Second, PerDestination6: 100 * time.Millisecond,
		Mask: 0x1818, Mask6: 0xfffffffb, // 0-1,3-127: all errors but packet too big
		MsgsPerSec: 1000, MsgsBurst: 50,
	}
}

// ReadICMPRateLimits reads the kernel's ICMP rate limits from procSysNet
// (--proc-sys-net: the node's /proc/sys/net). A sysctl that does not
// exist (IPv6 disabled, an older kernel) keeps its default; one that does
// not parse is an error.
func ReadICMPRateLimits(procSysNet string) (ICMPRateLimits, error) {
	l := DefaultICMPRateLimits()
	read := func(name string) (string, bool, error) {
		b, err := os.ReadFile(filepath.Join(procSysNet, filepath.FromSlash(name)))
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		return strings.TrimSpace(string(b)), true, nil
	}
	// num reads an integer sysctl into set. The two durations (ms) are
	// read unsigned, and so are icmp_msgs_per_sec and icmp_msgs_burst,
	// ints their handler keeps from 0 up (proc_dointvec_minmax);
	// icmp_ratemask is an int used as a mask (proc_dointvec), which
	// takes -1 (every type) or any negative value: its bits are the mask
	// (signed).
	num := func(name string, signed bool, set func(int64)) error {
		s, ok, err := read(name)
		if err != nil || !ok {
			return err
		}
		var n int64
		if signed {
			n, err = strconv.ParseInt(s, 10, 32)
		} else {
			var u uint64
			u, err = strconv.ParseUint(s, 10, 31)
			n = int64(u)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		set(n)
		return nil
	}
	ms := func(d *time.Duration) func(int64) { return func(n int64) { *d = time.Duration(n) * time.Millisecond } }
	u32 := func(v *uint32) func(int64) { return func(n int64) { *v = uint32(n) } }
	if err := errors.Join(
		num("ipv4/icmp_ratelimit", false, ms(&l.PerDestination)),
		num("ipv6/icmp/ratelimit", false, ms(&l.PerDestination6)),
		num("ipv4/icmp_ratemask", true, u32(&l.Mask)),
		num("ipv4/icmp_msgs_per_sec", false, u32(&l.MsgsPerSec)),
		num("ipv4/icmp_msgs_burst", false, u32(&l.MsgsBurst)),
	); err != nil {
		return l, err
	}
	s, ok, err := read("ipv6/icmp/ratemask")
	if err != nil {
		return l, err
	}
	if ok {
		if l.Mask6, err = parseICMP6Ratemask(s); err != nil {
			return l, fmt.Errorf("ipv6/icmp/ratemask: %w", err)
		}
	}
	return l, nil
}

// parseICMP6Ratemask returns the bits of ICMPv6 types 0-31 in s, the
// kernel's list of ranges of types (proc_do_large_bitmap: "0-1,3-127";
// empty: none).
func parseICMP6Ratemask(s string) (uint32, error) {
	var mask uint32
	if s == "" {
		return 0, nil
	}
	for r := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.ParseUint(lo, 10, 8)
		if err != nil {
			return 0, fmt.Errorf("range %q: %w", r, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 8); err != nil || b < a {
				return 0, fmt.Errorf("range %q: not a range of types", r)
			}
		}
		for t := a; t <= b && t < 32; t++ {
			mask |= 1 << t
		}
	}
	return mask, nil
}

// conf is l as sluice_icmp_limits_v1 holds it (struct icmp_rl_conf).
func (l ICMPRateLimits) conf() tcIcmpRlConf {
	return tcIcmpRlConf{
		RatelimitNs:  uint64(l.PerDestination.Nanoseconds()),
		Ratelimit6Ns: uint64(l.PerDestination6.Nanoseconds()),
		Ratemask:     l.Mask,
		Ratemask6:    l.Mask6,
		MsgsPerSec:   l.MsgsPerSec,
		MsgsBurst:    l.MsgsBurst,
	}
}

// setICMPRateLimits writes l into sluice_icmp_limits_v1 unless it holds
// l already, and says whether it wrote.
func (d *Datapath) setICMPRateLimits(l ICMPRateLimits) (bool, error) {
	m := d.tc.SluiceIcmpLimitsV1
	want := l.conf()
	var cur tcIcmpRlConf
	if err := m.Lookup(uint32(0), &cur); err != nil {
		return false, fmt.Errorf("read %s: %w", mapICMPLimits, err)
	}
	if cur == want {
		return false, nil
	}
	if err := m.Put(uint32(0), &want); err != nil {
		return false, fmt.Errorf("write %s: %w", mapICMPLimits, err)
	}
	return true, nil
}

// refreshICMPRateLimits reads the sysctls under procSysNet again and writes
// them into sluice_icmp_limits_v1 if they changed; it returns what it
// read and whether it wrote. A sysctl that does not parse is an error,
// and nothing is written.
func (d *Datapath) refreshICMPRateLimits(procSysNet string) (ICMPRateLimits, bool, error) {
	l, err := ReadICMPRateLimits(procSysNet)
	if err != nil {
		return l, false, err
	}
	changed, err := d.setICMPRateLimits(l)
	return l, changed, err
}

// FollowICMPRateLimits reads the ICMP rate limit sysctls under procSysNet
// (/proc/sys/net: the agent's network namespace's) every period until ctx
// is done, and writes them into the programs' map when they changed
// (logged). A read or write that fails is logged once, until one
// succeeds again; the map keeps the values last written meanwhile.
func (d *Datapath) FollowICMPRateLimits(ctx context.Context, procSysNet string, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l, changed, err := d.refreshICMPRateLimits(procSysNet)
		switch {
		case err != nil && !failing:
			log.Warn("ICMP rate limit sysctls: tc's ICMP errors keep the limits last read", "err", err)
		case err == nil && changed:
			log.Info("ICMP rate limit sysctls changed: tc's ICMP errors follow them",
				"icmp_ratelimit", l.PerDestination, "ipv6_icmp_ratelimit", l.PerDestination6,
				"icmp_ratemask", fmt.Sprintf("%#x", l.Mask), "ipv6_icmp_ratemask", fmt.Sprintf("%#x", l.Mask6),
				"icmp_msgs_per_sec", l.MsgsPerSec, "icmp_msgs_burst", l.MsgsBurst)
		}
		failing = err != nil
	}
}
