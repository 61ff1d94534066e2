// Package flows loads and validates Sluice's packet-flow corpus: the YAML
// files under this directory that say, for a node's settings and a set of
// Services and EndpointSlices, what must happen to a packet from a given
// source to a given destination (which endpoints it may reach and whether it
// is masqueraded, or that it is rejected, dropped, left untouched or answered
// by the health-check server).
//
// The corpus is data, not a test runner. Most of it is ported flow for flow
// from kube-proxy's own packet-flow tables (runPacketFlowTests in
// pkg/proxy/{nftables,iptables}/proxier_test.go, v1.36.3) and from
// TestCategorizeEndpoints (pkg/proxy/topology_test.go); the rest (extras/)
// derives from kube-proxy's code where its tests have no flow table (session
// affinity, topology, ipMode Proxy, health checks). Every case keeps where it
// came from, so a reader can put it next to the kube-proxy test it ports.
// README.md describes the format; Load is the only way in, and it refuses a
// corpus that is not internally consistent (objects that do not decode as
// Kubernetes objects, expected endpoints that no EndpointSlice holds, names
// that repeat, deviations from kube-proxy that do not say what kube-proxy
// expects), so a runner can trust what it gets.
package flows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// KubeProxyVersion is the kube-proxy release the ported cases were read from.
const KubeProxyVersion = "v1.36.3"

// Modes of kube-proxy whose tests a flow comes from.
const (
	ModeNFTables = "nftables"
	ModeIPTables = "iptables"
)

// Verdicts other than "reaches one of these endpoints".
const (
	// VerdictReject: the node answers ICMP port unreachable (TCP connect
	// fails at once with ECONNREFUSED).
	VerdictReject = "REJECT"
	// VerdictDrop: the packet vanishes (a TCP connect times out).
	VerdictDrop = "DROP"
	// VerdictUntouched: the proxy neither translates, drops nor rejects the
	// packet; it reaches its original destination with its original source
	// (kube-proxy's tracer output "").
	VerdictUntouched = "UNTOUCHED"
	// VerdictHealthCheck: the agent's health-check server for the Service
	// whose healthCheckNodePort is the destination port answers HTTP there
	// (kube-proxy's iptables tracer output "ACCEPT" for that port).
	VerdictHealthCheck = "HEALTHCHECK"
)

// Source kinds: where the runner puts the client.
const (
	// SourcePod is a pod on this node (its own network namespace behind the
	// node). If its address is an endpoint's, it is that endpoint's pod.
	SourcePod = "pod"
	// SourceRemotePod is a pod on another node; its packet reaches this
	// node over the node network, untranslated by its own node.
	SourceRemotePod = "remotePod"
	// SourceExternal is a host outside the cluster, behind a router. When
	// its address is not one a host can own (a LoadBalancer IP, as in
	// kube-proxy's "SNATted to LB" flows), the router source-NATs to it.
	SourceExternal = "external"
	// SourceNode is a process in the node's own network namespace, its
	// socket bound to the given node address.
	SourceNode = "node"
	// SourceLocalhost is a process in the node's own network namespace
	// talking to a loopback address (its socket is not bound).
	SourceLocalhost = "localhost"
)

// Placements: where an address lives in the test topology.
const (
	PlaceLocal    = "local"    // a pod on this node
	PlaceRemote   = "remote"   // a pod on another node
	PlaceExternal = "external" // a host behind the router (a sink for UNTOUCHED flows)
)

// Affinity expectations for flows to Services with sessionAffinity ClientIP.
const (
	// AffinitySticky: every connection of the flow reaches the same one of
	// the expected endpoints.
	AffinitySticky = "sticky"
	// AffinityExpires: sticky within a burst of connections, but after the
	// client stays idle for longer than the Service's timeout the choice is
	// made afresh; over repeated idle-then-connect rounds the client reaches
	// more than one of the expected endpoints.
	AffinityExpires = "expires"
)

// Corpus is every case of every file, variants expanded.
type Corpus struct {
	Cases        []*Case
	Translations []*Translation
}

// Origin names the kube-proxy test a case ports.
type Origin struct {
	// File is relative to the kubernetes repository, e.g.
	// pkg/proxy/nftables/proxier_test.go.
	File    string `json:"file"`
	Test    string `json:"test"`
	Subtest string `json:"subtest,omitempty"`
	// Line is where the test or subtest is defined in KubeProxyVersion.
	Line int    `json:"line,omitempty"`
	Note string `json:"note,omitempty"`
}

// Mode is the kube-proxy mode whose tests File holds, or "" (topology_test.go).
func (o Origin) Mode() string {
	switch {
	case strings.HasPrefix(o.File, "pkg/proxy/nftables/"):
		return ModeNFTables
	case strings.HasPrefix(o.File, "pkg/proxy/iptables/"):
		return ModeIPTables
	}
	return ""
}

// Node is a case's node settings, fully resolved.
type Node struct {
	Name string
	// Zone is the Node's topology.kubernetes.io/zone label ("" if none).
	Zone string
	// IPs are the Node's primary addresses (kube-proxy's nodeIP, Sluice's
	// --node-ip).
	IPs []netip.Addr
	// Addresses are every address on the node's interfaces besides
	// loopback; the runner assigns them all.
	Addresses []netip.Prefix
	// ClusterCIDR is what counts as a pod address (kube-proxy's local
	// traffic detector). Invalid (zero) means no detector at all.
	ClusterCIDR netip.Prefix
	// ServiceCIDR, if valid, makes unallocated addresses in it drop
	// (kube-proxy nftables mode).
	ServiceCIDR netip.Prefix
	// NodePortAddresses is --nodeport-addresses as written; 0.0.0.0/0
	// means every address of the node (kube-proxy's iptables default).
	NodePortAddresses []netip.Prefix
	// LocalhostNodePorts is kube-proxy's --iptables-localhost-nodeports:
	// NodePorts answer on 127.0.0.1 when NodePortAddresses covers it.
	LocalhostNodePorts bool
	// MasqueradeAll is --masquerade-all.
	MasqueradeAll bool
}

