package kubeproxyconfig

import (
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	netutils "k8s.io/utils/net"
)

// head begins every file of these tests but the JSON one.
const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// parse is Parse of doc, failing the test on an error.
func parse(t *testing.T, doc string) Result {
	t.Helper()
	res, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("%q: %v", doc, err)
	}
	return res
}

// checkSettings reports settings other than want, in order; what names
// the file.
func checkSettings(t *testing.T, what string, got, want []Setting) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: settings:\n got %v\nwant %v", what, got, want)
	}
}

// TestKubeadmConfig: the file kubeadm writes sets the cluster CIDR and
// the kubeconfig, and nothing else: its empty fields ask for defaults and
// are not reported, but for the conntrack fields left null, whose
// kube-proxy defaults set netfilter sysctls Sluice leaves alone: one
// entry names them, with the values kube-proxy would have set.
func TestKubeadmConfig(t *testing.T) {
	res, err := Load(filepath.Join("testdata", "kubeadm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checkSettings(t, "kubeadm.yaml", res.Settings, []Setting{
		{"clientConnection.kubeconfig", "kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf"},
		{"clusterCIDR", "cluster-cidr", "10.244.0.0/16"},
	})
	if len(res.Ignored) != 1 || res.Ignored[0].Field != "conntrack" ||
		res.Ignored[0].Value != `{"maxPerCore":null,"tcpCloseWaitTimeout":null,"tcpEstablishedTimeout":null}` {
		t.Fatalf("ignored %v, want the conntrack defaults only", res.Ignored)
	}
	for _, want := range []string{"nf_conntrack_max 32768 x cores (at least 131072, at most 1048576)", "nf_conntrack_tcp_timeout_close_wait 3600",
		"nf_conntrack_tcp_timeout_established 86400", "6h", "sysctl.d"} {
		if !strings.Contains(res.Ignored[0].Why, want) {
			t.Errorf("conntrack: why %q does not say %q", res.Ignored[0].Why, want)
		}
	}
}

// withoutConntrackDefaults is ig without the entry for conntrack fields
// left null (a file without a conntrack section has one).
func withoutConntrackDefaults(ig []Ignored) []Ignored {
	return slices.DeleteFunc(slices.Clone(ig), func(i Ignored) bool { return i.Field == "conntrack" })
}

// TestConntrackDefaults: only the null conntrack fields whose kube-proxy
// default sets a sysctl are named; conntrack.min's value enters the
// nf_conntrack_max it would have set; set fields are not named (a set
// maxPerCore is reported on its own, as any field set and not applied).
func TestConntrackDefaults(t *testing.T) {
	for _, c := range []struct {
		body, value, why string
	}{
		{"", `{"maxPerCore":null,"tcpCloseWaitTimeout":null,"tcpEstablishedTimeout":null}`, "at least 131072"},
		{"conntrack: {min: 65536}\n", `{"maxPerCore":null,"tcpCloseWaitTimeout":null,"tcpEstablishedTimeout":null}`, "at least 65536"},
		{"conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 0s}\n", `{"tcpEstablishedTimeout":null}`, "nf_conntrack_tcp_timeout_established 86400"},
		{"conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 1h}\n", "", ""},
		// Set and applied to Sluice's table, but not to the sysctl
		// kube-proxy would have written: reported as the null ones.
		{"conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 12h, tcpCloseWaitTimeout: 1h}\n", `{"tcpEstablishedTimeout":"12h0m0s"}`,
			"nf_conntrack_tcp_timeout_established 43200 (the kernel's 432000; applied to Sluice's own table only"},
		{"conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 1h, udpStreamTimeout: 5m}\n", `{"udpStreamTimeout":"5m0s"}`,
			"nf_conntrack_udp_timeout_stream 300"},
	} {
		res := parse(t, head+c.body)
		var got *Ignored
		for i := range res.Ignored {
			if res.Ignored[i].Field == "conntrack" {
				got = &res.Ignored[i]
			}
		}
		switch {
		case c.value == "" && got != nil:
			t.Errorf("%q: conntrack reported: %v", c.body, *got)
		case c.value != "" && got == nil:
			t.Errorf("%q: conntrack not reported (ignored %v)", c.body, res.Ignored)
		case got != nil && (got.Value != c.value || !strings.Contains(got.Why, c.why)):
			t.Errorf("%q: conntrack %s, %q; want %s, saying %q", c.body, got.Value, got.Why, c.value, c.why)
		}
	}
}

