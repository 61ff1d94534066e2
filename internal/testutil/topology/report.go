package topology

// Reporting servers: what a test that checks address translation puts at
// every place a packet may land (a backend, the original destination, a
// trap for packets that leak). Each one answers a request with who it is,
// the address the request reached it on and the source it came from, and
// also writes that down in a SeenLog, so that a request whose reply never
// makes it back (a flow whose return path bypasses the translating node)
// still says where it went.
//
// The wire format is one line (TCP) or one datagram (UDP) each way: the
// client sends a token, the server answers
//
//	<token> <name> <local addr:port> <peer addr:port>

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Seen is one request a reporting server received.
type Seen struct {
	// Name is the server's, as given to ServeReport.
	Name string
	// Local is the address the request reached the server on; Peer is
	// its source as the server saw it.
	Local, Peer netip.AddrPort
	Token       string
	At          time.Time
}

// Report is what a reporting server answers, parsed (ParseReport).
type Report struct {
	Token, Name string
	Local, Peer netip.AddrPort
}

// ParseReport reads a reporting server's answer.
func ParseReport(answer string) (Report, error) {
	f := strings.Fields(answer)
	if len(f) != 4 {
		return Report{}, fmt.Errorf("not a report: %q", answer)
	}
	local, err1 := netip.ParseAddrPort(f[2])
	peer, err2 := netip.ParseAddrPort(f[3])
	if err := errors.Join(err1, err2); err != nil {
		return Report{}, fmt.Errorf("not a report: %q: %w", answer, err)
	}
	return Report{Token: f[0], Name: f[1], Local: local, Peer: peer}, nil
}

// SeenLog collects what reporting servers received, by token. It is safe
// for concurrent use; one log may serve any number of servers.
type SeenLog struct {
	mu      sync.Mutex
	byToken map[string][]Seen
}

func (l *SeenLog) add(s Seen) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byToken == nil {
		l.byToken = map[string][]Seen{}
	}
	l.byToken[s.Token] = append(l.byToken[s.Token], s)
}

// Lookup returns what the servers received with token, first first.
func (l *SeenLog) Lookup(token string) []Seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Seen(nil), l.byToken[token]...)
}

// ServeReport starts a reporting server named name (no spaces) on addr,
// for network "tcp4", "udp4", "tcp6" or "udp6", recording every request in
// log (nil: no record). An unspecified address (0.0.0.0, ::) listens on all
// of the namespace's addresses of the network's family.
func (n *NS) ServeReport(network string, addr netip.AddrPort, name string, log *SeenLog) (*Server, error) {
	if strings.ContainsAny(name, " \t\n") || name == "" {
		return nil, fmt.Errorf("report server name %q: want one word", name)
	}
	if log == nil {
		log = &SeenLog{}
	}
	switch network {
	case "tcp4", "tcp6":
		return n.serveReportTCP(network, addr, name, log)
	case "udp4", "udp6":
		return n.serveReportUDP(network, addr, name, log)
	}
	return nil, fmt.Errorf("report server: network %q: want tcp4, udp4, tcp6 or udp6", network)
}

func (n *NS) serveReportTCP(network string, addr netip.AddrPort, name string, log *SeenLog) (*Server, error) {
	l, err := n.Listen(network, addr.String())
	if err != nil {
		return nil, fmt.Errorf("report server %s tcp %s in %s: %w", name, addr, n.Name, err)
	}
	s := serveConns(l, name, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		local, peer := addrPortOf(c.LocalAddr()), addrPortOf(c.RemoteAddr())
		token := strings.TrimSpace(line)
		log.add(Seen{Name: name, Local: local, Peer: peer, Token: token, At: time.Now()})
		// The client sees a failed reply as a missing answer.
		_, _ = fmt.Fprintf(c, "%s %s %s %s\n", token, name, local, peer)
	})
	return n.track(s), nil
}

func (n *NS) serveReportUDP(network string, addr netip.AddrPort, name string, log *SeenLog) (*Server, error) {
	pc, err := n.ListenPacket(network, addr.String())
	if err != nil {
		return nil, fmt.Errorf("report server %s udp %s in %s: %w", name, addr, n.Name, err)
	}
	c := pc.(*net.UDPConn)
	// A socket bound to all addresses learns each datagram's destination
	// from IP_PKTINFO (IPV6_PKTINFO), and answers from it: a reply from another of the
	// namespace's addresses would not match the client's connected
	// socket.
	wildcard := addr.Addr().IsUnspecified()
	if wildcard {
		rc, err := c.SyscallConn()
		if err == nil {
			err = rc.Control(func(fd uintptr) {
				if network == "udp6" {
					err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
				} else {
					err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
				}
			})
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("report server %s udp %s in %s: IP_PKTINFO: %w", name, addr, n.Name, err)
		}
	}
	s := &Server{Name: name, Addr: c.LocalAddr(), close: c.Close}
	bound := addrPortOf(c.LocalAddr())
	s.wg.Go(func() {
		buf, oob := make([]byte, 2048), make([]byte, 256)
		for {
			k, oobn, _, from, err := c.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			local, reply := bound, []byte(nil)
			if dst, ok := pktinfoDst(oob[:oobn]); ok && wildcard {
				local = netip.AddrPortFrom(dst, bound.Port())
				if dst.Is4() {
					reply = unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: dst.As4()})
				} else {
					reply = unix.PktInfo6(&unix.Inet6Pktinfo{Addr: dst.As16()})
				}
			}
			peer := netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			token := strings.TrimSpace(string(buf[:k]))
			log.add(Seen{Name: name, Local: local, Peer: peer, Token: token, At: time.Now()})
			_, _, _ = c.WriteMsgUDPAddrPort(fmt.Appendf(nil, "%s %s %s %s", token, name, local, peer), reply, from)
		}
	})
	return n.track(s), nil
}

// pktinfoDst reads a datagram's destination address from its IP_PKTINFO
// control message.
func pktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			// struct in_pktinfo: ifindex (4), spec_dst (4), addr (4): addr
			// is the header's destination.
			return netip.AddrFrom4([4]byte(m.Data[8:12])), true
		}
		if m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo {
			// struct in6_pktinfo: addr (16), ifindex (4).
			return netip.AddrFrom16([16]byte(m.Data[0:16])), true
		}
	}
	return netip.Addr{}, false
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
