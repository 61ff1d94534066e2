package datapath

import (
	"crypto/sha256"
	"encoding/hex"
)

// objects are the BPF objects this package embeds, in the order their
// digest covers them: sock, tc, xdp, as bpf2go names their files
// (sock_bpfel.o, tc_bpfel.o, xdp_bpfel.o).
func objects() [][]byte { return [][]byte{_SockBytes, _TcBytes, _XdpBytes} }

// ObjectsDigest identifies the BPF programs this agent loads: the SHA-256
// of the committed objects, concatenated in file name order, as
// `cat pkg/datapath/*_bpfel.o | sha256sum` prints it. `sluice --version`
// reports it, so two agents built from different trees with the same
// objects are known to run the same datapath.
func ObjectsDigest() string {
	h := sha256.New()
	for _, o := range objects() {
		h.Write(o)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
