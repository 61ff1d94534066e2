package kubeproxyconfig

// kube-proxy's validation of its configuration
// (k8s.io/kubernetes/pkg/proxy/apis/config/validation, Linux), ported
// check by check for the fields Sluice does not otherwise parse: a file
// kube-proxy refuses to start with is refused here too, applied field or
// not, rather than warned about, since the user has to fix it before the
// file can go back to kube-proxy anyway. kube-proxy validates after its
// defaulting, so a field left zero is checked as kube-proxy's default
// (the sync periods below). The address and CIDR checks are in mapFields,
// where the values are parsed for the flags. Not ported: featureGates,
// logging and showHiddenMetricsForVersion, which need kube-proxy's
// registries of gates, log formats and its own version.

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netutils "k8s.io/utils/net"
)

// kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go) of
// the sync periods, which its validation compares: ipvs.minSyncPeriod has
// none (0).
const (
	defaultSyncPeriod    = 30 * time.Second
	defaultMinSyncPeriod = time.Second
)

// validate returns kube-proxy's first validation error, naming the field
// with the file's path (not kube-proxy's internal one).
func validate(c *KubeProxyConfiguration) error {
	// validateProxyModeLinux: kernelspace is Windows' only mode.
	switch c.Mode {
	case "", "iptables", "ipvs", "nftables":
	default:
		return fmt.Errorf("mode %q: want iptables, ipvs or nftables (or empty), as kube-proxy on Linux", c.Mode)
	}

	// The iptables section's masqueradeBit is validated in every mode,
	// the others' sections in their mode only.
	if err := bitRange("iptables.masqueradeBit", c.IPTables.MasqueradeBit); err != nil {
		return err
	}
	var syncSection string
	var sync, minSync metav1.Duration
	switch c.Mode {
	case "", "iptables":
		syncSection, sync, minSync = "iptables", c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod
		minSync = orDefault(minSync, defaultMinSyncPeriod)
	case "ipvs":
		syncSection, sync, minSync = "ipvs", c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod
		for _, d := range []struct {
			field string
			d     metav1.Duration
		}{{"ipvs.tcpTimeout", c.IPVS.TCPTimeout}, {"ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout}, {"ipvs.udpTimeout", c.IPVS.UDPTimeout}} {
			if err := nonNegative(d.field, d.d.Duration); err != nil {
				return err
			}
		}
		for i, s := range c.IPVS.ExcludeCIDRs {
			if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
				return fmt.Errorf("ipvs.excludeCIDRs[%d] %q: must be a valid CIDR, as in kube-proxy: %w", i, s, err)
			}
		}
	case "nftables":
		syncSection, sync, minSync = "nftables", c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod
		minSync = orDefault(minSync, defaultMinSyncPeriod)
		if err := bitRange("nftables.masqueradeBit", c.NFTables.MasqueradeBit); err != nil {
			return err
		}
	}
	sync = orDefault(sync, defaultSyncPeriod)
	switch {
	case sync.Duration < 0:
		return fmt.Errorf("%s.syncPeriod %v: must be greater than 0", syncSection, sync.Duration)
	case minSync.Duration < 0:
		return fmt.Errorf("%s.minSyncPeriod %v: must not be negative", syncSection, minSync.Duration)
	case minSync.Duration > sync.Duration:
		return fmt.Errorf("%s.minSyncPeriod %v: must not be above %s.syncPeriod, %v (kube-proxy's default when unset: %v)",
			syncSection, minSync.Duration, syncSection, sync.Duration, defaultSyncPeriod)
	}

	// validateKubeProxyLinuxConfiguration.
	if a := c.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		return fmt.Errorf("oomScoreAdj %d: must be within [-1000, 1000]", *a)
	}
	ct := &c.Conntrack
	for _, n := range []struct {
		field string
		v     *int32
	}{{"conntrack.maxPerCore", ct.MaxPerCore}, {"conntrack.min", ct.Min}} {
		if n.v != nil && *n.v < 0 {
			return fmt.Errorf("%s %d: must be >= 0", n.field, *n.v)
		}
	}
	for _, d := range []struct {
		field string
		d     *metav1.Duration
	}{
		{"conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout},
		{"conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", &ct.UDPTimeout},
		{"conntrack.udpStreamTimeout", &ct.UDPStreamTimeout},
	} {
		if d.d != nil {
			if err := nonNegative(d.field, d.d.Duration); err != nil {
				return err
			}
		}
	}

	if b := c.ClientConnection.Burst; b < 0 {
		return fmt.Errorf("clientConnection.burst %d: must be >= 0", b)
	}
	// 0 is kube-proxy's default, 15m.
	if d := c.ConfigSyncPeriod.Duration; d < 0 {
		return fmt.Errorf("configSyncPeriod %v: must be greater than 0", d)
	}
	return nil
}

func bitRange(field string, bit *int32) error {
	if bit != nil && (*bit < 0 || *bit > 31) {
		return fmt.Errorf("%s %d: must be within [0, 31]", field, *bit)
	}
	return nil
}

func nonNegative(field string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%s %v: must be >= 0", field, d)
	}
	return nil
}

// orDefault is d, or def for 0 (kube-proxy's defaulting).
func orDefault(d metav1.Duration, def time.Duration) metav1.Duration {
	if d.Duration == 0 {
		return metav1.Duration{Duration: def}
	}
	return d
}
