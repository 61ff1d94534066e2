package kubeproxyconfig

import (
	"reflect"
	"strings"
	"testing"
)

// TestFeatureGates: AllowServiceExternalIPs sets
// --allow-service-external-ips, false or true; the other gates are
// reported as not applied, one set to false too (a gate's default is its
// own); the gate misspelt is refused, as kube-proxy refuses a gate it does
// not know, rather than left to a warning while the externalIPs stay
// served.
func TestFeatureGates(t *testing.T) {
	// With no conntrack defaults to report, the fields ignored are gates.
	const base = head + "conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 0s, tcpEstablishedTimeout: 0s}\n"
	for _, c := range []struct {
		name, gates string
		settings    []Setting
		ignored     map[string]string
	}{
		{"off", "featureGates: {AllowServiceExternalIPs: false, SomeGate: true, OtherGate: false}\n",
			[]Setting{{"featureGates.AllowServiceExternalIPs", "allow-service-external-ips", "false"}},
			map[string]string{"featureGates.SomeGate": "true", "featureGates.OtherGate": "false"}},
		{"on", "featureGates: {AllowServiceExternalIPs: true}\n",
			[]Setting{{"featureGates.AllowServiceExternalIPs", "allow-service-external-ips", "true"}}, map[string]string{}},
		{"other gates only", "featureGates: {SomeGate: true}\n", nil, map[string]string{"featureGates.SomeGate": "true"}},
		{"none", "featureGates: {}\n", nil, map[string]string{}},
	} {
		res, err := Parse([]byte(base + c.gates))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(res.Settings, c.settings) {
			t.Errorf("%s: settings %v, want %v", c.name, res.Settings, c.settings)
		}
		got := map[string]string{}
		for _, ig := range res.Ignored {
			got[ig.Field] = ig.Value
			if !strings.Contains(ig.Why, "AllowServiceExternalIPs (--allow-service-external-ips)") {
				t.Errorf("%s: %s: why %q does not name the gate applied", c.name, ig.Field, ig.Why)
			}
		}
		if !reflect.DeepEqual(got, c.ignored) {
			t.Errorf("%s: ignored %v, want %v", c.name, got, c.ignored)
		}
	}

	_, err := Parse([]byte(base + "featureGates: {allowServiceExternalIPs: false}\n"))
	if err == nil || !strings.Contains(err.Error(), "featureGates.allowServiceExternalIPs") {
		t.Errorf("the gate misspelt: error %v, want one naming featureGates.allowServiceExternalIPs", err)
	}
}
