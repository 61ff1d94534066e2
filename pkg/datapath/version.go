package datapath

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/cilium/ebpf"
)

// objects are the BPF objects this package embeds, in the order of their
// file names (ctgc_bpfel.o, migrate_bpfel.o, sock_bpfel.o,
// sockdestroy_bpfel.o, tc_bpfel.o, xdp_bpfel.o), which is the order the
// digest covers them in. TestObjectsDigestCoversTheCommittedObjects fails
// when one is missing.
func objects() []struct {
	bytes []byte
	load  func() (*ebpf.CollectionSpec, error)
} {
	return []struct {
		bytes []byte
		load  func() (*ebpf.CollectionSpec, error)
	}{
		{_CtgcBytes, loadCtgc},
		{_MapcountBytes, loadMapcount},
		{_MigrateBytes, loadMigrate},
		{_SockBytes, loadSock},
		{_SockdestroyBytes, loadSockdestroy},
		{_TcBytes, loadTc},
		{_XdpBytes, loadXdp},
	}
}

// ObjectsDigest identifies the BPF programs this agent loads: the SHA-256
// of the committed objects, concatenated in file name order, as
// `cat pkg/datapath/*_bpfel.o | sha256sum` prints it. `sluice --version`
// reports it, so two agents built from different trees with the same
// objects are known to run the same datapath.
func ObjectsDigest() string {
	h := sha256.New()
	for _, o := range objects() {
		h.Write(o.bytes)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
