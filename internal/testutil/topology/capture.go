package topology

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// SYN is a TCP connection request a SYNCapture saw arrive.
type SYN struct {
	Src, Dst netip.AddrPort
	At       time.Time
}

// SYNCapture records the TCP SYNs (without ACK) that arrive at a device:
// where a connection attempt landed, and with which source, even when its
// handshake never completes because the reply takes a path that bypasses
// the node that translated it.
type SYNCapture struct {
	f *os.File

	mu   sync.Mutex
	syns []SYN
	done chan struct{}
}

// CaptureSYNs starts recording the IPv4 and IPv6 TCP SYNs that arrive at dev (not
// those it sends) until the topology closes.
func (n *NS) CaptureSYNs(dev string) (*SYNCapture, error) {
	var fd int
	err := n.Do(func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture on %s in %s: %w", dev, n.Name, err)
	}
	c := &SYNCapture{f: os.NewFile(uintptr(fd), "capture-"+dev), done: make(chan struct{})}
	rc, err := c.f.SyscallConn()
	if err != nil {
		c.f.Close()
		return nil, err
	}
	go c.run(rc)
	n.topo.Defer(c.Close)
	return c, nil
}

func (c *SYNCapture) run(rc interface {
	Read(func(fd uintptr) bool) error
}) {
	defer close(c.done)
	buf := make([]byte, 256)
	for {
		var k int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			k, _, _, from, rerr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_TRUNC)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err != nil {
			return // closed
		}
		if rerr != nil {
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if s, ok := parseSYN(buf[:min(k, len(buf))]); ok {
			s.At = time.Now()
			c.mu.Lock()
			c.syns = append(c.syns, s)
			c.mu.Unlock()
		}
	}
}

// parseSYN reads an IPv4 or IPv6 packet and returns its addresses if it is
// a TCP SYN without ACK (IPv6: TCP right after the fixed header).
func parseSYN(b []byte) (SYN, bool) {
	var src, dst netip.Addr
	var tcp []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4 && b[9] == unix.IPPROTO_TCP:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl+14 {
			return SYN{}, false
		}
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 { // a later fragment
			return SYN{}, false
		}
		src, dst, tcp = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[ihl:]
	case len(b) >= 40+14 && b[0]>>4 == 6 && b[6] == unix.IPPROTO_TCP:
		src, dst, tcp = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[40:]
	default:
		return SYN{}, false
	}
	const syn, ack = 0x02, 0x10
	if tcp[13]&(syn|ack) != syn {
		return SYN{}, false
	}
	return SYN{
		Src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:2])),
		Dst: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:4])),
	}, true
}

// Match returns the SYNs seen for which keep returns true, first first.
func (c *SYNCapture) Match(keep func(SYN) bool) []SYN {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []SYN
	for _, s := range c.syns {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// Close stops the capture.
func (c *SYNCapture) Close() error {
	err := c.f.Close()
	<-c.done
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