// IsNodeAddress says whether a is one of the node's own addresses.
func (n *Node) IsNodeAddress(a netip.Addr) bool {
	return slices.ContainsFunc(n.Addresses, func(p netip.Prefix) bool { return p.Addr() == a })
}

// Object is one Service or EndpointSlice, as written in the case.
type Object struct {
	// Raw is the object as JSON.
	Raw     json.RawMessage
	Service *corev1.Service
	Slice   *discoveryv1.EndpointSlice
}

// ObjectRef names an object.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (r ObjectRef) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// Ref is the object's kind, namespace and name.
func (o Object) Ref() ObjectRef {
	if o.Service != nil {
		return ObjectRef{"Service", o.Service.Namespace, o.Service.Name}
	}
	return ObjectRef{"EndpointSlice", o.Slice.Namespace, o.Slice.Name}
}

// Manifest renders objects as one multi-document YAML file, the form
// `sluice --manifests` reads. No objects is a comment, not an empty file:
// the agent takes an empty file for one caught mid-write and keeps what
// it last defined (pkg/source/manifest).
func Manifest(objs []Object) ([]byte, error) {
	var b bytes.Buffer
	if len(objs) == 0 {
		return []byte("# no objects\n"), nil
	}
	for i, o := range objs {
		y, err := yaml.JSONToYAML(o.Raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.Ref(), err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// Case is one node configuration and object set with its flows.
type Case struct {
	// File is the YAML file, relative to the corpus directory.
	File string
	// Name is unique in the corpus: <file without .yaml>/<case>[/<variant>].
	Name    string
	Variant string
	// KubeProxy lists the kube-proxy tests the case ports (empty for
	// derived cases).
	KubeProxy []Origin
	// Derived, if set, says that the case is not a kube-proxy flow table
	// and what it derives from.
	Derived  string
	IPFamily corev1.IPFamily
	Node     Node
	// Placement says where each endpoint address (and each non-node
	// destination of an UNTOUCHED flow) lives.
	Placement map[netip.Addr]string
	// Objects are in effect before the first step.
	Objects []Object
	Steps   []*Step
	Comment string
}

// Modes are the kube-proxy modes whose tests the case ports.
func (c *Case) Modes() []string {
	var m []string
	for _, o := range c.KubeProxy {
		if mode := o.Mode(); mode != "" && !slices.Contains(m, mode) {
			m = append(m, mode)
		}
	}
	slices.Sort(m)
	return m
}

// Step is a change to the objects (or to the agent), then flows to check.
type Step struct {
	Name  string
	Apply []Object
	// Delete removes objects before Apply runs.
	Delete []ObjectRef
	// RestartAgent restarts the agent (after the object changes, before
	// the flows); state it keeps must survive.
	RestartAgent bool
	Flows        []*Flow
	objects      []Object
}

// Objects are the objects in effect during the step's flows.
func (s *Step) Objects() []Object { return s.objects }

// Source is a flow's client.
type Source struct {
	Kind string     `json:"kind"`
	IP   netip.Addr `json:"ip"`
}

// Destination is where the client sends.
type Destination struct {
	IP   netip.Addr `json:"ip"`
	Port uint16     `json:"port"`
}

// Masquerade says whether an endpoint sees a node address (true) or the
// client's own address (false) as the source.
type Masquerade int

const (
	MasqueradeUnset Masquerade = iota
	MasqueradeNo
	MasqueradeYes
	// MasqueradeRemote: masqueraded exactly when the chosen endpoint is on
	// another node (Sluice's deliberate deviation for external traffic to
	// ExternalTrafficPolicy=Cluster frontends).
	MasqueradeRemote
)

func (m Masquerade) String() string {
	return [...]string{"unset", "false", "true", "remote"}[m]
}

// UnmarshalJSON accepts true, false or "remote".
func (m *Masquerade) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*m = MasqueradeYes
	case "false":
		*m = MasqueradeNo
	case `"remote"`:
		*m = MasqueradeRemote
	default:
		return fmt.Errorf("masquerade: want true, false or \"remote\", got %s", b)
	}
	return nil
}

// Expect is what must happen to a flow: reach one of Endpoints (masqueraded
// or not), or Verdict.
type Expect struct {
	Endpoints  []netip.AddrPort `json:"endpoints,omitempty"`
	Masquerade Masquerade       `json:"masquerade,omitempty"`
	// Affinity is "", AffinitySticky or AffinityExpires. Without it, the
	// runner must see every expected endpoint reached (and no other).
	Affinity string `json:"affinity,omitempty"`
	Verdict  string `json:"verdict,omitempty"`
	// LocalEndpoints, for VerdictHealthCheck, is the count the health-check
	// server reports (200 if above zero, else 503).
	LocalEndpoints *int `json:"localEndpoints,omitempty"`
}

func (e Expect) String() string {
	if e.Verdict != "" {
		if e.LocalEndpoints != nil {
			return fmt.Sprintf("%s(localEndpoints=%d)", e.Verdict, *e.LocalEndpoints)
		}
		return e.Verdict
	}
	s := fmt.Sprintf("%v masquerade=%v", e.Endpoints, e.Masquerade)
	if e.Affinity != "" {
		s += " affinity=" + e.Affinity
	}
	return s
}

// Equal compares expectations, endpoints as sets.
func (e Expect) Equal(o Expect) bool {
	a, b := slices.Clone(e.Endpoints), slices.Clone(o.Endpoints)
	slices.SortFunc(a, netip.AddrPort.Compare)
	slices.SortFunc(b, netip.AddrPort.Compare)
	eq := func(x, y *int) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return slices.Equal(a, b) && e.Masquerade == o.Masquerade && e.Affinity == o.Affinity &&
		e.Verdict == o.Verdict && eq(e.LocalEndpoints, o.LocalEndpoints)
}

// FlowOrigin is a flow's kube-proxy provenance.
type FlowOrigin struct {
	// Modes whose tests carry the flow; default: the case's modes.
	Modes []string `json:"modes,omitempty"`
	// NFTablesName and IPTablesName are kube-proxy's names for the flow
	// where they differ from the flow's Name.
	NFTablesName string `json:"nftablesName,omitempty"`
	IPTablesName string `json:"iptablesName,omitempty"`
	// NFTables and IPTables are kube-proxy's expectations where they differ
	// from Expect. IPTables defaults to NFTables.
	NFTables *Expect `json:"nftables,omitempty"`
	IPTables *Expect `json:"iptables,omitempty"`
}

// Flow is one packet (or connection) and what must happen to it.
type Flow struct {
	Name        string
	Source      Source
	Protocol    corev1.Protocol
	Destination Destination
	Expect      Expect
	KubeProxy   FlowOrigin
	// Deviation, if set, says why Sluice deliberately answers differently
	// from kube-proxy (whose answer KubeProxy holds).
	Deviation string
	// Skip, if set, says why runners skip the flow.
	Skip    string
	Comment string
}

// KubeProxyExpect is what kube-proxy's mode expects, ok false if the flow
// is not in that mode's tests.
func (f *Flow) KubeProxyExpect(mode string) (Expect, bool) {
	if !slices.Contains(f.KubeProxy.Modes, mode) {
		return Expect{}, false
	}
	nft := f.Expect
	if f.KubeProxy.NFTables != nil {
		nft = *f.KubeProxy.NFTables
	}
	if mode == ModeNFTables {
		return nft, true
	}
	if f.KubeProxy.IPTables != nil {
		return *f.KubeProxy.IPTables, true
	}
	if slices.Contains(f.KubeProxy.Modes, ModeNFTables) {
		return nft, true
	}
	return f.Expect, true
}

// Translation is a translation-level case: a Service and its slices as seen
// by one node, and the endpoints kube-proxy's CategorizeEndpoints picks.
type Translation struct {
	File      string
	Name      string
	KubeProxy []Origin
	Node      Node
	Objects   []Object
	Expect    TranslationExpect
	Skip      string
	Comment   string
}

// TranslationExpect holds CategorizeEndpoints' results. A nil list means
// the Service never uses that policy's endpoints; an empty one, that it
// does but has none.
type TranslationExpect struct {
	Cluster         []netip.AddrPort `json:"cluster"`
	Local           []netip.AddrPort `json:"local"`
	All             []netip.AddrPort `json:"all"`
	HasAnyEndpoints bool             `json:"hasAnyEndpoints"`
}

// The YAML forms. Pointers tell "not written" from a zero value, so that a
// case's node settings override only what they name.

type fileSpec struct {
	Comment      string            `json:"comment,omitempty"`
	Node         nodeSpec          `json:"node"`
	Cases        []caseSpec        `json:"cases"`
	Translations []translationSpec `json:"translations"`
}

type nodeSpec struct {
	Name               *string        `json:"name"`
	Zone               *string        `json:"zone"`
	IPs                []netip.Addr   `json:"ips"`
	Addresses          []netip.Prefix `json:"addresses"`
	ClusterCIDR        *netip.Prefix  `json:"clusterCIDR"`
	ServiceCIDR        *netip.Prefix  `json:"serviceCIDR"`
	NodePortAddresses  []netip.Prefix `json:"nodePortAddresses"`
	LocalhostNodePorts *bool          `json:"localhostNodePorts"`
	MasqueradeAll      *bool          `json:"masqueradeAll"`
}

type caseSpec struct {
	Name      string                `json:"name"`
	KubeProxy []Origin              `json:"kubeProxy"`
	Derived   string                `json:"derived"`
	IPFamily  corev1.IPFamily       `json:"ipFamily"`
	Node      nodeSpec              `json:"node"`
	Placement map[netip.Addr]string `json:"placement"`
	Objects   []json.RawMessage     `json:"objects"`
	Flows     []flowSpec            `json:"flows"`
	Steps     []stepSpec            `json:"steps"`
	Variants  []variantSpec         `json:"variants"`
	Comment   string                `json:"comment"`
}

type stepSpec struct {
	Name         string            `json:"name"`
	Apply        []json.RawMessage `json:"apply"`
	Delete       []ObjectRef       `json:"delete"`
	RestartAgent bool              `json:"restartAgent"`
	Flows        []flowSpec        `json:"flows"`
}

type flowSpec struct {
	Name        string          `json:"name"`
	Source      Source          `json:"source"`
	Protocol    corev1.Protocol `json:"protocol"`
	Destination Destination     `json:"destination"`
	Expect      Expect          `json:"expect"`
	KubeProxy   FlowOrigin      `json:"kubeProxy"`
	Deviation   string          `json:"deviation"`
	Skip        string          `json:"skip"`
	Comment     string          `json:"comment"`
}

// overrideSpec replaces a flow's whole expectation block in one variant.
type overrideSpec struct {
	Expect    Expect     `json:"expect"`
	KubeProxy FlowOrigin `json:"kubeProxy"`
	Deviation string     `json:"deviation"`
	Comment   string     `json:"comment"`
}

type variantSpec struct {
	Name      string                  `json:"name"`
	KubeProxy []Origin                `json:"kubeProxy"`
	Node      nodeSpec                `json:"node"`
	Overrides map[string]overrideSpec `json:"overrides"`
	Comment   string                  `json:"comment"`
}

type translationSpec struct {
	Name      string            `json:"name"`
	KubeProxy []Origin          `json:"kubeProxy"`
	Node      nodeSpec          `json:"node"`
	Objects   []json.RawMessage `json:"objects"`
	Expect    TranslationExpect `json:"expect"`
	Skip      string            `json:"skip"`
	Comment   string            `json:"comment"`
}

// Load reads every *.yaml file under dir (recursively, testdata aside),
// expands variants and validates the whole corpus. The error lists every problem found.
func Load(dir string) (*Corpus, error) {
	return LoadFS(os.DirFS(dir))
}

// LoadFS is Load over a file system.
func LoadFS(fsys fs.FS) (*Corpus, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		// testdata holds the fixtures of this package's tests and of
		// the runner's, cases made to be wrong or partial: no corpus.
		if err == nil && d.IsDir() && d.Name() == "testdata" {
			return fs.SkipDir
		}
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list corpus: %w", err)
	}
	if len(files) == 0 {
		return nil, errors.New("no *.yaml files in the corpus")
	}
	c := &Corpus{}
	var errs []error
	names := map[string]bool{}
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		var spec fileSpec
		j, err := yaml.YAMLToJSONStrict(data)
		if err == nil {
			err = decodeStrict(j, &spec)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		if len(spec.Cases) == 0 && len(spec.Translations) == 0 {
			errs = append(errs, fmt.Errorf("%s: no cases and no translations", f))
		}
		stem := strings.TrimSuffix(f, ".yaml")
		for i := range spec.Cases {
			cases, err := buildCase(f, stem, spec.Node, &spec.Cases[i])
			if err != nil {
				errs = append(errs, err)
			}
			for _, cs := range cases {
				if names[cs.Name] {
					errs = append(errs, fmt.Errorf("%s: case %q: name used twice", f, cs.Name))
				}
				names[cs.Name] = true
				c.Cases = append(c.Cases, cs)
			}
		}
		for i := range spec.Translations {
			tr, err := buildTranslation(f, stem, spec.Node, &spec.Translations[i])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if names[tr.Name] {
				errs = append(errs, fmt.Errorf("%s: translation %q: name used twice", f, tr.Name))
			}
			names[tr.Name] = true
			c.Translations = append(c.Translations, tr)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// resolveNode merges the case's settings over the file's and checks them.
func resolveNode(file, over nodeSpec) (Node, error) {
	n := Node{
		Name:               pick(file.Name, over.Name),
		Zone:               pick(file.Zone, over.Zone),
		IPs:                orElse(over.IPs, file.IPs),
		Addresses:          orElse(over.Addresses, file.Addresses),
		ClusterCIDR:        pick(file.ClusterCIDR, over.ClusterCIDR),
		ServiceCIDR:        pick(file.ServiceCIDR, over.ServiceCIDR),
		NodePortAddresses:  orElse(over.NodePortAddresses, file.NodePortAddresses),
		LocalhostNodePorts: pick(file.LocalhostNodePorts, over.LocalhostNodePorts),
		MasqueradeAll:      pick(file.MasqueradeAll, over.MasqueradeAll),
	}
	if n.Name == "" {
		return n, errors.New("node: name is required")
	}
	for _, ip := range n.IPs {
		if !n.IsNodeAddress(ip) {
			return n, fmt.Errorf("node: ip %s is not among its addresses", ip)
		}
	}
	for _, p := range n.Addresses {
		if p.Addr().IsLoopback() {
			return n, fmt.Errorf("node: address %s: loopback is implied, do not list it", p)
		}
	}
	return n, nil
}

// pick is over's value if written, else file's, else the zero value.
func pick[T any](file, over *T) (v T) {
	if over != nil {
		return *over
	}
	if file != nil {
		return *file
	}
	return v
}

// orElse is over if written, else file.
func orElse[T any](over, file []T) []T {
	if over != nil {
		return over
	}
	return file
}

// decodeObjects decodes objects strictly as a Service (v1) or an
// EndpointSlice (discovery.k8s.io/v1).
func decodeObjects(raws []json.RawMessage) ([]Object, error) {
	var objs []Object
	var errs []error
	for i, raw := range raws {
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(raw, &tm); err != nil {
			errs = append(errs, fmt.Errorf("object %d: %w", i+1, err))
			continue
		}
		o := Object{Raw: raw}
		var err error
		switch {
		case tm.APIVersion == "v1" && tm.Kind == "Service":
			o.Service = &corev1.Service{}
			err = decodeStrict(raw, o.Service)
			if err == nil && (o.Service.Name == "" || o.Service.Namespace == "") {
				err = errors.New("name and namespace are required")
			}
		case tm.APIVersion == "discovery.k8s.io/v1" && tm.Kind == "EndpointSlice":
			o.Slice = &discoveryv1.EndpointSlice{}
			err = decodeStrict(raw, o.Slice)
			if err == nil && (o.Slice.Name == "" || o.Slice.Namespace == "") {
				err = errors.New("name and namespace are required")
			}
			if err == nil && o.Slice.Labels[discoveryv1.LabelServiceName] == "" {
				err = fmt.Errorf("label %s is required", discoveryv1.LabelServiceName)
			}
		default:
			err = fmt.Errorf("want a v1 Service or a discovery.k8s.io/v1 EndpointSlice, got %s %s", tm.APIVersion, tm.Kind)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("object %d: %w", i+1, err))
			continue
		}
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

// decodeStrict decodes a Kubernetes object as the API server does: field
// names match case-sensitively (encoding/json would take "clusterIp" for
// clusterIP), and unknown or repeated fields are errors.
func decodeStrict(raw []byte, obj any) error {
	strict, err := sigsjson.UnmarshalStrict(raw, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// buildCase turns one case of a file into one Case per variant.
func buildCase(file, stem string, fileNode nodeSpec, cs *caseSpec) ([]*Case, error) {
	fail := func(err error) ([]*Case, error) {
		return nil, fmt.Errorf("%s: case %q: %w", file, cs.Name, err)
	}
	if cs.Name == "" {
		return fail(errors.New("name is required"))
	}
	if (len(cs.KubeProxy) == 0) == (cs.Derived == "") {
		return fail(errors.New("exactly one of kubeProxy (the tests it ports) and derived (what it derives from) is required"))
	}
	if len(cs.Flows) == 0 && len(cs.Steps) == 0 {
		return fail(errors.New("no flows"))
	}
	objs, err := decodeObjects(cs.Objects)
	if err != nil {
		return fail(err)
	}
	family := cs.IPFamily
	if family == "" {
		family = corev1.IPv4Protocol
	}
	if family != corev1.IPv4Protocol && family != corev1.IPv6Protocol {
		return fail(fmt.Errorf("ipFamily %q", family))
	}
	steps := cs.Steps
	if len(cs.Flows) > 0 {
		steps = append([]stepSpec{{Name: "initial", Flows: cs.Flows}}, steps...)
	}

	variants := cs.Variants
	if len(variants) == 0 {
		variants = []variantSpec{{}}
	}
	var out []*Case
	var errs []error
	for _, v := range variants {
		name := stem + "/" + cs.Name
		if v.Name != "" {
			name += "/" + v.Name
		}
		c := &Case{
			File: file, Name: name, Variant: v.Name, Derived: cs.Derived, IPFamily: family,
			KubeProxy: append(slices.Clone(cs.KubeProxy), v.KubeProxy...),
			Placement: cs.Placement, Objects: objs, Comment: strings.TrimSpace(cs.Comment + "\n" + v.Comment),
		}
		node, err := resolveNode(fileNode, cs.Node)
		if err == nil {
			node, err = resolveNode(toSpec(node), v.Node)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: case %q: %w", file, name, err))
			continue
		}
		c.Node = node
		used := map[string]bool{}
		current := slices.Clone(objs)
		for _, ss := range steps {
			st := &Step{Name: ss.Name, Delete: ss.Delete, RestartAgent: ss.RestartAgent}
			if st.Apply, err = decodeObjects(ss.Apply); err != nil {
				errs = append(errs, fmt.Errorf("%s: case %q: step %q: %w", file, name, ss.Name, err))
				continue
			}
			current, err = applyStep(current, st)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: case %q: step %q: %w", file, name, ss.Name, err))
			}
			st.objects = current
			for _, fs := range ss.Flows {
				f := &Flow{
					Name: fs.Name, Source: fs.Source, Protocol: fs.Protocol, Destination: fs.Destination,
					Expect: fs.Expect, KubeProxy: fs.KubeProxy, Deviation: fs.Deviation, Skip: fs.Skip,
					Comment: strings.TrimSpace(fs.Comment),
				}
				if o, ok := v.Overrides[fs.Name]; ok {
					used[fs.Name] = true
					if o.Expect.Equal(fs.Expect) {
						errs = append(errs, fmt.Errorf("%s: case %q: override of %q expects what the flow already does", file, name, fs.Name))
					}
					f.Expect, f.Deviation = o.Expect, o.Deviation
					f.KubeProxy.NFTables, f.KubeProxy.IPTables = o.KubeProxy.NFTables, o.KubeProxy.IPTables
					f.Comment = strings.TrimSpace(f.Comment + "\n" + v.Name + ": " + o.Comment)
				}
				if f.Protocol == "" {
					f.Protocol = corev1.ProtocolTCP
				}
				if f.KubeProxy.Modes == nil {
					f.KubeProxy.Modes = c.Modes()
				}
				st.Flows = append(st.Flows, f)
			}
			c.Steps = append(c.Steps, st)
		}
		for o := range v.Overrides {
			if !used[o] {
				errs = append(errs, fmt.Errorf("%s: case %q: override of %q names no flow", file, name, o))
			}
		}
		if err := validateCase(c); err != nil {
			errs = append(errs, fmt.Errorf("%s: case %q: %w", file, name, err))
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

// toSpec turns resolved settings back into a spec, for a variant to
// override.
func toSpec(n Node) nodeSpec {
	return nodeSpec{
		Name: &n.Name, Zone: &n.Zone, IPs: n.IPs, Addresses: n.Addresses,
		ClusterCIDR: &n.ClusterCIDR, ServiceCIDR: &n.ServiceCIDR, NodePortAddresses: n.NodePortAddresses,
		LocalhostNodePorts: &n.LocalhostNodePorts, MasqueradeAll: &n.MasqueradeAll,
	}
}

// applyStep deletes then applies (create or replace) objects.
func applyStep(objs []Object, st *Step) ([]Object, error) {
	var errs []error
	out := slices.Clone(objs)
	for _, ref := range st.Delete {
		i := slices.IndexFunc(out, func(o Object) bool { return o.Ref() == ref })
		if i < 0 {
			errs = append(errs, fmt.Errorf("delete %s: no such object", ref))
			continue
		}
		out = slices.Delete(out, i, i+1)
	}
	for _, a := range st.Apply {
		if i := slices.IndexFunc(out, func(o Object) bool { return o.Ref() == a.Ref() }); i >= 0 {
			out[i] = a
		} else {
			out = append(out, a)
		}
	}
	return out, errors.Join(errs...)
}

// validateCase checks everything a runner relies on.
func validateCase(c *Case) error {
	var errs []error
	said := map[string]bool{} // steps share objects: say each problem once
	add := func(format string, a ...any) {
		if err := fmt.Errorf(format, a...); !said[err.Error()] {
			said[err.Error()] = true
			errs = append(errs, err)
		}
	}
	v6 := c.IPFamily == corev1.IPv6Protocol
	famOK := func(a netip.Addr) bool { return a.IsValid() && a.Unmap().Is6() == v6 && (v6 || a.Is4()) }

	for _, ip := range c.Node.IPs {
		if !famOK(ip) {
			add("node ip %s is not %s", ip, c.IPFamily)
		}
	}
	for _, p := range c.Node.Addresses {
		if !famOK(p.Addr()) {
			add("node address %s is not %s", p, c.IPFamily)
		}
	}
	for a, pl := range c.Placement {
		if !famOK(a) {
			add("placement %s is not %s", a, c.IPFamily)
		}
		if pl != PlaceLocal && pl != PlaceRemote && pl != PlaceExternal {
			add("placement %s: %q is not local, remote or external", a, pl)
		}
	}
	for _, o := range c.KubeProxy {
		if o.File == "" || o.Test == "" {
			add("kubeProxy origin %+v: file and test are required", o)
		}
	}

	// Endpoint placement must agree with the slices: an address placed
	// "local" has an entry on this node, one placed "remote" an entry
	// elsewhere (kube-proxy's duplicate-address cases have both).
	checkSlices := func(objs []Object) {
		seen := map[ObjectRef]bool{}
		services := map[string]bool{}
		for _, o := range objs {
			if seen[o.Ref()] {
				add("%s appears twice", o.Ref())
			}
			seen[o.Ref()] = true
			if o.Service != nil {
				services[o.Service.Namespace+"/"+o.Service.Name] = true
			}
		}
		for _, o := range objs {
			if o.Slice == nil {
				continue
			}
			if !services[o.Slice.Namespace+"/"+o.Slice.Labels[discoveryv1.LabelServiceName]] {
				add("%s names Service %q, which the case does not hold", o.Ref(), o.Slice.Labels[discoveryv1.LabelServiceName])
			}
			for _, ep := range o.Slice.Endpoints {
				for _, s := range ep.Addresses {
					a, err := parseAddr(s)
					if err != nil {
						add("%s: endpoint address %q: %v", o.Ref(), s, err)
						continue
					}
					pl, ok := c.Placement[a]
					if !ok {
						add("%s: endpoint %s has no placement", o.Ref(), a)
						continue
					}
					local := ep.NodeName != nil && *ep.NodeName == c.Node.Name
					if (pl == PlaceLocal) != local && !placedBoth(objs, a, c.Node.Name) {
						add("%s: endpoint %s is placed %s but its nodeName says otherwise", o.Ref(), a, pl)
					}
				}
			}
		}
	}
	checkSlices(c.Objects)

	names := map[string]bool{}
	for _, st := range c.Steps {
		if st.Name == "" {
			add("a step has no name")
		}
		checkSlices(st.objects)
		for _, f := range st.Flows {
			if names[f.Name] {
				add("flow %q: name used twice", f.Name)
			}
			names[f.Name] = true
			if err := validateFlow(c, st, f, famOK); err != nil {
				add("step %q: flow %q: %w", st.Name, f.Name, err)
			}
		}
	}
	return errors.Join(errs...)
}

// placedBoth says whether address a has endpoint entries both on node and
// elsewhere (so either placement is consistent).
func placedBoth(objs []Object, a netip.Addr, node string) bool {
	var here, there bool
	for _, o := range objs {
		if o.Slice == nil {
			continue
		}
		for _, ep := range o.Slice.Endpoints {
			if slices.ContainsFunc(ep.Addresses, func(s string) bool { return sameAddr(s, a) }) {
				if ep.NodeName != nil && *ep.NodeName == node {
					here = true
				} else {
					there = true
				}
			}
		}
	}
	return here && there
}

func validateFlow(c *Case, st *Step, f *Flow, famOK func(netip.Addr) bool) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	n := &c.Node
	if f.Name == "" {
		add("name is required")
	}
	src := f.Source.IP
	if !famOK(src) {
		add("source %s is not a %s address", src, c.IPFamily)
	}
	if !famOK(f.Destination.IP) {
		add("destination %s is not a %s address", f.Destination.IP, c.IPFamily)
	}
	if f.Destination.Port == 0 {
		add("destination port is required")
	}
	switch f.Protocol {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		add("protocol %q", f.Protocol)
	}
	inCluster := n.ClusterCIDR.IsValid() && n.ClusterCIDR.Contains(src)
	switch f.Source.Kind {
	case SourcePod, SourceRemotePod:
		if n.ClusterCIDR.IsValid() && !inCluster {
			add("%s source %s is outside the cluster CIDR %s", f.Source.Kind, src, n.ClusterCIDR)
		}
		want := PlaceLocal
		if f.Source.Kind == SourceRemotePod {
			want = PlaceRemote
		}
		if pl, ok := c.Placement[src]; ok && pl != want {
			add("%s source %s is placed %s", f.Source.Kind, src, pl)
		}
	case SourceExternal:
		if inCluster || n.IsNodeAddress(src) || src.IsLoopback() {
			add("external source %s is a pod, node or loopback address", src)
		}
	case SourceNode:
		if !n.IsNodeAddress(src) {
			add("node source %s is not one of the node's addresses", src)
		}
	case SourceLocalhost:
		if !src.IsLoopback() {
			add("localhost source %s is not a loopback address", src)
		}
	default:
		add("source kind %q: want pod, remotePod, external, node or localhost", f.Source.Kind)
	}

	for _, m := range f.KubeProxy.Modes {
		if !slices.Contains(c.Modes(), m) {
			add("kubeProxy mode %q is not among the case's (%v)", m, c.Modes())
		}
	}
	if c.Derived != "" {
		// A derived case has no kube-proxy test behind it; kubeProxy.nftables
		// may record what kube-proxy's nftables code answers where Sluice
		// deliberately differs.
		switch {
		case len(f.KubeProxy.Modes) > 0 || f.KubeProxy.IPTables != nil || f.KubeProxy.NFTablesName != "" || f.KubeProxy.IPTablesName != "":
			add("a derived case's flow names no kube-proxy test (only kubeProxy.nftables, with a deviation)")
		case (f.Deviation != "") != (f.KubeProxy.NFTables != nil):
			add("in a derived case, deviation and kubeProxy.nftables (kube-proxy's answer) go together")
		case f.Deviation != "" && f.KubeProxy.NFTables.Equal(f.Expect):
			add("deviation given but the expectation is kube-proxy's own")
		}
	} else {
		if len(f.KubeProxy.Modes) == 0 {
			add("a ported case's flow must name its kube-proxy modes")
		}
		if f.KubeProxy.NFTables != nil && !slices.Contains(f.KubeProxy.Modes, ModeNFTables) {
			add("kubeProxy.nftables is set but the flow is not in nftables' tests")
		}
		if f.KubeProxy.IPTables != nil && !slices.Contains(f.KubeProxy.Modes, ModeIPTables) {
			add("kubeProxy.iptables is set but the flow is not in iptables' tests")
		}
		// The case follows nftables where it has the flow, else iptables.
		primary := ModeIPTables
		if slices.Contains(f.KubeProxy.Modes, ModeNFTables) {
			primary = ModeNFTables
		}
		kp, _ := f.KubeProxyExpect(primary)
		differs := !kp.Equal(f.Expect)
		switch {
		case f.Deviation == "" && differs:
			add("expects %v but kube-proxy %s expects %v and no deviation is given", f.Expect, primary, kp)
		case f.Deviation != "" && !differs:
			add("deviation given but the expectation is kube-proxy's own (%s)", primary)
		}
		if primary == ModeNFTables && f.KubeProxy.IPTables != nil && f.KubeProxy.IPTables.Equal(kp) {
			add("kubeProxy.iptables repeats nftables' expectation")
		}
	}
	for i, e := range []*Expect{&f.Expect, f.KubeProxy.NFTables, f.KubeProxy.IPTables} {
		if e != nil {
			if err := validateExpect(c, st, f, *e, i == 0, famOK); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// validateExpect checks one expectation; own is true for the flow's own
// (the one runners check), false for kube-proxy's recorded ones.
func validateExpect(c *Case, st *Step, f *Flow, e Expect, own bool, famOK func(netip.Addr) bool) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	dst := f.Destination
	fronts := frontends(c, st.objects, f.Protocol, dst)
	if (len(e.Endpoints) > 0) == (e.Verdict != "") {
		return fmt.Errorf("expect %v: exactly one of endpoints and verdict is required", e)
	}
	if e.Verdict != "" {
		if e.Masquerade != MasqueradeUnset || e.Affinity != "" {
			add("expect %v: masquerade and affinity go with endpoints only", e)
		}
		if (e.LocalEndpoints != nil) != (e.Verdict == VerdictHealthCheck) {
			add("expect %v: localEndpoints goes with HEALTHCHECK only", e)
		}
		switch e.Verdict {
		case VerdictReject, VerdictDrop:
		case VerdictUntouched:
			if own && !c.Node.IsNodeAddress(dst.IP) && !dst.IP.IsLoopback() && c.Placement[dst.IP] == "" {
				add("UNTOUCHED destination %s is neither a node address nor placed (the runner needs a sink there)", dst.IP)
			}
		case VerdictHealthCheck:
			if !c.Node.IsNodeAddress(dst.IP) && !dst.IP.IsLoopback() {
				add("HEALTHCHECK destination %s is not a node address", dst.IP)
			}
			if !slices.ContainsFunc(st.objects, func(o Object) bool {
				return o.Service != nil && o.Service.Spec.HealthCheckNodePort == int32(dst.Port)
			}) {
				add("HEALTHCHECK: no Service has healthCheckNodePort %d", dst.Port)
			}
		default:
			add("verdict %q: want REJECT, DROP, UNTOUCHED or HEALTHCHECK", e.Verdict)
		}
		return errors.Join(errs...)
	}

	if e.Masquerade == MasqueradeUnset {
		add("expect %v: masquerade is required with endpoints", e)
	}
	if len(fronts) == 0 {
		add("expects endpoints but no Service serves %s %s:%d", f.Protocol, dst.IP, dst.Port)
	}
	var local, remote bool
	for _, ep := range e.Endpoints {
		if !famOK(ep.Addr()) {
			add("endpoint %s is not %s", ep, c.IPFamily)
		}
		if !slices.ContainsFunc(fronts, func(svc *corev1.Service) bool { return serviceHasEndpoint(st.objects, svc, f.Protocol, ep) }) {
			add("endpoint %s is not an endpoint (address and port) of a Service that serves %s %s:%d", ep, f.Protocol, dst.IP, dst.Port)
		}
		switch c.Placement[ep.Addr()] {
		case PlaceLocal:
			local = true
		case PlaceRemote:
			remote = true
		}
	}
	if len(slices.Compact(slices.SortedFunc(slices.Values(e.Endpoints), netip.AddrPort.Compare))) != len(e.Endpoints) {
		add("expect %v: an endpoint is listed twice", e)
	}
	if e.Masquerade == MasqueradeRemote && !(local && remote) {
		add("masquerade \"remote\" needs endpoints both local and remote; write true or false")
	}
	affinity := slices.ContainsFunc(fronts, func(svc *corev1.Service) bool {
		return svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
	})
	switch e.Affinity {
	case "":
		if affinity && len(e.Endpoints) > 1 {
			add("the Service has ClientIP affinity: a flow with several endpoints must say affinity sticky or expires")
		}
	case AffinitySticky, AffinityExpires:
		if !affinity {
			add("affinity %q but no Service serving the destination has sessionAffinity ClientIP", e.Affinity)
		}
		if e.Affinity == AffinityExpires && len(e.Endpoints) < 2 {
			add("affinity expires needs at least two endpoints to show a fresh choice")
		}
	default:
		add("affinity %q: want sticky or expires", e.Affinity)
	}
	if e.LocalEndpoints != nil {
		add("localEndpoints goes with HEALTHCHECK only")
	}
	return errors.Join(errs...)
}

// frontends are the Services that serve protocol to dst on this node, by
// ClusterIP, ExternalIP, LoadBalancer ingress IP or NodePort (on any node
// or loopback address: whether the NodePort answers there is the flow's
// business, not the Service's).
func frontends(c *Case, objs []Object, proto corev1.Protocol, dst Destination) []*corev1.Service {
	var out []*corev1.Service
	for _, o := range objs {
		svc := o.Service
		if svc == nil {
			continue
		}
		ips := append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...)
		ips = append(ips, svc.Spec.ExternalIPs...)
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, ing.IP)
		}
		hasIP := slices.ContainsFunc(ips, func(s string) bool { return sameAddr(s, dst.IP) })
		for _, p := range svc.Spec.Ports {
			if cmpProto(p.Protocol) != proto {
				continue
			}
			if (int(p.Port) == int(dst.Port) && hasIP) ||
				(p.NodePort != 0 && int(p.NodePort) == int(dst.Port) && (c.Node.IsNodeAddress(dst.IP) || dst.IP.IsLoopback())) {
				out = append(out, svc)
				break
			}
		}
	}
	return out
}

// ParseAddr reads an address written in an object as kube-proxy reads it
// (see parseAddr), for runners that place the objects' addresses.
func ParseAddr(s string) (netip.Addr, error) { return parseAddr(s) }

// parseAddr reads an address as kube-proxy does (netutils.ParseIPSloppy):
// IPv4 octets may carry leading zeros, read as decimal ("010" is 10), a
// form kube-proxy's TestBadIPs feeds it.
func parseAddr(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, nil
	}
	parts := strings.Split(s, ".")
	var b [4]byte
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("bad IP address %q", s)
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("bad IP address %q", s)
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), nil
}

// sameAddr says whether s, read as kube-proxy reads it, is a.
func sameAddr(s string, a netip.Addr) bool {
	b, err := parseAddr(s)
	return err == nil && b == a
}

func cmpProto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// serviceHasEndpoint says whether one of svc's slices holds address ep with
// port number ep.Port for protocol proto.
func serviceHasEndpoint(objs []Object, svc *corev1.Service, proto corev1.Protocol, ep netip.AddrPort) bool {
	for _, o := range objs {
		sl := o.Slice
		if sl == nil || sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		portOK := slices.ContainsFunc(sl.Ports, func(p discoveryv1.EndpointPort) bool {
			return p.Port != nil && int(*p.Port) == int(ep.Port()) && (p.Protocol == nil || cmpProto(*p.Protocol) == proto)
		})
		if !portOK {
			continue
		}
		for _, e := range sl.Endpoints {
			if slices.ContainsFunc(e.Addresses, func(s string) bool { return sameAddr(s, ep.Addr()) }) {
				return true
			}
		}
	}
	return false
}

func buildTranslation(file, stem string, fileNode nodeSpec, ts *translationSpec) (*Translation, error) {
	fail := func(err error) (*Translation, error) {
		return nil, fmt.Errorf("%s: translation %q: %w", file, ts.Name, err)
	}
	if ts.Name == "" {
		return fail(errors.New("name is required"))
	}
	if len(ts.KubeProxy) == 0 {
		return fail(errors.New("kubeProxy (the test it ports) is required"))
	}
	node, err := resolveNode(fileNode, ts.Node)
	if err != nil {
		return fail(err)
	}
	objs, err := decodeObjects(ts.Objects)
	if err != nil {
		return fail(err)
	}
	tr := &Translation{File: file, Name: stem + "/" + ts.Name, KubeProxy: ts.KubeProxy, Node: node,
		Objects: objs, Expect: ts.Expect, Skip: ts.Skip, Comment: strings.TrimSpace(ts.Comment)}
	var svcs []*corev1.Service
	for _, o := range objs {
		if o.Service != nil {
			svcs = append(svcs, o.Service)
		}
	}
	if len(svcs) != 1 {
		return fail(fmt.Errorf("want exactly one Service, got %d", len(svcs)))
	}
	var errs []error
	for _, l := range [][]netip.AddrPort{ts.Expect.Cluster, ts.Expect.Local, ts.Expect.All} {
		for _, ep := range l {
			if !serviceHasEndpoint(objs, svcs[0], corev1.ProtocolTCP, ep) {
				errs = append(errs, fmt.Errorf("expected endpoint %s is not in the Service's slices", ep))
			}
		}
	}
	// all is the union of cluster and local, as kube-proxy computes it.
	union := map[netip.AddrPort]bool{}
	for _, ep := range slices.Concat(ts.Expect.Cluster, ts.Expect.Local) {
		union[ep] = true
	}
	if !maps.Equal(union, setOf(ts.Expect.All)) {
		errs = append(errs, fmt.Errorf("all %v is not the union of cluster and local", ts.Expect.All))
	}
	if len(ts.Expect.All) > 0 && !ts.Expect.HasAnyEndpoints {
		errs = append(errs, errors.New("hasAnyEndpoints must be true when all is not empty"))
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	return tr, nil
}

func setOf(l []netip.AddrPort) map[netip.AddrPort]bool {
	m := map[netip.AddrPort]bool{}
	for _, e := range l {
		m[e] = true
	}
	return m
}

// Count tallies flows.
type Count struct {
	// Flows is every flow (variants expanded).
	Flows int
	// Ported are flows from kube-proxy's tables; NFTables and IPTables
	// count those each mode's tests carry (so Ported <= NFTables+IPTables).
	Ported, NFTables, IPTables int
	// Derived are flows of derived cases (not in kube-proxy's tables).
	Derived int
	// Deviations and Skipped are flows with a deviation, or skipped.
	Deviations, Skipped int
	// ByFamily counts flows per IP family.
	ByFamily map[corev1.IPFamily]int
}

// Count tallies the flows of the cases for which keep returns true (nil:
// all).
func (c *Corpus) Count(keep func(*Case) bool) Count {
	n := Count{ByFamily: map[corev1.IPFamily]int{}}
	for _, cs := range c.Cases {
		if keep != nil && !keep(cs) {
			continue
		}
		for _, st := range cs.Steps {
			for _, f := range st.Flows {
				n.Flows++
				n.ByFamily[cs.IPFamily]++
				if cs.Derived != "" {
					n.Derived++
				} else {
					n.Ported++
					if slices.Contains(f.KubeProxy.Modes, ModeNFTables) {
						n.NFTables++
					}
					if slices.Contains(f.KubeProxy.Modes, ModeIPTables) {
						n.IPTables++
					}
				}
				if f.Deviation != "" {
					n.Deviations++
				}
				if f.Skip != "" {
					n.Skipped++
				}
			}
		}
	}
	return n
}

// Files are the corpus files that hold cases, in order.
func (c *Corpus) Files() []string {
	var out []string
	for _, cs := range c.Cases {
		if !slices.Contains(out, cs.File) {
			out = append(out, cs.File)
		}
	}
	slices.Sort(out)
	return out
}

// AffinityTimeout is the Service's ClientIP affinity timeout, with the API
// server's default (10800 s) when the config is left out.
func AffinityTimeout(svc *corev1.Service) time.Duration {
	if svc.Spec.SessionAffinityConfig != nil && svc.Spec.SessionAffinityConfig.ClientIP != nil &&
		svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != nil {
		return time.Duration(*svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds) * time.Second
	}
	return time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second
}