// TestTunedConfig: a file an operator has tuned, in nftables mode, sets
// every flag a field maps to, and each field Sluice does not apply is
// reported once, with the reason.
func TestTunedConfig(t *testing.T) {
	res := parse(t, head+`mode: nftables
hostnameOverride: " Node-1 "
bindAddress: 192.168.1.10
bindAddressHardFail: true
healthzBindAddress: 0.0.0.0
metricsBindAddress: 192.168.1.10:10249
enableProfiling: true
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 50
  burst: 100
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
detectLocalMode: ClusterCIDR
nodePortAddresses: [192.168.0.0/16, "fd00::/64"]
nftables:
  masqueradeAll: true
  masqueradeBit: 14
  syncPeriod: 1m
  minSyncPeriod: 2s
iptables:
  masqueradeAll: true
  localhostNodePorts: false
ipvs:
  scheduler: rr
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpEstablishedTimeout: 24h0m0s
  tcpCloseWaitTimeout: 1h0m0s
  udpTimeout: 30s
  udpStreamTimeout: 5m
featureGates:
  SomeGate: true
logging:
  verbosity: 4
oomScoreAdj: -999
`)
	checkSettings(t, "the tuned file", res.Settings, []Setting{
		{"hostnameOverride", "node-name", "node-1"},
		{"bindAddress", "node-ip", "192.168.1.10"},
		{"healthzBindAddress", "health-addr", "0.0.0.0:10256"},
		{"metricsBindAddress", "metrics-addr", "192.168.1.10:10249"},
		{"enableProfiling", "profiling", "true"},
		{"clientConnection.kubeconfig", "kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf"},
		{"clientConnection.qps", "kube-api-qps", "50"},
		{"clusterCIDR", "cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"},
		{"detectLocalMode", "detect-local-mode", "ClusterCIDR"},
		{"nodePortAddresses", "nodeport-addresses", "192.168.0.0/16,fd00::/64"},
		{"conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout", "24h0m0s"},
		{"conntrack.udpStreamTimeout", "conntrack-udp-timeout", "5m0s"},
		{"nftables.masqueradeAll", "masquerade-all", "true"},
		{"nftables.syncPeriod", "sync-period", "1m0s"},
		{"nftables.minSyncPeriod", "min-sync-period", "2s"},
	})
	wantIgnored := map[string]string{
		"clientConnection.burst":        "100",
		"conntrack":                     `{"tcpEstablishedTimeout":"24h0m0s","udpStreamTimeout":"5m0s"}`,
		"conntrack.maxPerCore":          "32768",
		"conntrack.min":                 "131072",
		"conntrack.tcpCloseWaitTimeout": "1h0m0s",
		"conntrack.udpTimeout":          "30s",
		"featureGates.SomeGate":         "true",
		"iptables.localhostNodePorts":   "false",
		"iptables.masqueradeAll":        "true",
		"ipvs.scheduler":                "rr",
		"logging.verbosity":             "4",
		"mode":                          "nftables",
		"nftables.masqueradeBit":        "14",
		"oomScoreAdj":                   "-999",
	}
	got := map[string]string{}
	var fields []string
	for _, ig := range res.Ignored {
		got[ig.Field] = ig.Value
		fields = append(fields, ig.Field)
		if ig.Why == "" || ig.Why == "not applied" {
			t.Errorf("%s: no reason given (%q)", ig.Field, ig.Why)
		}
	}
	if !reflect.DeepEqual(got, wantIgnored) || len(fields) != len(wantIgnored) {
		t.Errorf("ignored:\n got %v\nwant %v", got, wantIgnored)
	}
	for _, ig := range res.Ignored {
		if ig.Field == "iptables.masqueradeAll" && ig.Why != `not the section of mode nftables` {
			t.Errorf("iptables.masqueradeAll in nftables mode: why %q", ig.Why)
		}
	}
}

