package translate

// An EndpointSlice port numbered 0. discovery/v1 does not validate a
// slice's ports, so the API server stores one; kube-proxy
// (endpointslicecache.go, endpointInfoByServicePort) logs and ignores a
// port that is nil or 0, and serves the slice's other ports and the
// Service's other slices. Sluice did fail the whole Service's translation
// on it, and the tracker kept its last good translation (or, for a new
// Service, none at all).

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestSlicePortZeroSkipped(t *testing.T) {
	tcp := corev1.ProtocolTCP
	svc := service("p", []string{"10.96.0.20"}, sport("a", 80, tcp), sport("b", 81, tcp))
	cases := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		want     string
		warnings []string
	}{
		{
			name: "slice p-2's only port is 0: its port b has no backends, port a is served",
			slices: []*discoveryv1.EndpointSlice{
				slice("p-1", "p", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, ep{addr: "10.0.0.1"}),
				slice("p-2", "p", []discoveryv1.EndpointPort{eport("b", 0, tcp)}, ep{addr: "10.0.0.2"}),
			},
			want: "10.96.0.20:80/TCP default/p:a -> 10.0.0.1:8080/TCP\n" +
				"10.96.0.20:81/TCP default/p:b ->\n",
			warnings: []string{`endpointslice "default/p-2": port "b": port 0 is not valid; the port is not served`},
		},
		{
			// One slice: categorizeSorted's path.
			name: "one slice, port a is 0 and port b is not",
			slices: []*discoveryv1.EndpointSlice{
				slice("p-1", "p", []discoveryv1.EndpointPort{eport("a", 0, tcp), eport("b", 8081, tcp)}, ep{addr: "10.0.0.1"}),
			},
			want: "10.96.0.20:80/TCP default/p:a ->\n" +
				"10.96.0.20:81/TCP default/p:b -> 10.0.0.1:8081/TCP\n",
			warnings: []string{`endpointslice "default/p-1": port "a": port 0 is not valid; the port is not served`},
		},
		{
			// Another slice lists the same endpoint on port a with a
			// number: that listing is served.
			name: "port a is 0 in one slice and 8080 in another",
			slices: []*discoveryv1.EndpointSlice{
				slice("p-1", "p", []discoveryv1.EndpointPort{eport("a", 0, tcp)}, ep{addr: "10.0.0.1"}),
				slice("p-2", "p", []discoveryv1.EndpointPort{eport("a", 8080, tcp)}, ep{addr: "10.0.0.1"}),
			},
			want: "10.96.0.20:80/TCP default/p:a -> 10.0.0.1:8080/TCP\n" +
				"10.96.0.20:81/TCP default/p:b ->\n",
			warnings: []string{`endpointslice "default/p-1": port "a": port 0 is not valid; the port is not served`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ServiceToModel(svc, tc.slices, Options{})
			if err != nil {
				t.Fatalf("ServiceToModel: %v", err)
			}
			if got := render(tr.Services, tc.slices); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
			// No usable endpoint anywhere: rejected, not dropped.
			for _, s := range tr.Services {
				if len(s.Backends) == 0 && s.DropWhenEmpty {
					t.Errorf("%s: dropped, want rejected", s.Frontend)
				}
			}
			if !slices.Equal(tr.Warnings, tc.warnings) {
				t.Errorf("warnings %q, want %q", tr.Warnings, tc.warnings)
			}
		})
	}
}

// A slice port number out of range (negative, or above 65535) stays an
// error naming the slice: kube-proxy keeps it (int(*port.Port)) and writes
// it into its rules, and nft refuses them ("Service out of range" for
// 70000, a syntax error for -1; checked with nft 1.0.6), so kube-proxy's
// whole sync fails until the slice is fixed. Sluice fails that Service's
// translation only.
func TestSlicePortOutOfRangeFails(t *testing.T) {
	tcp := corev1.ProtocolTCP
	svc := service("p", []string{"10.96.0.20"}, sport("a", 80, tcp))
	for _, port := range []int32{-1, 65536, 70000} {
		eps := []*discoveryv1.EndpointSlice{slice("p-1", "p", []discoveryv1.EndpointPort{eport("a", port, tcp)}, ep{addr: "10.0.0.1"})}
		_, err := ServiceToModel(svc, eps, Options{})
		if err == nil || !strings.Contains(err.Error(), `endpointslice "default/p-1": port "a": port `) || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("port %d: err %v, want out of range naming the slice", port, err)
		}
	}
}
