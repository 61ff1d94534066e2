package deploy_test

import (
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// mountAt returns the container's mount at p and its volume.
func mountAt(t *testing.T, spec corev1.PodSpec, p string) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	c := spec.Containers[0]
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == p })
	if i < 0 {
		t.Fatalf("nothing mounted at %s: %+v", p, c.VolumeMounts)
	}
	m := c.VolumeMounts[i]
	j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
	if j < 0 {
		t.Fatalf("mount %s names no volume %q", p, m.Name)
	}
	return m, spec.Volumes[j]
}

// What the agent reads and writes outside its read-only root is mounted:
// the pods' network namespaces where CNI runtimes pin them (the UDP
// socket termination and the start's stale-UDP pass visit /run/netns and
// /var/run/netns, pkg/datapath/sockdestroy.go: networkNamespaces), from
// the host, following new ones, without hostPID; a writable directory for
// --names-file's default, the cgroup2 mount nested in it after it; and
// the node's /proc/sys/net writable at the --proc-sys-net the DaemonSet
// passes (the container's /proc/sys is read-only).
func TestDaemonSetMountsWhatTheAgentUses(t *testing.T) {
	spec := daemonSetOf(t, mustRead(t, "sluice.yaml")).Spec.Template.Spec
	c := spec.Containers[0]
	if spec.HostPID {
		t.Error("hostPID: the pods' network namespaces are reached through the runtime's pins, not every process of the node")
	}
	for _, p := range []string{"/run/netns", "/var/run/netns"} {
		m, v := mountAt(t, spec, p)
		if v.HostPath == nil || v.HostPath.Path != p || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("%s: volume %+v, want the host's %s (DirectoryOrCreate: a node without pods may have none)", p, v.VolumeSource, p)
		}
		if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer || !m.ReadOnly {
			t.Errorf("%s: mount %+v, want read-only, HostToContainer (a pod's namespace pinned after the agent started is seen)", p, m)
		}
	}

	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Fatal("the root filesystem is no longer read-only: this test's premise")
	}
	dir := path.Dir(namesfile.Default)
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--names-file=") }) {
		t.Fatalf("args %q set --names-file: check its directory instead", c.Args)
	}
	m, v := mountAt(t, spec, dir)
	if v.EmptyDir == nil || m.ReadOnly {
		t.Errorf("%s (--names-file %s): %+v %+v, want a writable emptyDir", dir, namesfile.Default, m, v.VolumeSource)
	}
	names := func(p string) int {
		return slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == p })
	}
	if cg := "/run/sluice/cgroupv2"; names(cg) < names(dir) {
		t.Errorf("%s mounted before %s, which holds it", cg, dir)
	}
	if !slices.Contains(c.Args, "--cgroup=/run/sluice/cgroupv2") {
		t.Errorf("args %q: --cgroup is not the nested mount", c.Args)
	}

	const procSysNet = "/host/proc/sys/net"
	if !slices.Contains(c.Args, "--proc-sys-net="+procSysNet) {
		t.Errorf("args %q lack --proc-sys-net=%s", c.Args, procSysNet)
	}
	m, v = mountAt(t, spec, procSysNet)
	if v.HostPath == nil || v.HostPath.Path != datapath.DefaultProcSysNet || m.ReadOnly {
		t.Errorf("%s: %+v %+v, want the host's %s, writable", procSysNet, m, v.VolumeSource, datapath.DefaultProcSysNet)
	}

	// A runtime pinning its namespaces elsewhere: hostPaths.netns.
	_, ds := render(t, "apiServer.host=10.0.0.10", "hostPaths.netns=/var/lib/rt/netns")
	if _, v := mountAt(t, ds.Spec.Template.Spec, "/run/netns"); v.HostPath == nil || v.HostPath.Path != "/var/lib/rt/netns" {
		t.Errorf("hostPaths.netns=/var/lib/rt/netns: /run/netns is %+v", v.VolumeSource)
	}
}

// The flags the chart sets itself cannot be set again through config:
// a second flag would win (the last one does) and the probes, mounts or
// node identity would no longer match; the chart refuses, saying which.
func TestChartRefusesConfigOfItsOwnFlags(t *testing.T) {
	h := helm(t)
	for _, f := range []string{"health-addr", "metrics-addr", "bpffs", "cgroup", "proc-sys-net", "node-ip", "node-name", "in-cluster"} {
		out, err := exec.CommandContext(t.Context(), h, "template", "sluice", chartDir,
			"--set", "apiServer.host=10.0.0.10", "--set", "config."+f+"=x").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "config."+f+": set by the chart") {
			t.Errorf("config.%s=x: %v\n%s", f, err, out)
		}
	}
	// Others pass.
	render(t, "apiServer.host=10.0.0.10", "config.xdp=generic")
}

// The chart needs Kubernetes 1.30 (securityContext.appArmorProfile, GA
// in 1.30): helm refuses an older cluster.
func TestChartNeedsKubernetes130(t *testing.T) {
	h := helm(t)
	for v, ok := range map[string]bool{"1.29.9": false, "1.30.0": true, "1.36.3": true} {
		out, err := exec.CommandContext(t.Context(), h, "template", "sluice", chartDir,
			"--set", "apiServer.host=10.0.0.10", "--kube-version", v).CombinedOutput()
		if (err == nil) != ok {
			t.Errorf("Kubernetes %s: err %v, want accepted %v\n%s", v, err, ok, out)
		}
	}
}
