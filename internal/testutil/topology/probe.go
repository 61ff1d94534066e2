package topology

// Probes: one client request, and what became of it, told apart the way a
// test of a proxy needs: answered (and by what), refused at once (an ICMP
// port unreachable or a TCP reset: ECONNREFUSED), nothing back before the
// timeout, or another error. A probe runs in a namespace of this process
// (NS.Probe) or in a Prober, a child process that can also sit in a
// cgroup (socket load balancing applies to the sockets of the processes in
// a cgroup, not to a namespace).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"
)

// Probe is one request: from Src (bound; an invalid address leaves the
// socket unbound, port 0 lets the kernel choose) to Dst over Network
// ("tcp4", "udp4", "tcp6" or "udp6"). Without HTTP, Token is sent as a line (TCP) or a
// datagram (UDP, resent every UDPResend until an answer or the timeout,
// always from the same socket) and one line or datagram is read back: a
// reporting server's answer (ServeReport). With HTTP, a GET / is sent over
// TCP and the status and body are read.
type Probe struct {
	Network string         `json:"network"`
	Src     netip.AddrPort `json:"src"`
	Dst     netip.AddrPort `json:"dst"`
	Token   string         `json:"token,omitempty"`
	HTTP    bool           `json:"http,omitempty"`
	Timeout time.Duration  `json:"timeout"`
}

// UDPResend is how often a UDP probe resends its datagram while waiting.
const UDPResend = 200 * time.Millisecond

// Outcome is how a probe ended.
type Outcome string

const (
	// Answered: something answered (Answer, or Status and Answer for HTTP).
	Answered Outcome = "answered"
	// Refused: ECONNREFUSED, from a TCP reset or an ICMP port unreachable.
	Refused Outcome = "refused"
	// TimedOut: nothing came back before the timeout.
	TimedOut Outcome = "timeout"
	// Failed: any other error (Err says which).
	Failed Outcome = "error"
)

// ProbeResult is what became of a probe.
type ProbeResult struct {
	Outcome Outcome `json:"outcome"`
	// Answer is the line or datagram read back (HTTP: the body).
	Answer string `json:"answer,omitempty"`
	// Status is the HTTP status code.
	Status int `json:"status,omitempty"`
	// Local is the client socket's own address once connected (or bound).
	Local netip.AddrPort `json:"local"`
	Err   string         `json:"err,omitempty"`
	Took  time.Duration  `json:"took"`
}

func (r ProbeResult) String() string {
	switch r.Outcome {
	case Answered:
		if r.Status != 0 {
			return fmt.Sprintf("answered HTTP %d %q", r.Status, r.Answer)
		}
		return fmt.Sprintf("answered %q", r.Answer)
	case Failed:
		return "error: " + r.Err
	}
	return string(r.Outcome)
}

// Probe runs p from inside the namespace (its socket is created there).
func (n *NS) Probe(p Probe) ProbeResult {
	var r ProbeResult
	if err := n.Do(func() error {
		r = RunProbe(p)
		return nil
	}); err != nil {
		return ProbeResult{Outcome: Failed, Err: err.Error()}
	}
	return r
}

// RunProbe runs p in the calling thread's namespace.
func RunProbe(p Probe) ProbeResult {
	start := time.Now()
	var r ProbeResult
	switch p.Network {
	case "tcp4", "tcp6":
		r = probeTCP(p)
	case "udp4", "udp6":
		r = probeUDP(p)
	default:
		r = ProbeResult{Outcome: Failed, Err: fmt.Sprintf("network %q: want tcp4, udp4, tcp6 or udp6", p.Network)}
	}
	r.Took = time.Since(start)
	return r
}

// classify turns a dial, read or write error into an outcome.
func classify(r *ProbeResult, err error) ProbeResult {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		r.Outcome = Refused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		r.Outcome = TimedOut
	default:
		r.Outcome = Failed
	}
	r.Err = err.Error()
	return *r
}

func probeTCP(p Probe) ProbeResult {
	var r ProbeResult
	d := net.Dialer{Timeout: p.Timeout}
	if p.Src.Addr().IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(p.Src)
	}
	deadline := time.Now().Add(p.Timeout)
	c, err := d.Dial(p.Network, p.Dst.String())
	if err != nil {
		return classify(&r, err)
	}
	defer c.Close()
	r.Local = addrPortOf(c.LocalAddr())
	c.SetDeadline(deadline)
	if p.HTTP {
		// A failed write shows as the read below failing.
		_, _ = fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", p.Dst)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return classify(&r, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return classify(&r, err)
		}
		r.Outcome, r.Status, r.Answer = Answered, resp.StatusCode, strings.TrimSpace(string(body))
		return r
	}
	if _, err := fmt.Fprintf(c, "%s\n", p.Token); err != nil {
		return classify(&r, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return classify(&r, err)
	}
	r.Outcome, r.Answer = Answered, strings.TrimSpace(line)
	return r
}

func probeUDP(p Probe) ProbeResult {
	var r ProbeResult
	var laddr *net.UDPAddr
	if p.Src.Addr().IsValid() {
		laddr = net.UDPAddrFromAddrPort(p.Src)
	}
	c, err := net.DialUDP(p.Network, laddr, net.UDPAddrFromAddrPort(p.Dst))
	if err != nil {
		return classify(&r, err)
	}
	defer c.Close()
	r.Local = addrPortOf(c.LocalAddr())
	deadline := time.Now().Add(p.Timeout)
	buf := make([]byte, 2048)
	for {
		if _, err := c.Write([]byte(p.Token)); err != nil {
			return classify(&r, err)
		}
		next := time.Now().Add(UDPResend)
		if next.After(deadline) {
			next = deadline
		}
		c.SetReadDeadline(next)
		k, err := c.Read(buf)
		if err == nil {
			r.Outcome, r.Answer = Answered, string(buf[:k])
			return r
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(deadline) {
			return classify(&r, err)
		}
	}
}