// TestConntrackZeroes: 0 in conntrack's pointer fields tells kube-proxy
// to leave the node's sysctls alone, as Sluice does: nothing to report.
// An explicit false elsewhere is a choice, and is reported.
func TestConntrackZeroes(t *testing.T) {
	res := parse(t, head+`mode: iptables
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  snatNodeInternalIP: false
`)
	var fields []string
	for _, ig := range res.Ignored {
		fields = append(fields, ig.Field)
	}
	if want := []string{"iptables.snatNodeInternalIP", "mode"}; !reflect.DeepEqual(fields, want) {
		t.Errorf("ignored %q, want %q", fields, want)
	}
}

// TestModeSections: masqueradeAll, localhostNodePorts and the sync
// periods come from the section kube-proxy would read in that mode.
func TestModeSections(t *testing.T) {
	const sections = `
iptables: {masqueradeAll: true, localhostNodePorts: false, syncPeriod: 10s}
ipvs: {syncPeriod: 20s}
nftables: {syncPeriod: 30s}
`
	for _, c := range []struct {
		mode string
		want []Setting
	}{
		{"", []Setting{
			{"iptables.localhostNodePorts", "localhost-nodeports", "false"},
			{"iptables.masqueradeAll", "masquerade-all", "true"},
			{"iptables.syncPeriod", "sync-period", "10s"},
		}},
		{"ipvs", []Setting{
			{"iptables.masqueradeAll", "masquerade-all", "true"},
			{"ipvs.syncPeriod", "sync-period", "20s"},
		}},
		{"nftables", []Setting{{"nftables.syncPeriod", "sync-period", "30s"}}},
	} {
		res := parse(t, head+"mode: \""+c.mode+"\"\n"+sections)
		checkSettings(t, "mode "+strconv.Quote(c.mode), res.Settings, c.want)
	}
}

// TestJSON: kube-proxy reads JSON too.
func TestJSON(t *testing.T) {
	res := parse(t, `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
		"nodePortAddresses": ["all"], "iptables": {"masqueradeAll": true}}`)
	checkSettings(t, "JSON", res.Settings, []Setting{{"nodePortAddresses", "nodeport-addresses", "all"}, {"iptables.masqueradeAll", "masquerade-all", "true"}})
}

