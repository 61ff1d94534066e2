// Package kubeproxyconfig reads kube-proxy's configuration file (a
// KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1) and says which
// Sluice agent flags it sets, so that Sluice can replace kube-proxy on a
// node without rewriting its configuration.
//
// The file is decoded strictly, as kube-proxy does: a field kube-proxy does
// not know is an error naming it (with its path, e.g. iptables.masqueradAll),
// and so is a value Sluice would have to refuse later (a bad CIDR, an
// address without a port that cannot be completed). A field kube-proxy
// knows but Sluice has no use for (mode, ipvs.*, conntrack.maxPerCore, ...) is
// returned as Ignored with the reason, when it holds anything but its zero
// value: kubeadm writes every field, most of them empty, and an empty field
// asks for the default, so there is nothing to report about it.
//
// A value kube-proxy's validation (pkg/proxy/apis/config/validation)
// refuses is refused here too, whether Sluice applies the field or not: a
// file kube-proxy would not start with is one the user must fix anyway.
// That is every check of its Linux validation (ranges, signs, modes,
// addresses, CIDRs, the sync periods' order) but three, which need
// kube-proxy's own registries: featureGates (kube-proxy refuses a gate its
// version does not know), logging (its format and options) and
// showHiddenMetricsForVersion (the previous minor version only). Those are
// reported as not applied, never checked, but for one feature gate,
// AllowServiceExternalIPs, which sets --allow-service-external-ips. Addresses and CIDRs are parsed as
// kube-proxy's "sloppy" parsers do (an IPv4 part with leading zeros,
// 010.0.0.1, is read as decimal, 10.0.0.1) and handed to the flags in
// canonical form, a CIDR masked (010.244.0.1/16 and 10.244.0.1/16 are both
// 10.244.0.0/16); clusterCIDR is split at commas and not trimmed, as
// kube-proxy splits it (a space after a comma is a CIDR that does not
// parse).
//
// A conntrack field kubeadm leaves null is not Sluice's default in
// kube-proxy: kube-proxy's defaults set the node's netfilter sysctls
// (nf_conntrack_max, the established and CLOSE_WAIT timeouts), which
// Sluice never does. Those are reported, all in one Ignored entry
// (conntrack), with the two timeouts Sluice applies to its own table
// when they are set (kube-proxy would write them to the sysctls too); a
// conntrack field set and not applied is reported on its own, its reason
// naming its sysctl.
//
// The package knows nothing of flag sets: the caller applies the Settings,
// which keeps the precedence rule (command line over file) in one place.
package kubeproxyconfig

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netutils "k8s.io/utils/net"
	"sigs.k8s.io/yaml"
)

// APIVersion and Kind are the only ones accepted.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// kube-proxy's ports, appended to a bind address given without one (as
// kube-proxy's defaulting does).
const (
	healthzPort = "10256"
	metricsPort = "10249"
)

// InterfaceModes says why kube-proxy's local traffic detectors by
// interface (detectLocalMode BridgeInterface and InterfaceNamePrefix)
// are refused, by the file and by the agent's --detect-local-mode alike.
const InterfaceModes = "Sluice tells pods by their source address only (ClusterCIDR or NodeCIDR): " +
	"its socket programs see no interface, and its tc programs run on the devices --devices names, not on every pod's interface"

// Setting is one Sluice flag the file sets.
type Setting struct {
	Field string // the file's field, e.g. "iptables.masqueradeAll"
	Flag  string // the flag's name, without dashes, e.g. "masquerade-all"
	Value string // in the flag's syntax
}

// Ignored is a field the file sets that Sluice does not apply.
type Ignored struct {
	Field string // e.g. "ipvs.scheduler" or "featureGates.SomeGate"
	Value string // as the file gives it (JSON, but for a string)
	Why   string
}

// Result is what a file asks of Sluice.
type Result struct {
	Settings []Setting // in the order of the README's table
	Ignored  []Ignored // sorted by field
}

