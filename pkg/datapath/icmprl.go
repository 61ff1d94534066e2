package datapath

// The rate limits of the ICMP (ICMPv6) errors tc sends in place of the
// kernel's (a port unreachable for a ClusterIP's unserved port or a
// Service without endpoints; a time exceeded where tc forwards): the
// kernel's own (bpf/lib/icmp.h, icmp_rl_allow), with the values of its
// sysctls. The agent reads them from its network namespace when it starts
// (ReadICMPRateLimits) and sets them as the programs' constants; a value
// changed later takes effect at the agent's next start, as every other
// constant does. Without them (Config.ICMPRateLimits nil) the programs
// keep Linux 6.18's defaults (DefaultICMPRateLimits).

import (
	"errors"
	"fmt"
	"io/fs"
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

// DefaultICMPRateLimits are Linux 6.18's defaults, bpf/lib/config.h's.
func DefaultICMPRateLimits() ICMPRateLimits {
	return ICMPRateLimits{
		PerDestination: time.Second, PerDestination6: 100 * time.Millisecond,
		Mask: 0x1818, Mask6: 0xfffffffb, // 0-1,3-127: all errors but packet too big
		MsgsPerSec: 1000, MsgsBurst: 50,
	}
}

// ReadICMPRateLimits reads the kernel's ICMP rate limits from procSys
// (/proc/sys: the reader's network namespace's). A sysctl that does not
// exist (IPv6 disabled, an older kernel) keeps its default; one that does
// not parse is an error.
func ReadICMPRateLimits(procSys string) (ICMPRateLimits, error) {
	l := DefaultICMPRateLimits()
	read := func(name string) (string, bool, error) {
		b, err := os.ReadFile(filepath.Join(procSys, filepath.FromSlash(name)))
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
		num("net/ipv4/icmp_ratelimit", false, ms(&l.PerDestination)),
		num("net/ipv6/icmp/ratelimit", false, ms(&l.PerDestination6)),
		num("net/ipv4/icmp_ratemask", true, u32(&l.Mask)),
		num("net/ipv4/icmp_msgs_per_sec", false, u32(&l.MsgsPerSec)),
		num("net/ipv4/icmp_msgs_burst", false, u32(&l.MsgsBurst)),
	); err != nil {
		return l, err
	}
	s, ok, err := read("net/ipv6/icmp/ratemask")
	if err != nil {
		return l, err
	}
	if ok {
		if l.Mask6, err = parseICMP6Ratemask(s); err != nil {
			return l, fmt.Errorf("net/ipv6/icmp/ratemask: %w", err)
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

// vars are the programs' constants (bpf/lib/config.h) for l.
func (l ICMPRateLimits) vars() map[string]any {
	return map[string]any{
		"icmp_ratelimit_ns":  uint64(l.PerDestination.Nanoseconds()),
		"icmp6_ratelimit_ns": uint64(l.PerDestination6.Nanoseconds()),
		"icmp_ratemask":      l.Mask,
		"icmp6_ratemask":     l.Mask6,
		"icmp_msgs_per_sec":  l.MsgsPerSec,
		"icmp_msgs_burst":    l.MsgsBurst,
	}
}