// TestBadFiles: each error names the field at fault.
func TestBadFiles(t *testing.T) {
	for _, c := range []struct {
		name, body, want string
	}{
		{"unknown field", head + "proxyMode: iptables\n", `unknown field "proxyMode"`},
		{"unknown field in a section", head + "iptables:\n  masqueradAll: true\n", `unknown field "iptables.masqueradAll"`},
		{"unknown field in an inapplicable section", head + "ipvs:\n  schedular: rr\n", `unknown field "ipvs.schedular"`},
		{"field names are case-sensitive", head + "ClusterCIDR: 10.0.0.0/8\n", `unknown field "ClusterCIDR"`},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", "kind"},
		{"wrong version", "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", "apiVersion"},
		{"invalid cluster CIDR", head + "clusterCIDR: 10.0.0.0/40\n", `clusterCIDR "10.0.0.0/40"`},
		{"invalid second cluster CIDR", head + "clusterCIDR: 10.0.0.0/8,fd00::/200\n", "clusterCIDR"},
		{"nodePortAddresses entry without a prefix", head + "nodePortAddresses: [all, 10.0.0.1]\n", `nodePortAddresses[1] "10.0.0.1"`},
		// kube-proxy's validation (pkg/proxy/apis/config/validation):
		// primary stands alone; clusterCIDR is one CIDR or a dual-stack
		// pair; an address has no zone.
		{"primary beside a CIDR", head + "nodePortAddresses: [primary, 10.0.0.0/8]\n", `nodePortAddresses[0] "primary": primary must be the only entry`},
		{"primary after a CIDR", head + "nodePortAddresses: [10.0.0.0/8, primary]\n", `nodePortAddresses[1] "primary"`},
		{"primary twice", head + "nodePortAddresses: [primary, primary]\n", `nodePortAddresses[0] "primary"`},
		{"three cluster CIDRs", head + "clusterCIDR: 10.0.0.0/8,fd00::/64,192.168.0.0/16\n", `clusterCIDR "10.0.0.0/8,fd00::/64,192.168.0.0/16": want one CIDR or a dual-stack pair`},
		{"two IPv4 cluster CIDRs", head + "clusterCIDR: 10.0.0.0/8,192.168.0.0/16\n", `clusterCIDR "10.0.0.0/8,192.168.0.0/16": want one CIDR or a dual-stack pair`},
		{"two IPv6 cluster CIDRs", head + "detectLocalMode: ClusterCIDR\nclusterCIDR: fd00::/64,fd01::/64\n", "clusterCIDR"},
		{"bind address with a zone", head + "bindAddress: fe80::1%eth0\n", "bindAddress"},
		{"metrics host with a zone", head + "metricsBindAddress: \"[fe80::1%eth0]:10249\"\n", "metricsBindAddress"},
		{"bad metrics port", head + "metricsBindAddress: 0.0.0.0:metrics\n", "metricsBindAddress"},
		{"healthz port out of range", head + "healthzBindAddress: 0.0.0.0:99999\n", "healthzBindAddress"},
		{"healthz host name", head + "healthzBindAddress: localhost:10256\n", "healthzBindAddress"},
		{"bind address not an IP", head + "bindAddress: node-1\n", "bindAddress"},
		{"local traffic by bridge", head + "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n", `detectLocalMode "BridgeInterface": Sluice tells pods by their source address only`},
		{"local traffic by interface prefix", head + "detectLocalMode: InterfaceNamePrefix\n", `detectLocalMode "InterfaceNamePrefix": Sluice tells pods by their source address only`},
		{"unknown local traffic detector", head + "detectLocalMode: PodCIDR\n", `detectLocalMode "PodCIDR": want ClusterCIDR or NodeCIDR`},
		{"unknown mode", head + "mode: userspace\n", `mode "userspace"`},
		{"negative sync period", head + "iptables:\n  syncPeriod: -1s\n", "iptables.syncPeriod"},
		{"negative qps", head + "clientConnection:\n  qps: -1\n", "clientConnection.qps"},
		{"wrong type", head + "iptables:\n  masqueradeAll: \"yes\"\n", "masqueradeAll"},
		// The rest of kube-proxy's validation (validation.go), for
		// fields Sluice does not apply too: kube-proxy would not start.
		{"Windows' mode", head + "mode: kernelspace\n", `mode "kernelspace"`},
		{"iptables masqueradeBit out of range", head + "mode: nftables\niptables: {masqueradeBit: 40}\n", "iptables.masqueradeBit 40: must be within [0, 31]"},
		{"nftables masqueradeBit out of range", head + "mode: nftables\nnftables: {masqueradeBit: -1}\n", "nftables.masqueradeBit -1"},
		{"oomScoreAdj out of range", head + "oomScoreAdj: 5000\n", "oomScoreAdj 5000: must be within [-1000, 1000]"},
		{"negative maxPerCore", head + "conntrack: {maxPerCore: -1}\n", "conntrack.maxPerCore -1: must be >= 0"},
		{"negative conntrack min", head + "conntrack: {min: -5}\n", "conntrack.min -5"},
		{"negative CLOSE_WAIT timeout", head + "conntrack: {tcpCloseWaitTimeout: -1s}\n", "conntrack.tcpCloseWaitTimeout -1s"},
		{"negative established timeout", head + "conntrack: {tcpEstablishedTimeout: -1s}\n", "conntrack.tcpEstablishedTimeout -1s"},
		{"negative UDP timeout", head + "conntrack: {udpTimeout: -1s}\n", "conntrack.udpTimeout -1s"},
		{"negative UDP stream timeout", head + "conntrack: {udpStreamTimeout: -1s}\n", "conntrack.udpStreamTimeout -1s"},
		{"bogus excludeCIDRs in ipvs mode", head + "mode: ipvs\nipvs: {excludeCIDRs: [10.0.0.0/8, bogus]}\n", `ipvs.excludeCIDRs[1] "bogus"`},
		{"negative ipvs timeout in ipvs mode", head + "mode: ipvs\nipvs: {tcpFinTimeout: -1s}\n", "ipvs.tcpFinTimeout -1s"},
		{"negative burst", head + "clientConnection: {burst: -1}\n", "clientConnection.burst -1: must be >= 0"},
		{"negative configSyncPeriod", head + "configSyncPeriod: -1s\n", "configSyncPeriod -1s"},
		{"negative min sync period", head + "mode: nftables\nnftables: {minSyncPeriod: -1s}\n", "nftables.minSyncPeriod -1s"},
		{"min sync period above the default sync period", head + "iptables: {minSyncPeriod: 1m}\n", "iptables.minSyncPeriod 1m0s: must not be above iptables.syncPeriod, 30s"},
		{"min sync period above the sync period", head + "mode: ipvs\nipvs: {syncPeriod: 10s, minSyncPeriod: 11s}\n", "ipvs.minSyncPeriod 11s"},
		// kube-proxy splits clusterCIDR at commas without trimming.
		{"cluster CIDRs with a space", head + "clusterCIDR: 10.0.0.0/8, fd00::/64\n", `clusterCIDR "10.0.0.0/8, fd00::/64"`},
		{"duplicate field", head + "clusterCIDR: 10.0.0.0/8\nclusterCIDR: 10.1.0.0/16\n", "clusterCIDR"},
		{"not YAML", "{", "decode"},
	} {
		_, err := Parse([]byte(c.body))
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not name %q", c.name, err, c.want)
		}
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("missing file: error %v does not name %s", err, path)
	}
}