// Load reads and parses the file at path.
func Load(path string) (Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Result{}, fmt.Errorf("read kube-proxy configuration: %w", err)
	}
	r, err := Parse(data)
	if err != nil {
		return Result{}, fmt.Errorf("kube-proxy configuration %s: %w", path, err)
	}
	return r, nil
}

// Parse parses a KubeProxyConfiguration in YAML or JSON.
func Parse(data []byte) (Result, error) {
	var generic map[string]any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return Result{}, fmt.Errorf("decode: %w", err)
	}
	if err := checkFields(generic, reflect.TypeFor[KubeProxyConfiguration](), ""); err != nil {
		return Result{}, err
	}
	var c KubeProxyConfiguration
	// Strict also refuses duplicate keys; the unknown fields were
	// named above, with their paths.
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Result{}, fmt.Errorf("decode: %w", err)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return Result{}, fmt.Errorf("apiVersion %q, kind %q: want %s, %s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	if err := validate(&c); err != nil {
		return Result{}, err
	}
	m := mapper{applied: map[string]bool{"apiVersion": true, "kind": true}}
	if err := m.mapFields(&c); err != nil {
		return Result{}, err
	}
	m.collectIgnored(generic, reflect.TypeFor[KubeProxyConfiguration](), "", &c)
	if ig, ok := conntrackSysctls(&c.Conntrack); ok {
		m.res.Ignored = append(m.res.Ignored, ig)
	}
	slices.SortFunc(m.res.Ignored, func(a, b Ignored) int { return strings.Compare(a.Field, b.Field) })
	return m.res, nil
}

