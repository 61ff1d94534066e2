// Package load is the benchmark's traffic: a backend server that answers for
// every backend address, and a client that opens short TCP connections
// (connect, 1-byte request, reply, close) as fast as a few workers can,
// recording each connection's latency. Both run as child processes of the
// benchmark (re-executions of its own binary) placed in the namespace, and
// for the socket-layer runs the cgroup (the parent starts them in it with
// CLONE_INTO_CGROUP), they measure from.
package load

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"
)

// RoleEnv selects a child role in the benchmark binary.
const RoleEnv = "SLUICE_BENCH_ROLE"

// Request bytes: ReqPing gets one byte back, ReqWho gets the backend's
// local address (16 bytes, an IPv4 one mapped), which tells a prober which
// endpoint answered.
const (
	ReqPing = 'p'
	ReqWho  = 'w'
)

// Serve listens on addr and answers until the process is killed. It prints
// "ready" on stdout once listening.
func Serve(addr string) error {
	lc := net.ListenConfig{}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			time.Sleep(time.Millisecond) // EMFILE and friends: back off, keep serving
			continue
		}
		go handle(c)
	}
}

func handle(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	switch b[0] {
	case ReqWho:
		la := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().As16()
		_, _ = c.Write(la[:])
	default:
		_, _ = c.Write([]byte{'r'})
	}
	// Wait for the client's close so the client, not the server, holds
	// TIME_WAIT, as with a real short-lived client.
	_, _ = io.Copy(io.Discard, c)
}

// ClientConfig is what a client child runs.
type ClientConfig struct {
	Targets     []string      `json:"targets"`      // ip:port, picked at random per connection
	Sources     []string      `json:"sources"`      // local source addresses, round robin; empty = kernel's choice
	Workers     int           `json:"workers"`      // concurrent connections
	Duration    time.Duration `json:"duration"`     // stop after this long
	MaxConns    int           `json:"max_conns"`    // and after this many connections
	DialTimeout time.Duration `json:"dial_timeout"` // per connection
}

// ClientResult is a client child's report.
type ClientResult struct {
	Conns      int     `json:"conns"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"`
	ConnsPerS  float64 `json:"conns_per_s"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
}

// RunClient runs the client described by cfg.
func RunClient(cfg ClientConfig) (ClientResult, error) {
	if len(cfg.Targets) == 0 {
		return ClientResult{}, errors.New("no targets")
	}
	targets := make([]netip.AddrPort, len(cfg.Targets))
	for i, t := range cfg.Targets {
		ap, err := netip.ParseAddrPort(t)
		if err != nil {
			return ClientResult{}, err
		}
		targets[i] = ap
	}
	var sources []*net.TCPAddr
	for _, s := range cfg.Sources {
		sources = append(sources, &net.TCPAddr{IP: net.ParseIP(s)})
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	type workerOut struct {
		lat   []time.Duration
		errs  int
		first string
	}
	outs := make([]workerOut, cfg.Workers)
	var mu sync.Mutex
	issued := 0
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if cfg.MaxConns > 0 && issued >= cfg.MaxConns {
			return false
		}
		issued++
		return true
	}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			o := &outs[w]
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			n := 0
			for time.Now().Before(deadline) && take() {
				d := net.Dialer{Timeout: cfg.DialTimeout}
				if len(sources) > 0 {
					d.LocalAddr = sources[(w+n*cfg.Workers)%len(sources)]
				}
				n++
				t := targets[rng.IntN(len(targets))]
				t0 := time.Now()
				err := oneConn(&d, t, ReqPing, nil)
				if err != nil {
					o.errs++
					if o.first == "" {
						o.first = err.Error()
					}
					continue
				}
				o.lat = append(o.lat, time.Since(t0))
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	var res ClientResult
	var lat []time.Duration
	for _, o := range outs {
		lat = append(lat, o.lat...)
		res.Errors += o.errs
		if res.FirstError == "" {
			res.FirstError = o.first
		}
	}
	res.Conns = len(lat)
	res.Seconds = el.Seconds()
	res.ConnsPerS = float64(res.Conns) / el.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50us = float64(Percentile(lat, 0.50)) / 1e3
		res.P99us = float64(Percentile(lat, 0.99)) / 1e3
	}
	return res, nil
}

// Percentile returns the p-quantile (nearest rank) of sorted values, the
// zero value for none.
func Percentile[T cmp.Ordered](sorted []T, p float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// oneConn makes one short connection: connect, one request byte, the reply,
// close. With ReqWho it stores the answering backend's address in who.
func oneConn(d *net.Dialer, t netip.AddrPort, req byte, who *netip.Addr) error {
	c, err := d.Dial("tcp", t.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d.Timeout))
	if _, err := c.Write([]byte{req}); err != nil {
		return err
	}
	n := 1
	if req == ReqWho {
		n = 16
	}
	var b [16]byte
	if _, err := io.ReadFull(c, b[:n]); err != nil {
		return err
	}
	if who != nil {
		*who = netip.AddrFrom16(b).Unmap()
	}
	return nil
}

// Who connects once to t and returns the backend address that answered. It
// uses the calling thread's network namespace (see topo.InNetns).
func Who(t netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	var who netip.Addr
	d := net.Dialer{Timeout: timeout}
	err := oneConn(&d, t, ReqWho, &who)
	return who, err
}

// Ping connects once to t. Like Who, in the calling thread's namespace.
func Ping(t netip.AddrPort, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	return oneConn(&d, t, ReqPing, nil)
}

// ChildMain runs the role named in RoleEnv, if any, and exits; it returns
// when the process is not a child. Call it first thing in main (and in
// TestMain).
func ChildMain() {
	switch os.Getenv(RoleEnv) {
	case "":
		return
	case "server":
		if err := Serve(os.Getenv("SLUICE_BENCH_LISTEN")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "client":
		var cfg ClientConfig
		if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
			fmt.Fprintln(os.Stderr, "client config:", err)
			os.Exit(2)
		}
		res, err := RunClient(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(res)
	default:
		fmt.Fprintln(os.Stderr, "unknown role", os.Getenv(RoleEnv))
		os.Exit(2)
	}
	os.Exit(0)
}