// TestBindAddressFamilies: bindAddress of either family is the node's
// primary address (--node-ip); an unspecified one of either family leaves
// it to the Node object, and a dual-stack clusterCIDR is taken whole.
func TestBindAddressFamilies(t *testing.T) {
	for _, c := range []struct {
		body string
		want []Setting
	}{
		{"bindAddress: 192.168.1.10\n", []Setting{{"bindAddress", "node-ip", "192.168.1.10"}}},
		{"bindAddress: 2001:db8::10\n", []Setting{{"bindAddress", "node-ip", "2001:db8::10"}}},
		{"bindAddress: ::ffff:192.168.1.10\n", []Setting{{"bindAddress", "node-ip", "192.168.1.10"}}},
		{"bindAddress: 0.0.0.0\n", nil},
		{"bindAddress: \"::\"\n", nil},
		{"clusterCIDR: fd00:10:244::/56,10.244.0.0/16\n", []Setting{{"clusterCIDR", "cluster-cidr", "fd00:10:244::/56,10.244.0.0/16"}}},
	} {
		res, err := Parse([]byte(head + c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if !reflect.DeepEqual(res.Settings, c.want) || len(withoutConntrackDefaults(res.Ignored)) != 0 {
			t.Errorf("%s: settings %v, ignored %v; want %v, none", c.body, res.Settings, res.Ignored, c.want)
		}
	}
}

// TestNodeCIDRMode: detectLocalMode NodeCIDR sets --detect-local-mode, and
// clusterCIDR beside it (kubeadm's file always carries one) is still
// checked and mapped: the agent says it is ignored in that mode. The
// detectLocal section is read by the interface modes only, and reported.
func TestNodeCIDRMode(t *testing.T) {
	res := parse(t, head+`clusterCIDR: 10.244.0.0/16
detectLocalMode: NodeCIDR
detectLocal:
  bridgeInterface: cbr0
  interfaceNamePrefix: ""
`)
	checkSettings(t, "NodeCIDR mode", res.Settings, []Setting{
		{"clusterCIDR", "cluster-cidr", "10.244.0.0/16"},
		{"detectLocalMode", "detect-local-mode", "NodeCIDR"},
	})
	if ig := withoutConntrackDefaults(res.Ignored); len(ig) != 1 || ig[0].Field != "detectLocal.bridgeInterface" || !strings.Contains(ig[0].Why, "BridgeInterface") {
		t.Errorf("ignored %v, want detectLocal.bridgeInterface, with the reason", res.Ignored)
	}
}

// TestSloppyAddresses: kube-proxy parses addresses and CIDRs with
// netutils' sloppy parsers, which read an IPv4 part with leading zeros as
// decimal; so does the file here, each handed to the flag in the
// canonical form its parser takes. The expected values are the sloppy
// parsers' own answers.
func TestSloppyAddresses(t *testing.T) {
	for _, c := range []struct {
		body string
		want Setting
	}{
		{"bindAddress: 010.000.001.010\n", Setting{"bindAddress", "node-ip", "10.0.1.10"}},
		{"bindAddress: ::ffff:010.0.1.10\n", Setting{"bindAddress", "node-ip", "10.0.1.10"}},
		{"healthzBindAddress: 000.0.0.0\n", Setting{"healthzBindAddress", "health-addr", "0.0.0.0:10256"}},
		{"metricsBindAddress: 127.000.000.001:10249\n", Setting{"metricsBindAddress", "metrics-addr", "127.0.0.1:10249"}},
		{"clusterCIDR: 010.244.0.0/16,fd00:10:244::/56\n", Setting{"clusterCIDR", "cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"}},
		{"clusterCIDR: 10.244.0.0/016\n", Setting{"clusterCIDR", "cluster-cidr", "10.244.0.0/16"}},
		{"nodePortAddresses: [192.168.001.0/24, all]\n", Setting{"nodePortAddresses", "nodeport-addresses", "192.168.1.0/24,all"}},
		// One canonical form, masked, whichever parser took the CIDR
		// (the sloppy one masks).
		{"clusterCIDR: 010.244.0.1/16\n", Setting{"clusterCIDR", "cluster-cidr", "10.244.0.0/16"}},
		{"clusterCIDR: 10.244.0.1/16,fd00:10:244::1/56\n", Setting{"clusterCIDR", "cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"}},
		{"nodePortAddresses: [192.168.1.7/24]\n", Setting{"nodePortAddresses", "nodeport-addresses", "192.168.1.0/24"}},
		{"nodePortAddresses: [192.168.001.7/24]\n", Setting{"nodePortAddresses", "nodeport-addresses", "192.168.1.0/24"}},
		// primary alone is what kube-proxy takes, and passes as is.
		{"nodePortAddresses: [primary]\n", Setting{"nodePortAddresses", "nodeport-addresses", "primary"}},
	} {
		res, err := Parse([]byte(head + c.body))
		if err != nil {
			t.Errorf("%s: %v (kube-proxy takes it)", strings.TrimSpace(c.body), err)
			continue
		}
		if !slices.Contains(res.Settings, c.want) {
			t.Errorf("%s: settings %v, want %v", strings.TrimSpace(c.body), res.Settings, c.want)
		}
	}
	// The expectations above are kube-proxy's readings.
	if ip := netutils.ParseIPSloppy("010.000.001.010"); !ip.Equal(net.ParseIP("10.0.1.10")) {
		t.Errorf("ParseIPSloppy(010.000.001.010) = %v", ip)
	}
	if _, n, err := netutils.ParseCIDRSloppy("192.168.001.0/24"); err != nil || n.String() != "192.168.1.0/24" {
		t.Errorf("ParseCIDRSloppy(192.168.001.0/24) = %v, %v", n, err)
	}

	// In NodeCIDR mode kube-proxy does not read clusterCIDR, and takes
	// any number of them; so does the file (the agent ignores them).
	if _, err := Parse([]byte(head + "detectLocalMode: NodeCIDR\nclusterCIDR: 10.0.0.0/8,192.168.0.0/16\n")); err != nil {
		t.Errorf("NodeCIDR mode, two IPv4 cluster CIDRs: %v", err)
	}
}
