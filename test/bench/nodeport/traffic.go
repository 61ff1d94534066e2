package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// udpResult is one UDP round against one mode.
type udpResult struct {
	SentPPS float64 `json:"sent_pps"`
	RecvPPS float64 `json:"recv_pps"` // arrived at the backend
	Loss    float64 `json:"loss"`     // 1 - recv/sent
}

// tcpResult is one TCP round against one mode.
type tcpResult struct {
	ConnsPerSec float64 `json:"conns_per_sec"`
	Errors      int64   `json:"errors"`
}

// udpLoad sends small datagrams from senders goroutines, each over flows
// connected sockets (distinct source ports) to the node's NodePort, for d,
// and counts what reaches the backend.
func (l *lab) udpLoad(ctx context.Context, n *node, nodePort int, senders, flows int, payload int, d time.Duration) (udpResult, error) {
	dst := netip.AddrPortFrom(n.addr, uint16(nodePort)).String()
	conns := make([][]net.Conn, senders)
	defer func() {
		for _, cs := range conns {
			for _, c := range cs {
				c.Close()
			}
		}
	}()
	for i := range conns {
		for range flows {
			c, err := l.gen.DialContext(ctx, "udp4", dst)
			if err != nil {
				return udpResult{}, fmt.Errorf("udp socket to %s: %w", dst, err)
			}
			conns[i] = append(conns[i], c)
		}
	}
	// Warm up: neighbours resolve, conntrack entries exist.
	buf := make([]byte, payload)
	for range 3 {
		for _, cs := range conns {
			for _, c := range cs {
				// A datagram lost or refused while warming up is
				// fine: the measurement counts what arrives.
				_, _ = c.Write(buf)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)

	before, err := l.backendRxPackets()
	if err != nil {
		return udpResult{}, err
	}
	var stop atomic.Bool
	var sent atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for _, cs := range conns {
		wg.Go(func() {
			b := make([]byte, payload)
			var count int64
			for !stop.Load() && ctx.Err() == nil {
				for _, c := range cs {
					if _, err := c.Write(b); err == nil {
						count++
					}
				}
			}
			sent.Add(count)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	time.Sleep(200 * time.Millisecond) // in flight
	after, err := l.backendRxPackets()
	if err != nil {
		return udpResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return udpResult{}, err
	}
	r := udpResult{
		SentPPS: float64(sent.Load()) / elapsed.Seconds(),
		RecvPPS: float64(after-before) / elapsed.Seconds(),
	}
	if r.SentPPS > 0 {
		r.Loss = 1 - r.RecvPPS/r.SentPPS
	}
	return r, nil
}

// serveTCP runs the backend's TCP server on :8080 for every endpoint
// address: read one byte, answer one byte, wait for the client to go.
func serveTCP(be *topology.NS) (io.Closer, error) {
	ln, err := be.Listen("tcp4", fmt.Sprintf(":%d", tcpPort))
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 1)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if _, err := c.Write(b); err != nil {
					return
				}
				_, _ = c.Read(b) // until the client's reset, the expected error
			}()
		}
	}()
	return ln, nil
}

// tcpLoad opens short connections from workers goroutines to the node's
// NodePort for d: connect, one byte each way, close with a reset (no
// TIME_WAIT anywhere, so ports are never exhausted or reused early).
func (l *lab) tcpLoad(ctx context.Context, n *node, nodePort int, workers int, d time.Duration) (tcpResult, error) {
	dst := netip.AddrPortFrom(n.addr, uint16(nodePort)).String()
	if err := oneConn(ctx, l.gen, dst); err != nil { // warm up
		return tcpResult{}, fmt.Errorf("TCP to %s (%s): %w", dst, n.mode, err)
	}
	var done, errs atomic.Int64
	var lastErr atomic.Value
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := oneConn(ctx, l.gen, dst); err != nil {
					errs.Add(1)
					lastErr.Store(err)
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return tcpResult{}, err
	}
	r := tcpResult{ConnsPerSec: float64(done.Load()) / elapsed.Seconds(), Errors: errs.Load()}
	if done.Load() == 0 {
		err, _ := lastErr.Load().(error)
		return r, fmt.Errorf("no TCP connection through %s completed: %v", n.mode, err)
	}
	return r, nil
}

func oneConn(ctx context.Context, gen *topology.NS, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := gen.DialContext(ctx, "tcp4", dst)
	if err != nil {
		return err
	}
	tc := c.(*net.TCPConn)
	defer func() {
		// Linger 0: close with a reset and leave no TIME_WAIT socket.
		// Should that fail, the socket waits out TIME_WAIT, nothing worse.
		_ = tc.SetLinger(0)
		tc.Close()
	}()
	tc.SetDeadline(time.Now().Add(time.Second))
	b := []byte{'x'}
	if _, err := tc.Write(b); err != nil {
		return err
	}
	if _, err := io.ReadFull(tc, b); err != nil {
		return err
	}
	if b[0] != 'x' {
		return errors.New("wrong answer")
	}
	return nil
}
