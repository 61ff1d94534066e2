package main

// --config: kube-proxy's configuration file, applied as the flags its
// fields map to (pkg/kubeproxyconfig says which).
//
// Precedence: a flag given on the command line wins over the file, and the
// file over Sluice's defaults, as for the kubelet's --config. kube-proxy
// itself ignores most flags given beside --config; Sluice does not, so
// that a DaemonSet can keep the cluster's file and override one value.

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/sluice-lb/sluice/pkg/kubeproxyconfig"
)

// kubeProxyConfig is what applying the file did, to log once the logger
// exists.
type kubeProxyConfig struct {
	applied, overridden []kubeproxyconfig.Setting
	ignored             []kubeproxyconfig.Ignored
}

// sourceFlags choose the source: one of them on the command line
// overrides the file's clientConnection.kubeconfig, which would otherwise
// make two sources.
var sourceFlags = []string{"manifests", "kubeconfig", "in-cluster"}

// applyKubeProxyConfig reads the file at path and sets the flags of fs its
// fields map to, except those given on the command line.
func applyKubeProxyConfig(fs *flag.FlagSet, path string) (kubeProxyConfig, error) {
	var kp kubeProxyConfig
	res, err := kubeproxyconfig.Load(path)
	if err != nil {
		return kp, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	// --hostname-override is kube-proxy's --node-name: it overrides the
	// file's hostnameOverride as --node-name does (applyHostnameOverride).
	given["node-name"] = given["node-name"] || given["hostname-override"]
	sourceGiven := false
	for _, f := range sourceFlags {
		sourceGiven = sourceGiven || given[f]
	}
	for _, s := range res.Settings {
		if given[s.Flag] || s.Flag == "kubeconfig" && sourceGiven {
			kp.overridden = append(kp.overridden, s)
			continue
		}
		if err := fs.Set(s.Flag, s.Value); err != nil {
			return kp, fmt.Errorf("%s: %s: --%s %q: %w", path, s.Field, s.Flag, s.Value, err)
		}
		kp.applied = append(kp.applied, s)
	}
	kp.ignored = res.Ignored
	return kp, nil
}

// log says what the file set, what the command line overrode, and, one
// warning each, the fields Sluice does not apply.
func (kp kubeProxyConfig) log(log *slog.Logger, path string) {
	var applied []string
	for _, s := range kp.applied {
		applied = append(applied, s.Field+" -> --"+s.Flag+"="+s.Value)
	}
	log.Info("kube-proxy configuration applied", "file", path, "settings", applied)
	for _, s := range kp.overridden {
		log.Info("kube-proxy configuration field overridden by the command line", "field", s.Field, "value", s.Value, "flag", "--"+s.Flag)
	}
	for _, ig := range kp.ignored {
		log.Warn("kube-proxy configuration field not applied", "field", ig.Field, "value", ig.Value, "why", ig.Why)
	}
}
