package namesfile

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// marshalled is the file as json.Marshal encodes a File: what Of and
// WriteState must write, byte for byte.
func marshalled(t *testing.T, bpffs string, s *model.State) []byte {
	t.Helper()
	f := File{BPFFS: filepath.Clean(bpffs), Frontends: []Frontend{}}
	for _, fe := range slices.SortedFunc(s.Services.Keys(), model.L4Addr.Compare) {
		svc := s.Services.Get(fe)
		f.Frontends = append(f.Frontends, Frontend{Frontend: fe.String(), Service: svc.Name.String(), Kind: kindNames[svc.Kind]})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The names written a frontend at a time are json.Marshal's encoding of
// the File, escapes included, for an empty state too.
func TestWriteStateEncodesAsMarshal(t *testing.T) {
	st := model.NewState()
	add := func(addr string, port uint16, proto model.Protocol, name model.ServicePortName, kind model.FrontendKind) {
		fe := model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}
		st.Services.Set(fe, &model.Service{Name: name, Kind: kind, Frontend: fe})
	}
	dir := t.TempDir()
	for i, bpffs := range []string{"/sys/fs/bpf/", `/run/"odd"\bpf<&>`} {
		if i == 1 {
			add("10.96.0.10", 53, model.UDP, model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}, model.ClusterIP)
			add("2001:db8::a", 443, model.TCP, model.ServicePortName{Namespace: "default", Name: "web"}, model.LoadBalancer)
			add("192.168.0.2", 30080, model.UDP, model.ServicePortName{Namespace: "ns", Name: "a<b>&c", Port: "http"}, model.NodePort)
			add("192.168.0.2", 30082, model.TCP, model.ServicePortName{Namespace: "ns", Name: `"q"\`, Port: "http"}, model.NodePort)
			add("192.168.0.2", 30081, model.TCP, model.ServicePortName{Namespace: "ns", Name: "b", Port: "é\u2028\x01"}, model.NodePort)
			add("10.96.0.1", 443, model.TCP, model.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https"}, model.ExternalIP)
		}
		want := marshalled(t, bpffs, st)
		got, err := Of(bpffs, st)
		if err != nil || string(got) != string(want) {
			t.Errorf("Of: %s (%v)\nwant %s", got, err, want)
		}
		path := filepath.Join(dir, fmt.Sprint(i), "names.json")
		if err := WriteState(path, bpffs, st); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
			t.Errorf("WriteState wrote %s (%v)\nwant %s", got, err, want)
		}
	}
}

// WriteState never holds the file whole, nor the names in a File: at
// 3,000 frontends it allocates less than the file is long (the sorted
// frontends and its buffers), where encoding a File allocated twice its
// length and more.
func TestWriteStateAllocatesLessThanTheFile(t *testing.T) {
	st, _ := modeltest.Scale(3000)
	path := filepath.Join(t.TempDir(), "names.json")
	var err error
	alloc := testutil.Allocated(func() { err = WriteState(path, "/sys/fs/bpf", st) })
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if alloc >= uint64(fi.Size()) {
		t.Errorf("writing %d frontends (%d bytes) allocated %d bytes, want less than the file", st.Services.Len(), fi.Size(), alloc)
	}
}
