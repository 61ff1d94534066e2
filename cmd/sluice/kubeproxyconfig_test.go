package main

import (
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// everyMappedField sets every field --config maps to a flag.
const everyMappedField = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: node-1
bindAddress: 192.168.1.10
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 0.0.0.0:10249
enableProfiling: true
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 50
clusterCIDR: 10.244.0.0/16
detectLocalMode: NodeCIDR
nodePortAddresses: [localhost, 192.168.0.0/16]
iptables:
  masqueradeAll: true
  localhostNodePorts: false
  syncPeriod: 1m
  minSyncPeriod: 2s
conntrack:
  tcpEstablishedTimeout: 24h
  udpStreamTimeout: 2m
featureGates:
  AllowServiceExternalIPs: false
`

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigPrecedence: the command line wins over the file, the file
// over the defaults; a source on the command line overrides the file's
// kubeconfig.
func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, everyMappedField)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	clusterCIDR := fs.String("cluster-cidr", "", "")
	masqAll := fs.Bool("masquerade-all", false, "")
	nodeName := fs.String("node-name", "", "")
	manifests := fs.String("manifests", "", "")
	kube := addKubeFlags(fs)
	for _, f := range []string{"node-ip", "health-addr", "metrics-addr", "nodeport-addresses"} {
		fs.String(f, "", "")
	}
	fs.Bool("localhost-nodeports", true, "")
	profiling := fs.Bool("profiling", false, "")
	localMode := fs.String("detect-local-mode", "ClusterCIDR", "")
	tcpTimeout := fs.Duration("conntrack-tcp-timeout", time.Hour, "")
	udpTimeout := fs.Duration("conntrack-udp-timeout", time.Minute, "")
	allowExtIPs := fs.Bool("allow-service-external-ips", true, "")
	if err := fs.Parse([]string{"--cluster-cidr", "10.0.0.0/8", "--manifests", "m.yaml", "--sync-period", "5s"}); err != nil {
		t.Fatal(err)
	}
	kp, err := applyKubeProxyConfig(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	if *clusterCIDR != "10.0.0.0/8" || *kube.syncPeriod != 5*time.Second || *manifests != "m.yaml" {
		t.Errorf("command line overridden by the file: --cluster-cidr %s, --sync-period %s, --manifests %s", *clusterCIDR, *kube.syncPeriod, *manifests)
	}
	if *kube.kubeconfig != "" {
		t.Errorf("--kubeconfig %q set from the file beside --manifests: two sources", *kube.kubeconfig)
	}
	if !*masqAll || *nodeName != "node-1" || *kube.apiQPS != 50 || *kube.minSyncPeriod != 2*time.Second || !*profiling || *localMode != "NodeCIDR" {
		t.Errorf("file not applied: --masquerade-all %v, --node-name %q, --kube-api-qps %v, --min-sync-period %s, --profiling %v, --detect-local-mode %s",
			*masqAll, *nodeName, *kube.apiQPS, *kube.minSyncPeriod, *profiling, *localMode)
	}
	if *tcpTimeout != 24*time.Hour || *udpTimeout != 2*time.Minute {
		t.Errorf("conntrack timeouts not applied: --conntrack-tcp-timeout %s, --conntrack-udp-timeout %s", *tcpTimeout, *udpTimeout)
	}
	if *allowExtIPs {
		t.Error("featureGates.AllowServiceExternalIPs false not applied: --allow-service-external-ips true")
	}
	var overridden []string
	for _, s := range kp.overridden {
		overridden = append(overridden, s.Field)
	}
	if want := []string{"clientConnection.kubeconfig", "clusterCIDR", "iptables.syncPeriod"}; !reflect.DeepEqual(overridden, want) {
		t.Errorf("overridden %q, want %q", overridden, want)
	}
	if len(kp.applied)+len(kp.overridden) != 17 {
		t.Errorf("%d settings applied and %d overridden, want 17 in all", len(kp.applied), len(kp.overridden))
	}
}

// TestConfigFlagsExist: every flag the file can set exists on the agent's
// command line. The run stops at a flag checked after --config (an
// invalid --conntrack-gc-interval), so it never starts an agent.
func TestConfigFlagsExist(t *testing.T) {
	stderr := captureStderr(t, func() {
		path := writeConfig(t, everyMappedField)
		if code := run([]string{"--config", path, "--conntrack-gc-interval", "0"}); code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
	})
	if !strings.Contains(stderr, "--conntrack-gc-interval") || strings.Contains(stderr, "--config") {
		t.Errorf("the file was not applied as a whole; stderr:\n%s", stderr)
	}
}

// TestBadConfigExitsTwo: a file Sluice cannot apply is a command-line
// error, and says which field.
func TestBadConfigExitsTwo(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, c := range []struct{ body, want string }{
		{head + "clusterCIDR: 10.0.0.0/40\n", "clusterCIDR"},
		{head + "iptables:\n  masqueradAll: true\n", "iptables.masqueradAll"},
	} {
		stderr := captureStderr(t, func() {
			if code := run([]string{"--config", writeConfig(t, c.body), "--manifests", "m.yaml"}); code != 2 {
				t.Errorf("%q: exit %d, want 2", c.body, code)
			}
		})
		if !strings.Contains(stderr, c.want) {
			t.Errorf("stderr does not name %s:\n%s", c.want, stderr)
		}
	}
}

// captureStderr returns what fn writes to os.Stderr.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r) // the pipe is ours: only closing it ends the read
		done <- b
	}()
	fn()
	os.Stderr = saved
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestParseNodePortAddresses(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		in      string
		cidrs   []netip.Prefix
		primary bool
	}{
		{"", nil, false},
		{"primary", nil, true},
		{"primary,localhost,192.168.0.0/16,fd00::/64", []netip.Prefix{p("127.0.0.0/8"), p("192.168.0.0/16"), p("fd00::/64")}, true},
		{"all", []netip.Prefix{p("0.0.0.0/0"), p("::/0")}, false},
	} {
		cidrs, primary, err := parseNodePortAddresses(c.in)
		if err != nil || !reflect.DeepEqual(cidrs, c.cidrs) || primary != c.primary {
			t.Errorf("parseNodePortAddresses(%q) = %v, %v, %v; want %v, %v", c.in, cidrs, primary, err, c.cidrs, c.primary)
		}
	}
	if _, _, err := parseNodePortAddresses("primary,10.0.0.1"); err == nil {
		t.Error("parseNodePortAddresses accepts an address without a prefix length")
	}
}

// TestConntrackTimeoutMustBePositive: a zero timeout would expire every
// flow at once, and is refused.
func TestConntrackTimeoutMustBePositive(t *testing.T) {
	stderr := captureStderr(t, func() {
		if code := run([]string{"--conntrack-udp-timeout", "0s", "--manifests", "x.yaml"}); code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
	})
	if !strings.Contains(stderr, "--conntrack-udp-timeout 0s: must be > 0") {
		t.Errorf("stderr:\n%s", stderr)
	}
}

// TestProfilingFromConfig: enableProfiling turns --profiling on, unless
// the command line says otherwise.
func TestProfilingFromConfig(t *testing.T) {
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nenableProfiling: true\n")
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--profiling=false"}, false}} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		profiling := fs.Bool("profiling", false, "")
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		kp, err := applyKubeProxyConfig(fs, path)
		if err != nil {
			t.Fatal(err)
		}
		// (the conntrack fields left null are reported: their
		// kube-proxy defaults set sysctls Sluice does not)
		if *profiling != c.want || len(kp.ignored) != 1 || kp.ignored[0].Field != "conntrack" {
			t.Errorf("%q: --profiling %v, ignored %v; want %v, the conntrack defaults only", c.args, *profiling, kp.ignored, c.want)
		}
	}
}

// TestHostnameOverrideOverridesConfig: --hostname-override, kube-proxy's
// --node-name, overrides the file's hostnameOverride as --node-name does,
// so the log names the field overridden, not applied (the agent runs as
// the flag's node).
func TestHostnameOverrideOverridesConfig(t *testing.T) {
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: node-a\n")
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	nodeName := fs.String("node-name", "", "")
	fs.String("hostname-override", "", "")
	if err := fs.Parse([]string{"--hostname-override", "node-b"}); err != nil {
		t.Fatal(err)
	}
	kp, err := applyKubeProxyConfig(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	if *nodeName != "" || len(kp.applied) != 0 || len(kp.overridden) != 1 || kp.overridden[0].Field != "hostnameOverride" {
		t.Errorf("--node-name %q, applied %v, overridden %v; want the file's hostnameOverride overridden, --node-name untouched", *nodeName, kp.applied, kp.overridden)
	}
}

// TestProcSysNetChecked: a --proc-sys-net that is not a /proc/sys/net (a
// typo, a manifest without the DaemonSet's mount of the node's) is
// refused at start, naming the flag, where the ICMP rate limits would
// fall back to Linux's defaults without a word and the SNAT ports go
// unreserved; the default passes the check.
func TestProcSysNetChecked(t *testing.T) {
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "host", "proc", "sys", "net")} {
		stderr := captureStderr(t, func() {
			if code := run([]string{"--proc-sys-net", dir, "--manifests", "x.yaml"}); code != 2 {
				t.Errorf("--proc-sys-net %q: exit %d, want 2", dir, code)
			}
		})
		if !strings.Contains(stderr, "--proc-sys-net") || !strings.Contains(stderr, "/proc/sys/net") {
			t.Errorf("--proc-sys-net %q: stderr:\n%s", dir, stderr)
		}
	}
	if err := checkProcSysNet(datapath.DefaultProcSysNet); err != nil {
		t.Errorf("the default: %v", err)
	}
}
