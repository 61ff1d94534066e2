package datapath

import (
	"maps"
	"os"
	"regexp"
	"strconv"
	"testing"
	"unsafe"

	"github.com/sluice-lb/sluice/pkg/reconciler"
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
		"node_dev":         unsafe.Sizeof(sockNodeDev{}),
		"src_range_key":    unsafe.Sizeof(sockSrcRangeKey{}),
	} {
		want := map[string]uintptr{
			"lb4_key": 12, "lb4_service": 16, "lb4_backend": 8, "lb4_rev_nat": 8,
			"ct4_key": 16, "ct4_entry": 32, "sock_rev_key": 16, "sock_rev_entry": 12,
			"lb4_affinity_key": 16, "lb4_affinity": 12, "node_dev": 8, "src_range_key": 16,
		}[name]
		if got != want {
			t.Errorf("struct %s is %d bytes in Go, %d in C", name, got, want)
		}
	}
}

// TestServiceFlagsMatchC: the SVC_F_* values the reconciler writes into a
// master are those of enum svc_flags in bpf/lib/structs.h (an enum no
// program stores, so bpf2go cannot generate it).
func TestServiceFlagsMatchC(t *testing.T) {
	src, err := os.ReadFile("../../bpf/lib/structs.h")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\s*(SVC_F_[A-Z_]+) = (\d+),`)
	got := map[string]uint8{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		got[m[1]] = uint8(v)
	}
	want := map[string]uint8{
		"SVC_F_EXTERNAL":   reconciler.FlagExternal,
		"SVC_F_LOCAL":      reconciler.FlagLocal,
		"SVC_F_SRC_RANGES": reconciler.FlagSourceRanges,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("enum svc_flags in structs.h = %v, reconciler has %v", got, want)
	}
}