// checkFields returns an error naming the first field of v (in key order)
// that t does not have. Matching is exact, as kube-proxy's strict decoder
// (sigs.k8s.io/json) does: encoding/json alone would take ClusterCIDR
// for clusterCIDR.
func checkFields(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := v.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct {
			return nil // a map field (featureGates): any key
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown field %q", join(path, k))
			}
			if err := checkFields(v[k], ft, join(path, k)); err != nil {
				return err
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return nil
		}
		for i, e := range v {
			if err := checkFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonFields maps the JSON names of struct t's fields to their types,
// embedded structs (metav1.TypeMeta) inlined.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			for k, ft := range jsonFields(f.Type) {
				out[k] = ft
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

type mapper struct {
	res     Result
	applied map[string]bool // fields consumed, set or not
}

func (m *mapper) set(field, flag, value string) {
	m.applied[field] = true
	m.res.Settings = append(m.res.Settings, Setting{Field: field, Flag: flag, Value: value})
}

// mapFields turns the fields that apply into Settings.
func (m *mapper) mapFields(c *KubeProxyConfiguration) error {
	m.applied["hostnameOverride"] = true
	if h := strings.ToLower(strings.TrimSpace(c.HostnameOverride)); h != "" {
		m.set("hostnameOverride", "node-name", h)
	}

	// bindAddress is kube-proxy's idea of the node's primary IP, of
	// either family; unspecified (kubeadm's 0.0.0.0 or ::) leaves it to
	// the Node object.
	if c.BindAddress != "" {
		a, err := parseAddr(c.BindAddress)
		switch {
		case err != nil:
			return fmt.Errorf("bindAddress %q: %w", c.BindAddress, err)
		case a.IsUnspecified():
			m.applied["bindAddress"] = true
		default:
			m.set("bindAddress", "node-ip", a.Unmap().String())
		}
	}

	for _, b := range []struct{ field, flag, port, value string }{
		{"healthzBindAddress", "health-addr", healthzPort, c.HealthzBindAddress},
		{"metricsBindAddress", "metrics-addr", metricsPort, c.MetricsBindAddress},
	} {
		m.applied[b.field] = true
		if b.value == "" {
			continue // kube-proxy's default, which Sluice shares
		}
		addr, err := bindAddress(b.value, b.port)
		if err != nil {
			return fmt.Errorf("%s %q: %w", b.field, b.value, err)
		}
		m.set(b.field, b.flag, addr)
	}
	// kube-proxy serves /debug/pprof on its metrics server when asked;
	// so does --profiling. false is the default of both.
	m.applied["enableProfiling"] = true
	if c.EnableProfiling {
		m.set("enableProfiling", "profiling", "true")
	}
	// Sluice always fails when it cannot listen: true asks for that,
	// false (kube-proxy's default) is not worth a warning.
	m.applied["bindAddressHardFail"] = true

	m.applied["clientConnection.kubeconfig"] = true
	if c.ClientConnection.Kubeconfig != "" {
		m.set("clientConnection.kubeconfig", "kubeconfig", c.ClientConnection.Kubeconfig)
	}
	m.applied["clientConnection.qps"] = true
	if q := c.ClientConnection.QPS; q != 0 {
		if q < 0 {
			return fmt.Errorf("clientConnection.qps %v: must be > 0", q)
		}
		m.set("clientConnection.qps", "kube-api-qps", strconv.FormatFloat(float64(q), 'g', -1, 32))
	}

	// clusterCIDR is parsed and applied whatever the mode: kubeadm's file
	// carries it beside detectLocalMode NodeCIDR too, and the agent then
	// logs that it is ignored. kube-proxy validates it in ClusterCIDR
	// mode only; a CIDR that does not parse is refused here in NodeCIDR
	// mode too, where kube-proxy would not read it (stricter, kept: the
	// flag it sets parses it).
	m.applied["clusterCIDR"] = true
	if c.ClusterCIDR != "" {
		var cidrs []string
		var families [2]int // IPv4, IPv6
		for _, s := range strings.Split(c.ClusterCIDR, ",") {
			p, err := parsePrefix(s) // untrimmed, as kube-proxy's conversion splits it
			if err != nil {
				return fmt.Errorf("clusterCIDR %q: %w", c.ClusterCIDR, err)
			}
			cidrs = append(cidrs, p.String())
			if a := p.Addr(); a.Is4() || a.Is4In6() {
				families[0]++
			} else {
				families[1]++
			}
		}
		// kube-proxy refuses more only where it reads the CIDRs: in
		// ClusterCIDR mode (its default).
		if (c.DetectLocalMode == "" || c.DetectLocalMode == "ClusterCIDR") && (len(cidrs) > 2 || families[0] == 2 || families[1] == 2) {
			return fmt.Errorf("clusterCIDR %q: want one CIDR or a dual-stack pair (one IPv4, one IPv6), as kube-proxy", c.ClusterCIDR)
		}
		m.set("clusterCIDR", "cluster-cidr", strings.Join(cidrs, ","))
	}
	m.applied["detectLocalMode"] = true
	switch c.DetectLocalMode {
	case "":
	case "ClusterCIDR", "NodeCIDR":
		m.set("detectLocalMode", "detect-local-mode", c.DetectLocalMode)
	case "BridgeInterface", "InterfaceNamePrefix":
		return fmt.Errorf("detectLocalMode %q: %s", c.DetectLocalMode, InterfaceModes)
	default:
		return fmt.Errorf("detectLocalMode %q: want ClusterCIDR or NodeCIDR (kube-proxy's BridgeInterface and InterfaceNamePrefix are not Sluice's)", c.DetectLocalMode)
	}

	m.applied["nodePortAddresses"] = true
	if len(c.NodePortAddresses) > 0 {
		addrs := make([]string, len(c.NodePortAddresses))
		for i, s := range c.NodePortAddresses {
			switch s {
			case "primary":
				// kube-proxy: "can't use both 'primary' and CIDRs"
				// (Sluice's --nodeport-addresses would take the union).
				if len(c.NodePortAddresses) > 1 {
					return fmt.Errorf("nodePortAddresses[%d] %q: primary must be the only entry, as in kube-proxy", i, s)
				}
				addrs[i] = s
				continue
			case "all", "localhost":
				addrs[i] = s
				continue
			}
			p, err := parsePrefix(s)
			if err != nil {
				return fmt.Errorf("nodePortAddresses[%d] %q: want a CIDR, primary, all or localhost: %w", i, s, err)
			}
			addrs[i] = p.String()
		}
		m.set("nodePortAddresses", "nodeport-addresses", strings.Join(addrs, ","))
	}

	// conntrack sets the node's netfilter sysctls in kube-proxy. The
	// timeouts that mean the same in Sluice's own table set it: an
	// answered, open TCP flow's, and a UDP flow's (netfilter's "stream"
	// timeout: Sluice has one for answered and unanswered UDP flows
	// alike, and cutting answered ones to netfilter's unreplied timeout
	// would end idle streams). 0 leaves the default, as in kube-proxy.
	for _, t := range []struct {
		field, flag string
		d           *metav1.Duration
	}{
		{"conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout", c.Conntrack.TCPEstablishedTimeout},
		{"conntrack.udpStreamTimeout", "conntrack-udp-timeout", &c.Conntrack.UDPStreamTimeout},
	} {
		m.applied[t.field] = true
		if t.d != nil && t.d.Duration > 0 { // < 0 was refused by validate
			m.set(t.field, t.flag, t.d.Duration.String())
		}
	}

	if err := m.mapMode(c); err != nil {
		return err
	}

	// featureGates: AllowServiceExternalIPs (GA, default true, not
	// locked) is the one gate that says what Sluice serves: false, as
	// operators set it against CVE-2020-8554, makes kube-proxy program no
	// spec.externalIPs (pkg/proxy/serviceport.go). Given either way, it is
	// applied, so that the log says which. The other gates are reported
	// (why), a gate set to false too: that is a choice, not a default.
	for k := range c.FeatureGates {
		// kube-proxy refuses a gate it does not know, names being
		// case-sensitive: this one misspelt must not leave the
		// externalIPs served with a warning only.
		if k != GateAllowServiceExternalIPs && strings.EqualFold(k, GateAllowServiceExternalIPs) {
			return fmt.Errorf("featureGates.%s: unknown feature gate (kube-proxy's is %s, case-sensitive)", k, GateAllowServiceExternalIPs)
		}
	}
	if v, ok := c.FeatureGates[GateAllowServiceExternalIPs]; ok {
		m.set("featureGates."+GateAllowServiceExternalIPs, "allow-service-external-ips", strconv.FormatBool(v))
	}
	return nil
}

// GateAllowServiceExternalIPs is the one kube-proxy feature gate Sluice
// applies (--allow-service-external-ips).
const GateAllowServiceExternalIPs = "AllowServiceExternalIPs"

// mapMode applies the settings kube-proxy reads from the section of its
// mode: masqueradeAll (iptables.* for iptables and ipvs), the iptables
// localhostNodePorts, and the sync periods (Sluice's Kubernetes source
// runs kube-proxy's bounded-frequency runner under the same names). The
// other sections hold what kube-proxy would not apply either, and are
// reported.
func (m *mapper) mapMode(c *KubeProxyConfiguration) error {
	var masqSection, syncSection string
	var masqAll bool
	var syncPeriod, minSyncPeriod string
	switch c.Mode {
	case "", "iptables": // "" is iptables on Linux
		masqSection, syncSection = "iptables", "iptables"
		masqAll = c.IPTables.MasqueradeAll
		syncPeriod, minSyncPeriod = period(c.IPTables.SyncPeriod.Duration), period(c.IPTables.MinSyncPeriod.Duration)
		m.applied["iptables.localhostNodePorts"] = true
		if l := c.IPTables.LocalhostNodePorts; l != nil {
			m.set("iptables.localhostNodePorts", "localhost-nodeports", strconv.FormatBool(*l))
		}
	case "ipvs":
		masqSection, syncSection = "iptables", "ipvs"
		masqAll = c.IPTables.MasqueradeAll
		syncPeriod, minSyncPeriod = period(c.IPVS.SyncPeriod.Duration), period(c.IPVS.MinSyncPeriod.Duration)
	case "nftables":
		masqSection, syncSection = "nftables", "nftables"
		masqAll = c.NFTables.MasqueradeAll
		syncPeriod, minSyncPeriod = period(c.NFTables.SyncPeriod.Duration), period(c.NFTables.MinSyncPeriod.Duration)
	default: // refused by validate
		return fmt.Errorf("mode %q: want iptables, ipvs or nftables", c.Mode)
	}
	m.applied[masqSection+".masqueradeAll"] = true
	if masqAll {
		m.set(masqSection+".masqueradeAll", "masquerade-all", "true")
	}
	for _, p := range []struct{ field, flag, value string }{
		{syncSection + ".syncPeriod", "sync-period", syncPeriod},
		{syncSection + ".minSyncPeriod", "min-sync-period", minSyncPeriod},
	} {
		m.applied[p.field] = true
		if p.value != "" { // not negative: refused by validate
			m.set(p.field, p.flag, p.value)
		}
	}
	return nil
}

// period is d in the flag's syntax, "" for 0 (the default).
func period(d interface{ String() string }) string {
	if s := d.String(); s != "0s" {
		return s
	}
	return ""
}

// bindAddress completes host[:port] as kube-proxy does (a bare IP gets
// kube-proxy's port) and checks it.
func bindAddress(s, port string) (string, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		a, aerr := parseAddr(strings.Trim(s, "[]"))
		if aerr != nil {
			return "", fmt.Errorf("want IP:port or IP: %w", err)
		}
		return net.JoinHostPort(a.String(), port), nil
	}
	if host != "" {
		a, err := parseAddr(host)
		if err != nil {
			return "", fmt.Errorf("host: %w", err)
		}
		if a.String() != host { // leading zeros: the flag takes the canonical form
			s = net.JoinHostPort(a.String(), p)
		}
	}
	if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("port %q: want 1-65535", p)
	}
	return s, nil
}

