package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// Server is a test server listening inside a namespace. Each one answers
// with its Name, so a client can tell which backend it reached.
type Server struct {
	Name string
	Addr net.Addr

	closeOnce sync.Once
	closeErr  error
	close     func() error
	wg        sync.WaitGroup
}

// Close stops the server and waits for its goroutines. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.close()
		s.wg.Wait()
	})
	return s.closeErr
}

func (n *NS) track(s *Server) *Server {
	n.topo.Defer(s.Close)
	return s
}

// ServeHTTP starts an HTTP server on addr (e.g. "10.1.1.2:8080") that
// answers every request with "<name>\n" and the header X-Backend: <name>.
func (n *NS) ServeHTTP(addr, name string) (*Server, error) {
	l, err := n.Listen(family("tcp", addr), addr)
	if err != nil {
		return nil, fmt.Errorf("http server %s in %s: %w", addr, n.Name, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Backend", name)
		// A client that went away sees its own error; the server has
		// nobody to tell.
		_, _ = io.WriteString(w, name+"\n")
	})}
	s := &Server{Name: name, Addr: l.Addr(), close: srv.Close}
	s.wg.Go(func() { _ = srv.Serve(l) })
	return n.track(s), nil
}

// ServeTCPEcho starts a TCP server on addr that answers every line it reads
// with "<name> <line>\n", for as long as the connection lasts.
func (n *NS) ServeTCPEcho(addr, name string) (*Server, error) {
	l, err := n.Listen(family("tcp", addr), addr)
	if err != nil {
		return nil, fmt.Errorf("tcp echo server %s in %s: %w", addr, n.Name, err)
	}
	s := serveConns(l, name, func(c net.Conn) {
		r := bufio.NewScanner(c)
		for r.Scan() {
			if _, err := fmt.Fprintf(c, "%s %s\n", name, r.Text()); err != nil {
				return
			}
		}
	})
	return n.track(s), nil
}

// serveConns accepts connections on l and runs handle on each in a
// goroutine of its own; the connection is closed when handle returns.
// Closing the server closes the listener and every open connection, and
// waits for the handlers.
func serveConns(l net.Listener, name string, handle func(net.Conn)) *Server {
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	s := &Server{Name: name, Addr: l.Addr()}
	s.close = func() error {
		err := l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		return err
	}
	s.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			s.wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c)
			})
		}
	})
	return s
}

// ServeUDPEcho starts a UDP server on addr that answers every datagram with
// "<name> <payload>".
func (n *NS) ServeUDPEcho(addr, name string) (*Server, error) {
	pc, err := n.ListenPacket(family("udp", addr), addr)
	if err != nil {
		return nil, fmt.Errorf("udp echo server %s in %s: %w", addr, n.Name, err)
	}
	s := &Server{Name: name, Addr: pc.LocalAddr(), close: pc.Close}
	s.wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if _, err := pc.WriteTo([]byte(name+" "+string(buf[:k])), from); err != nil && errors.Is(err, net.ErrClosed) {
				return
			}
		}
	})
	return n.track(s), nil
}

// WhoAnswered sends GET url with c and returns the name of the server that
// answered (the body of a ServeHTTP server, trimmed).
func WhoAnswered(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read response from %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

// family is network ("tcp" or "udp") of addr's IP family: "tcp6" for an
// IPv6 host (not an IPv4-mapped one), "tcp4" otherwise, so that a server or
// client bound to a literal address never becomes a dual-stack socket.
func family(network, addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() && !ip.Is4In6() {
			return network + "6"
		}
	}
	return network + "4"
}
