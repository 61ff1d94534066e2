package kubeproxyconfig

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The types below mirror kubeproxy.config.k8s.io/v1alpha1 (k8s.io/kube-proxy
// config/v1alpha1/types.go, Kubernetes v1.36) field for field, so that a
// file kube-proxy accepts is accepted here and a misspelt field is not.
// Fields are values, not pointers, where kube-proxy's zero value means
// "the default": Sluice then keeps its own default.

// KubeProxyConfiguration is kube-proxy's configuration file.
type KubeProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	FeatureGates                map[string]bool                 `json:"featureGates,omitempty"`
	ClientConnection            ClientConnectionConfiguration   `json:"clientConnection"`
	Logging                     LoggingConfiguration            `json:"logging,omitempty"`
	HostnameOverride            string                          `json:"hostnameOverride"`
	BindAddress                 string                          `json:"bindAddress"`
	HealthzBindAddress          string                          `json:"healthzBindAddress"`
	MetricsBindAddress          string                          `json:"metricsBindAddress"`
	BindAddressHardFail         bool                            `json:"bindAddressHardFail"`
	EnableProfiling             bool                            `json:"enableProfiling"`
	ShowHiddenMetricsForVersion string                          `json:"showHiddenMetricsForVersion"`
	Mode                        string                          `json:"mode"`
	IPTables                    KubeProxyIPTablesConfiguration  `json:"iptables"`
	IPVS                        KubeProxyIPVSConfiguration      `json:"ipvs"`
	NFTables                    KubeProxyNFTablesConfiguration  `json:"nftables"`
	Winkernel                   KubeProxyWinkernelConfiguration `json:"winkernel"`
	DetectLocalMode             string                          `json:"detectLocalMode"`
	DetectLocal                 DetectLocalConfiguration        `json:"detectLocal"`
	ClusterCIDR                 string                          `json:"clusterCIDR"`
	NodePortAddresses           []string                        `json:"nodePortAddresses"`
	OOMScoreAdj                 *int32                          `json:"oomScoreAdj"`
	Conntrack                   KubeProxyConntrackConfiguration `json:"conntrack"`
	ConfigSyncPeriod            metav1.Duration                 `json:"configSyncPeriod"`
	PortRange                   string                          `json:"portRange"`
	WindowsRunAsService         bool                            `json:"windowsRunAsService,omitempty"`
}

// ClientConnectionConfiguration is component-base's (config/v1alpha1).
type ClientConnectionConfiguration struct {
	Kubeconfig         string  `json:"kubeconfig"`
	AcceptContentTypes string  `json:"acceptContentTypes"`
	ContentType        string  `json:"contentType"`
	QPS                float32 `json:"qps"`
	Burst              int32   `json:"burst"`
}

// LoggingConfiguration is component-base's (logs/api/v1). flushFrequency
// takes a duration string or nanoseconds, infoBufferSize a quantity:
// kept raw, as Sluice applies neither.
type LoggingConfiguration struct {
	Format         string               `json:"format,omitempty"`
	FlushFrequency json.RawMessage      `json:"flushFrequency,omitempty"`
	Verbosity      uint32               `json:"verbosity"`
	VModule        []VModuleItem        `json:"vmodule,omitempty"`
	Options        LoggingFormatOptions `json:"options,omitempty"`
}

// VModuleItem is one entry of logging.vmodule.
type VModuleItem struct {
	FilePattern string `json:"filePattern"`
	Verbosity   uint32 `json:"verbosity"`
}

// LoggingFormatOptions is logging.options.
type LoggingFormatOptions struct {
	Text LoggingOutputOptions `json:"text,omitempty"`
	JSON LoggingOutputOptions `json:"json,omitempty"`
}

// LoggingOutputOptions is logging.options.text and logging.options.json.
type LoggingOutputOptions struct {
	SplitStream    bool            `json:"splitStream,omitempty"`
	InfoBufferSize json.RawMessage `json:"infoBufferSize,omitempty"`
}

// KubeProxyIPTablesConfiguration is the iptables section.
type KubeProxyIPTablesConfiguration struct {
	MasqueradeBit      *int32          `json:"masqueradeBit"`
	MasqueradeAll      bool            `json:"masqueradeAll"`
	LocalhostNodePorts *bool           `json:"localhostNodePorts"`
	SNATNodeInternalIP *bool           `json:"snatNodeInternalIP"`
	SyncPeriod         metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod      metav1.Duration `json:"minSyncPeriod"`
}

// KubeProxyIPVSConfiguration is the ipvs section.
type KubeProxyIPVSConfiguration struct {
	SyncPeriod    metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
	Scheduler     string          `json:"scheduler"`
	ExcludeCIDRs  []string        `json:"excludeCIDRs"`
	StrictARP     bool            `json:"strictARP"`
	TCPTimeout    metav1.Duration `json:"tcpTimeout"`
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	UDPTimeout    metav1.Duration `json:"udpTimeout"`
}

// KubeProxyNFTablesConfiguration is the nftables section.
type KubeProxyNFTablesConfiguration struct {
	MasqueradeBit *int32          `json:"masqueradeBit"`
	MasqueradeAll bool            `json:"masqueradeAll"`
	SyncPeriod    metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
}

// KubeProxyConntrackConfiguration is the conntrack section: the node's
// netfilter conntrack sysctls, which kube-proxy sets.
type KubeProxyConntrackConfiguration struct {
	MaxPerCore            *int32           `json:"maxPerCore"`
	Min                   *int32           `json:"min"`
	TCPEstablishedTimeout *metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   *metav1.Duration `json:"tcpCloseWaitTimeout"`
	TCPBeLiberal          bool             `json:"tcpBeLiberal"`
	UDPTimeout            metav1.Duration  `json:"udpTimeout"`
	UDPStreamTimeout      metav1.Duration  `json:"udpStreamTimeout"`
}

// KubeProxyWinkernelConfiguration is the winkernel (Windows) section.
type KubeProxyWinkernelConfiguration struct {
	NetworkName           string `json:"networkName"`
	SourceVip             string `json:"sourceVip"`
	EnableDSR             bool   `json:"enableDSR"`
	RootHnsEndpointName   string `json:"rootHnsEndpointName"`
	ForwardHealthCheckVip bool   `json:"forwardHealthCheckVip"`
}

// DetectLocalConfiguration is the detectLocal section.
type DetectLocalConfiguration struct {
	BridgeInterface     string `json:"bridgeInterface"`
	InterfaceNamePrefix string `json:"interfaceNamePrefix"`
}