// parseAddr parses an IP address as kube-proxy does
// (netutils.ParseIPSloppy: an IPv4 part may have leading zeros, read as
// decimal) into netip's canonical form, which Sluice's flags parse. A
// zone is refused, as by kube-proxy. An address netip refuses and the
// sloppy parser takes is IPv4 (netip takes every IPv6 form), so it is
// unmapped.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, fmt.Errorf("%q: an address with a zone", s)
		}
		return a, nil
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, err
	}
	sloppy, _ := netip.AddrFromSlice(ip) // a parsed net.IP: 4 or 16 bytes
	return sloppy.Unmap(), nil
}

// parsePrefix parses a CIDR as kube-proxy does (netutils.ParseCIDRSloppy,
// leading zeros as in parseAddr) into netip's form, masked.
func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err == nil {
		// Masked, as the sloppy parser below returns it: one form for
		// 10.244.0.1/16 and 010.244.0.1/16.
		return p.Masked(), nil
	}
	_, ipnet, serr := netutils.ParseCIDRSloppy(s)
	if serr != nil {
		return netip.Prefix{}, err
	}
	a, _ := netip.AddrFromSlice(ipnet.IP) // 4 bytes for an IPv4 CIDR
	bits, _ := ipnet.Mask.Size()
	return netip.PrefixFrom(a, bits), nil // ParseCIDRSloppy masks
}

