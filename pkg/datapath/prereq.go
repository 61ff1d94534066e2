package datapath

// Node prerequisites, checked before Open touches anything. A node that
// lacks one would otherwise fail deep inside a load, with an EPERM or a
// verifier log, or worse, pin its maps on a file system that vanishes with
// the pod. CheckNode names every missing piece at once and says what to do
// about it.
//
// The kernel features are not a list kept by hand: they are read from the
// BPF objects this agent is about to load for its configuration (the
// program types and attach types of their programs, the map types of their
// maps, the helpers each program calls), and each is probed with a tiny
// program or map of its own. A part the configuration leaves out (socket
// load balancing, XDP) is not asked for, and where a kernel can be served
// by a variant (the socket programs without bpf_set_retval) the variant's
// needs are the ones checked, as Open would load it.

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Prerequisites says what the agent is about to use.
type Prerequisites struct {
	// BPFFS is where maps and links are pinned (Config.BPFFS; empty means
	// DefaultBPFFS). It need not exist yet, but the nearest existing
	// directory above it must be on a BPF file system.
	BPFFS string
	// Cgroup is the cgroup the socket programs attach to; empty when socket
	// load balancing is off (its programs are then neither loaded nor
	// checked). It must be a directory on cgroup v2.
	Cgroup string
	// XDP is the XDP mode (Config.XDP): the XDP program is checked only
	// when it is not off.
	XDP XDPMode
}

// PrerequisiteError lists what the node lacks, one problem per entry,
// each with its remedy.
type PrerequisiteError struct {
	Problems []string
}

func (e *PrerequisiteError) Error() string {
	return "node prerequisites not met:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// CheckNode returns nil if the node has what Open and the Attach methods
// need, or a *PrerequisiteError naming every missing prerequisite.
func CheckNode(p Prerequisites) error {
	var problems []string
	bpffs := p.BPFFS
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	if msg := checkFS(bpffs, unix.BPF_FS_MAGIC); msg != "" {
		problems = append(problems, fmt.Sprintf("pins: %s; mount bpffs (`mount -t bpf bpf %s`, systemd does it by default), "+
			"and in a pod mount the host's /sys/fs/bpf there (hostPath, mountPropagation: HostToContainer) so the pins outlive the pod",
			msg, DefaultBPFFS))
	}
	if p.Cgroup != "" {
		if msg := checkFS(p.Cgroup, unix.CGROUP2_SUPER_MAGIC); msg != "" {
			problems = append(problems, fmt.Sprintf("socket load balancing needs cgroup v2: %s; "+
				"mount the unified hierarchy (`mount -t cgroup2 none /sys/fs/cgroup`) and point --cgroup at it, or run with --socket-lb=false", msg))
		}
	}
	problems = append(problems, kernelProblems(p)...)
	if len(problems) > 0 {
		return &PrerequisiteError{Problems: problems}
	}
	return nil
}

// checkFS returns "" if path, or the nearest existing directory above it,
// is on the file system with the given statfs magic, or else what it found.
// bpffs pins may go in a directory Open will create, hence the walk up; a
// cgroup must exist, so a missing one is reported as such.
func checkFS(path string, magic int64) string {
	p := filepath.Clean(path)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type == magic {
				return ""
			}
			if p == filepath.Clean(path) {
				return fmt.Sprintf("%s is on %s, not %s", path, fsName(st.Type), fsName(magic))
			}
			return fmt.Sprintf("%s does not exist and %s above it is on %s, not %s", path, p, fsName(st.Type), fsName(magic))
		}
		if !errors.Is(err, unix.ENOENT) || magic == unix.CGROUP2_SUPER_MAGIC {
			return fmt.Sprintf("%s: %v", path, err)
		}
		up := filepath.Dir(p)
		if up == p {
			return fmt.Sprintf("%s: %v", path, err)
		}
		p = up
	}
}

