package datapath

import (
	"testing"
	"unsafe"
)

// TestABISizes pins the sizes of the generated map types to those asserted
// in bpf/lib/structs.h: keys and values are an ABI with pinned maps.
func TestABISizes(t *testing.T) {
	for name, got := range map[string]uintptr{
		"lb4_key":          unsafe.Sizeof(sockLb4Key{}),
		"lb4_service":      unsafe.Sizeof(sockLb4Service{}),
		"lb4_backend":      unsafe.Sizeof(sockLb4Backend{}),
		"lb4_rev_nat":      unsafe.Sizeof(sockLb4RevNat{}),
		"ct4_key":          unsafe.Sizeof(sockCt4Key{}),
		"ct4_entry":        unsafe.Sizeof(sockCt4Entry{}),
		"sock_rev_key":     unsafe.Sizeof(sockSockRevKey{}),
		"sock_rev_entry":   unsafe.Sizeof(sockSockRevEntry{}),
		"lb4_affinity_key": unsafe.Sizeof(sockLb4AffinityKey{}),
		"lb4_affinity":     unsafe.Sizeof(sockLb4Affinity{}),
	} {
		want := map[string]uintptr{
			"lb4_key": 12, "lb4_service": 16, "lb4_backend": 8, "lb4_rev_nat": 8,
			"ct4_key": 16, "ct4_entry": 24, "sock_rev_key": 16, "sock_rev_entry": 12,
			"lb4_affinity_key": 16, "lb4_affinity": 8,
		}[name]
		if got != want {
			t.Errorf("struct %s is %d bytes in Go, %d in C", name, got, want)
		}
	}
}