// conntrackSysctls reports the netfilter sysctls kube-proxy would set
// (pkg/proxy/conntrack.SetSysctls) from a conntrack field that no other
// entry reports: one left null, whose kube-proxy default sets one
// (pkg/proxy/apis/config/v1alpha1 defaults), and the two timeouts applied
// to Sluice's own table (tcpEstablishedTimeout, udpStreamTimeout), which
// kube-proxy would also have written to the sysctl. Sluice sets no
// sysctl, so after kube-proxy the node keeps the kernel's values (after a
// reboot, or on a new node) while netfilter still tracks every flow. A
// field set and not applied (maxPerCore, tcpCloseWaitTimeout, udpTimeout,
// tcpBeLiberal) has its own entry, whose reason names its sysctl. One
// entry for these: kubeadm's file leaves three of them null.
func conntrackSysctls(c *KubeProxyConntrackConfiguration) (Ignored, bool) {
	var fields, sysctls []string
	if c.MaxPerCore == nil {
		fields = append(fields, `"maxPerCore":null`)
		minimum := "131072"
		if c.Min != nil {
			minimum = strconv.Itoa(int(*c.Min))
		}
		sysctls = append(sysctls, "nf_conntrack_max 32768 x cores (at least "+minimum+", at most 1048576)")
	}
	if c.TCPCloseWaitTimeout == nil {
		fields = append(fields, `"tcpCloseWaitTimeout":null`)
		sysctls = append(sysctls, "nf_conntrack_tcp_timeout_close_wait 3600 (the kernel's 60)")
	}
	switch t := c.TCPEstablishedTimeout; {
	case t == nil:
		fields = append(fields, `"tcpEstablishedTimeout":null`)
		sysctls = append(sysctls, "nf_conntrack_tcp_timeout_established 86400 (the kernel's 432000; Sluice's own table: --conntrack-tcp-timeout, 6h)")
	case t.Duration > 0:
		fields = append(fields, `"tcpEstablishedTimeout":"`+t.Duration.String()+`"`)
		sysctls = append(sysctls, fmt.Sprintf("nf_conntrack_tcp_timeout_established %d (the kernel's 432000; applied to Sluice's own table only, --conntrack-tcp-timeout)", int(t.Duration/time.Second)))
	}
	if t := c.UDPStreamTimeout.Duration; t > 0 {
		fields = append(fields, `"udpStreamTimeout":"`+t.String()+`"`)
		sysctls = append(sysctls, fmt.Sprintf("nf_conntrack_udp_timeout_stream %d (the kernel's 120; applied to Sluice's own table only, --conntrack-udp-timeout)", int(t/time.Second)))
	}
	if len(fields) == 0 {
		return Ignored{}, false
	}
	return Ignored{
		Field: "conntrack",
		Value: "{" + strings.Join(fields, ",") + "}",
		Why: "kube-proxy would set the node's netfilter sysctls, which Sluice leaves at the kernel's: " + strings.Join(sysctls, ", ") +
			"; keep them in /etc/sysctl.d (deploy/README.md)",
	}, true
}