func fsName(magic int64) string {
	switch magic {
	case unix.BPF_FS_MAGIC:
		return "a BPF file system (bpffs)"
	case unix.CGROUP2_SUPER_MAGIC:
		return "cgroup v2"
	case unix.CGROUP_SUPER_MAGIC:
		return "cgroup v1"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.SYSFS_MAGIC:
		return "sysfs (bpffs not mounted)"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs (the container's own file system)"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	}
	return fmt.Sprintf("a file system of type %#x", magic)
}

// need is one kernel feature the objects use, and how to probe it.
type need struct {
	what  string
	probe func() error
	parts []string // the parts of the datapath that need it
}

// part is one object Open loads and what it is for.
type part struct {
	name string
	spec *ebpf.CollectionSpec
}

// partsFor returns the objects Open loads for p, as Open would configure
// them.
func partsFor(p Prerequisites) ([]part, error) {
	var parts []part
	add := func(name string, load func() (*ebpf.CollectionSpec, error), adjust func(*ebpf.CollectionSpec) error) error {
		spec, err := load()
		if err != nil {
			return err
		}
		if adjust != nil {
			if err := adjust(spec); err != nil {
				return err
			}
		}
		parts = append(parts, part{name, spec})
		return nil
	}
	if err := add("per-packet load balancing (tc)", loadTc, nil); err != nil {
		return nil, err
	}
	if err := add("the conntrack GC", loadCtgc, nil); err != nil {
		return nil, err
	}
	if p.Cgroup != "" {
		err := add("socket load balancing", loadSock, func(spec *ebpf.CollectionSpec) error {
			return selectSockVariant(spec, haveSetRetval() == nil)
		})
		if err != nil {
			return nil, err
		}
	}
	if p.XDP != "" && p.XDP != XDPOff {
		if err := add("the XDP fast path", loadXdp, nil); err != nil {
			return nil, err
		}
	}
	return parts, nil
}

// kernelNeeds lists, without duplicates, what loading the objects for p
// needs from the kernel.
func kernelNeeds(p Prerequisites) ([]*need, error) {
	parts, err := partsFor(p)
	if err != nil {
		return nil, err
	}
	var needs []*need
	seen := map[string]*need{}
	for _, pt := range parts {
		add := func(what string, probe func() error) {
			n := seen[what]
			if n == nil {
				n = &need{what: what, probe: probe}
				seen[what] = n
				needs = append(needs, n)
			}
			if !slices.Contains(n.parts, pt.name) {
				n.parts = append(n.parts, pt.name)
			}
		}
		spec := pt.spec
		for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
			mt := spec.Maps[name].Type
			add("map type "+mt.String(), func() error { return features.HaveMapType(mt) })
		}
		for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
			ps := spec.Programs[name]
			pt, at := ps.Type, ps.AttachType
			add("program type "+pt.String(), func() error { return features.HaveProgramType(pt) })
			if at != ebpf.AttachNone {
				add(fmt.Sprintf("attach type %s of %s programs", at, pt), func() error { return probeAttachType(pt, at) })
			}
			for _, ins := range ps.Instructions {
				switch {
				case ins.IsBuiltinCall():
					fn := asm.BuiltinFunc(ins.Constant)
					add(fmt.Sprintf("helper %s in %s programs", fn, pt), func() error { return features.HaveProgramHelper(pt, fn) })
				case ins.OpCode.Class() == asm.Jump32Class:
					add("32-bit jumps (BPF ISA v3)", features.HaveV3ISA)
				}
			}
		}
	}
	return needs, nil
}

// probeAttachType loads a program that does nothing with the given type
// and expected attach type. The kernel checks the attach type at load
// (EINVAL if it does not know it), so this finds, say, a kernel before 5.8
// that has cgroup connect4 but not getpeername4.
func probeAttachType(pt ebpf.ProgramType, at ebpf.AttachType) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       pt,
		AttachType: at,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
		},
	})
	if err == nil {
		prog.Close()
		return nil
	}
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: %w", ebpf.ErrNotSupported, err)
	}
	return err
}

// kernelProblems probes every need of the configuration p. A kernel that
// lacks a feature and an agent that may not use bpf(2) at all are told
// apart: the second is one problem (the container's capabilities or
// seccomp profile), not one per feature.
func kernelProblems(p Prerequisites) []string {
	needs, err := kernelNeeds(p)
	if err != nil {
		return []string{fmt.Sprintf("read the BPF objects: %v", err)}
	}
	var missing, other []string
	var parts []string
	for _, n := range needs {
		err := n.probe()
		switch {
		case err == nil:
		case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
			return []string{fmt.Sprintf("bpf(2) is not permitted (%v): run as root with CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN "+
				"and CAP_SYS_ADMIN (deploy/sluice.yaml adds them), and with a seccomp profile that allows bpf(2) "+
				"(the DaemonSet sets seccompProfile Unconfined)", err)}
		case errors.Is(err, ebpf.ErrNotSupported):
			missing = append(missing, n.what)
			for _, pt := range n.parts {
				if !slices.Contains(parts, pt) {
					parts = append(parts, pt)
				}
			}
		default:
			other = append(other, fmt.Sprintf("probe %s: %v", n.what, err))
		}
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("the kernel (%s) lacks %s, which %s needs; deploy/README.md's "+
			"node requirements say which Linux each part needs (--socket-lb=false and --xdp=off leave those parts out)",
			kernelRelease(), strings.Join(missing, ", "), strings.Join(parts, " and ")))
	}
	return append(problems, other...)
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown release"
	}
	return unix.ByteSliceToString(u.Release[:])
}
