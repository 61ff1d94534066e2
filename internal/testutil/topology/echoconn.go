package topology

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// EchoConn is a TCP connection to a ServeTCPEcho server (through whatever
// translates its address) and the server that first answered on it: a
// long-lived connection whose backend a test can check again later.
type EchoConn struct {
	net.Conn
	r *bufio.Reader
	// Backend is the name of the server that echoed the first line.
	Backend string
}

// MustDialEcho is DialEcho within timeout (and t's life), failing t if it
// fails.
func (n *NS) MustDialEcho(t testing.TB, addr string, timeout time.Duration) *EchoConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	c, err := n.DialEcho(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DialEcho connects from n to addr within ctx and says a first line, which
// names the backend. The connection is closed if that fails.
func (n *NS) DialEcho(ctx context.Context, addr string) (*EchoConn, error) {
	c, err := n.DialContext(ctx, family("tcp", addr), addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	ec := &EchoConn{Conn: c, r: bufio.NewReader(c)}
	if ec.Backend, err = ec.Say("hello"); err != nil {
		_ = c.Close() // the error to report is the first line's
		return nil, fmt.Errorf("first line on %s: %w", addr, err)
	}
	return ec, nil
}

// Say sends msg and returns the name of the server that echoed it, within
// 3 s.
func (c *EchoConn) Say(msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	who, got, _ := strings.Cut(strings.TrimSpace(line), " ")
	if got != msg {
		return "", fmt.Errorf("echo %q for %q", line, msg)
	}
	return who, nil
}
