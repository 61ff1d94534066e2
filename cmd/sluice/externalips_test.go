package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestExternalIPsGateFromConfig: the file's featureGates
// AllowServiceExternalIPs false reaches the translation's options (the
// agent says so at start); --allow-service-external-ips on the command
// line overrides it.
func TestExternalIPsGateFromConfig(t *testing.T) {
	path := writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates: {AllowServiceExternalIPs: false}\n")
	const said = "Services' spec.externalIPs not served"
	for _, c := range []struct {
		args []string
		off  bool
	}{
		{nil, true},
		{[]string{"--allow-service-external-ips=true"}, false},
	} {
		stderr := runToMissingManifests(t, append([]string{"--config", path, "--socket-lb=false"}, c.args...)...)
		if strings.Contains(stderr, said) != c.off {
			t.Errorf("%q: %q logged %v, want %v; stderr:\n%s", c.args, said, !c.off, c.off, stderr)
		}
	}
}

// TestFeatureGatesFlagRefused: kube-proxy's --feature-gates is no flag of
// Sluice's: given, even with the one gate Sluice applies, the agent exits
// 2 naming it, rather than running with a gate it silently dropped
// (--allow-service-external-ips and --config's featureGates are the ways
// in).
func TestFeatureGatesFlagRefused(t *testing.T) {
	var code int
	stderr := captureStderr(t, func() {
		code = run([]string{"--feature-gates=AllowServiceExternalIPs=false", "--manifests", filepath.Join(t.TempDir(), "m.yaml")})
	})
	if code != 2 || !strings.Contains(stderr, "-feature-gates") {
		t.Errorf("exit %d, want 2 naming -feature-gates; stderr:\n%s", code, stderr)
	}
}