// otherMode is the reason for a field of another mode's section.
const otherMode = "<other mode>"

// why says why a known field is not applied; the longest matching
// prefix of the field's path wins.
var why = map[string]string{
	"featureGates":                "Sluice applies one of kube-proxy's feature gates, AllowServiceExternalIPs (--allow-service-external-ips); the others do not configure it",
	"logging":                     "Sluice logs with log/slog at --log-level",
	"showHiddenMetricsForVersion": "Sluice has no hidden metrics",
	"mode":                        "Sluice is its own (eBPF) datapath: the mode only says which section's masqueradeAll, localhostNodePorts and sync periods apply",
	"iptables":                    otherMode,
	"nftables":                    otherMode,
	"ipvs":                        otherMode,
	"iptables.masqueradeBit":      "Sluice marks no packets: its NAT is done in its own programs",
	"nftables.masqueradeBit":      "Sluice marks no packets: its NAT is done in its own programs",
	"iptables.snatNodeInternalIP": "Sluice source-NATs to the --node-ip addresses (by default the Node object's) whatever this says",
	"ipvs.scheduler":              "Sluice has no IPVS mode: it picks endpoints at random, as the iptables mode",
	"ipvs.excludeCIDRs":           "Sluice has no IPVS mode",
	"ipvs.strictARP":              "Sluice has no IPVS mode",
	"ipvs.tcpTimeout":             "Sluice has no IPVS mode",
	"ipvs.tcpFinTimeout":          "Sluice has no IPVS mode",
	"ipvs.udpTimeout":             "Sluice has no IPVS mode",
	"winkernel":                   "Windows only",
	"windowsRunAsService":         "Windows only",
	"detectLocal":                 "read by detectLocalMode BridgeInterface and InterfaceNamePrefix only, which Sluice does not have (kube-proxy ignores it in the other modes too)",
	"oomScoreAdj":                 "Sluice leaves its OOM score to the pod's resources",
	"conntrack":                   "sets the node's netfilter conntrack sysctls: Sluice tracks Service flows in its own tables and leaves the sysctls alone",
	"configSyncPeriod":            "Sluice's informers do not resync; --resync-interval re-applies the datapath",
	"portRange":                   "unused by kube-proxy too (the userspace proxy is gone)",
	"clientConnection":            "Sluice's client speaks protobuf, with a burst of twice --kube-api-qps",

	// The conntrack fields that have no counterpart in Sluice's own table
	// (the timeouts that do are applied, see mapFields).
	"conntrack.maxPerCore":          "kube-proxy sizes the node's nf_conntrack_max from it (keep it in /etc/sysctl.d, deploy/README.md); that table holds all of the node's flows: Sluice's holds Service flows only, sized by --max-conntrack",
	"conntrack.min":                 "kube-proxy sizes the node's nf_conntrack_max from it (keep it in /etc/sysctl.d, deploy/README.md); that table holds all of the node's flows: Sluice's holds Service flows only, sized by --max-conntrack",
	"conntrack.tcpCloseWaitTimeout": "kube-proxy sets the node's nf_conntrack_tcp_timeout_close_wait from it (keep it in /etc/sysctl.d, deploy/README.md); Sluice keeps a half-closed flow as an open one (conntrack.tcpEstablishedTimeout, --conntrack-tcp-timeout)",
	"conntrack.udpTimeout":          "kube-proxy sets the node's nf_conntrack_udp_timeout (unanswered UDP flows) from it (keep it in /etc/sysctl.d, deploy/README.md); Sluice has one UDP timeout, answered or not, set by conntrack.udpStreamTimeout (--conntrack-udp-timeout)",
	"conntrack.tcpBeLiberal":        "kube-proxy sets the node's nf_conntrack_tcp_be_liberal to 1 (keep it in /etc/sysctl.d, deploy/README.md); Sluice does not track TCP windows",
}

