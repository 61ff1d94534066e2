package modeltest

import (
	"net/netip"

	"github.com/sluice-lb/sluice/pkg/model"
)

// L4 returns the frontend or backend addr:port/proto for a test's
// fixtures; addr must parse (netip.MustParseAddr).
func L4(addr string, port uint16, proto model.Protocol) model.L4Addr {
	return model.L4Addr{Addr: netip.MustParseAddr(addr), Port: port, Proto: proto}
}
