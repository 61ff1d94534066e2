package runner

import (
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sluice-lb/sluice/test/flows"
)

// settingFlag turns one of a case's node settings into an agent flag.
type settingFlag struct {
	// Setting is the corpus's name for it (README "Format").
	Setting string
	// Flag is the agent's flag.
	Flag string
	// Value returns the flag's value, ok false when the flag is not passed
	// (the setting is at the agent's default: no zone, no cluster CIDR...).
	Value func(n *flows.Node) (v string, ok bool)
}

// settingFlags is the one place that says which agent flag carries which
// node setting. --node-name and --node-ip exist; the others are issue 9's,
// named here as that implementers are asked to name them. A flag
// the agent does not know is dropped (see unsupported) and every flow of
// the case says so in the report.
var settingFlags = []settingFlag{
	{"name", "--node-name", func(n *flows.Node) (string, bool) { return n.Name, true }},
	{"ips", "--node-ip", func(n *flows.Node) (string, bool) { return joinAddrs(n.IPs), len(n.IPs) > 0 }},
	{"zone", "--node-zone", func(n *flows.Node) (string, bool) { return n.Zone, n.Zone != "" }},
	{"clusterCIDR", "--cluster-cidr", func(n *flows.Node) (string, bool) { return n.ClusterCIDR.String(), n.ClusterCIDR.IsValid() }},
	{"serviceCIDR", "--service-cidr", func(n *flows.Node) (string, bool) { return n.ServiceCIDR.String(), n.ServiceCIDR.IsValid() }},
	{"nodePortAddresses", "--nodeport-addresses", func(n *flows.Node) (string, bool) {
		return joinPrefixes(n.NodePortAddresses), len(n.NodePortAddresses) > 0
	}},
	// kube-proxy's default is on: pass it either way, so that "off" is
	// never left to a default.
	{"localhostNodePorts", "--localhost-nodeports", func(n *flows.Node) (string, bool) {
		return strconv.FormatBool(n.LocalhostNodePorts), true
	}},
	// Off is kube-proxy's default and the issue's: pass it only when on.
	{"masqueradeAll", "--masquerade-all", func(n *flows.Node) (string, bool) { return "true", n.MasqueradeAll }},
}

// settingArgs returns the agent arguments for n's settings, leaving out
// the flags in drop, and the flags it left out for that reason.
func settingArgs(n *flows.Node, drop func(flag string) bool) (args, dropped []string) {
	for _, s := range settingFlags {
		v, ok := s.Value(n)
		if !ok {
			continue
		}
		if drop(s.Flag) {
			dropped = append(dropped, s.Flag)
			continue
		}
		args = append(args, s.Flag+"="+v)
	}
	return args, dropped
}

func joinAddrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func joinPrefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// unknownFlagRE matches the flag package's complaint about a flag it does
// not define (the agent then exits with its usage).
var unknownFlagRE = regexp.MustCompile(`flag provided but not defined: -+([A-Za-z0-9][A-Za-z0-9._-]*)`)

// unknownFlag returns the settings flag an agent's output says it does not
// define, or "".
func unknownFlag(output string) string {
	m := unknownFlagRE.FindStringSubmatch(output)
	if m == nil {
		return ""
	}
	flag := "--" + m[1]
	if !slices.ContainsFunc(settingFlags, func(s settingFlag) bool { return s.Flag == flag }) {
		return ""
	}
	return flag
}

// unsupported remembers, for the whole run, the settings flags the agent
// refused, so later cases drop them before starting it.
var unsupported = struct {
	sync.Mutex
	flags map[string]bool
}{flags: map[string]bool{}}

func isUnsupported(flag string) bool {
	unsupported.Lock()
	defer unsupported.Unlock()
	return unsupported.flags[flag]
}

func markUnsupported(flag string) {
	unsupported.Lock()
	defer unsupported.Unlock()
	unsupported.flags[flag] = true
}