// collectIgnored reports the leaves of v (the file, decoded generically;
// t its Go type) that were not applied and hold a value other than their
// zero. For a pointer field only null is zero: kube-proxy tells an
// explicit false or 0 there from unset. conntrack's are the exception:
// 0 there tells kube-proxy to leave the node's sysctl alone, as Sluice
// does (kind writes maxPerCore: 0).
func (m *mapper) collectIgnored(v any, t reflect.Type, path string, c *KubeProxyConfiguration) {
	if m.applied[path] {
		return
	}
	if obj, ok := v.(map[string]any); ok && len(obj) > 0 {
		fields := map[string]reflect.Type{}
		if t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		for k, e := range obj {
			ft, ok := fields[k]
			if !ok {
				ft = t.Elem() // a map's value (checkFields refused unknown fields)
			}
			m.collectIgnored(e, ft, join(path, k), c)
		}
		return
	}
	// A feature gate set to false is reported: a gate's default is its
	// own (true for many), not the zero value.
	if v == nil || (t.Kind() != reflect.Pointer || strings.HasPrefix(path, "conntrack.")) && !strings.HasPrefix(path, "featureGates.") && isZero(v) {
		return
	}
	value, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v) // a generically decoded JSON value: always marshals
		value = string(b)
	}
	reason, best := "not applied", -1
	for p, r := range why {
		if (path == p || strings.HasPrefix(path, p+".")) && len(p) > best {
			reason, best = r, len(p)
		}
	}
	if reason == otherMode {
		mode := c.Mode
		if mode == "" {
			mode = "iptables (the default)"
		}
		reason = "not the section of mode " + mode
	}
	m.res.Ignored = append(m.res.Ignored, Ignored{Field: path, Value: value, Why: reason})
}

// isZero reports whether a generically decoded value asks for nothing:
// null, false, 0, "", "0" (a quantity), "0s" (a duration), or empty.
func isZero(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case float64:
		return v == 0
	case string:
		return v == "" || v == "0" || v == "0s"
	case []any:
		return len(v) == 0
	case map[string]any:
		for _, e := range v {
			if !isZero(e) {
				return false
			}
		}
		return true
	}
	return false
}
