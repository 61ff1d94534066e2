package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// North-south helpers beside the reconciler: conntrack garbage collection,
// following the node's routing for XDP's route cache, and the --node-ip
// flag. (loadBalancerSourceRanges are the reconciler's,
// health check ports an agent Observer: see runAgent.)

// routingWatch is a running watch of the node's routing
// (*datapath.RoutingWatch).
type routingWatch interface {
	Done() <-chan struct{}
	Close() error
}

// watchRouting starts dp's watch of the node's routing.
func watchRouting(dp *datapath.Datapath) func() (routingWatch, error) {
	return func() (routingWatch, error) {
		w, err := dp.WatchRouting()
		if err != nil {
			return nil, err
		}
		return w, nil
	}
}

// followRouting keeps XDP's route cache following the node's routing
// (watch: datapath.WatchRouting) until ctx is done. A watch that fails
// is logged and started again after retry: meanwhile XDP uses a cached
// route for at most its age (1s).
func followRouting(ctx context.Context, watch func() (routingWatch, error), retry time.Duration, log *slog.Logger) {
	datapath.FollowWatch(ctx, watch, retry, log, "following the node's routing for the XDP route cache",
		"cached routes are used until they age out")
}

// conntrackGC is what runConntrackGC needs of *datapath.Maps.
type conntrackGC interface {
	GCConntrack() (datapath.ConntrackStats, error)
	ConntrackRefused() (uint64, error)
	ConntrackEntries() (n, size int, err error)
}

// ctUpkeep is the agent's conntrackGC: the maps' collection and refusal
// counter, and the datapath's count of the table's entries.
type ctUpkeep struct {
	*datapath.Maps
	dp *datapath.Datapath
}

func (c ctUpkeep) ConntrackEntries() (n, size int, err error) { return c.dp.ConntrackEntries() }

// observedGC is a conntrackGC whose collections are recorded in metrics.
type observedGC struct {
	conntrackGC
	observe func(deleted int, err error) // metrics.Metrics.ObserveConntrackGC
	// metrics.Metrics.SetConntrackHalfOpen, or nil.
	halfOpen func(found, counted, resyncs int)
}

func (o observedGC) GCConntrack() (datapath.ConntrackStats, error) {
	st, err := o.conntrackGC.GCConntrack()
	o.observe(st.Deleted, err)
	if err == nil && o.halfOpen != nil {
		resyncs := 0
		for _, d := range st.HalfOpenResynced {
			if d != 0 {
				resyncs++
			}
		}
		o.halfOpen(st.HalfOpen, st.HalfOpenCounted, resyncs)
	}
	return st, err
}

// runConntrackGC deletes expired conntrack entries every period until ctx
// is done. Established flows are deleted by nothing else: their table is
// not an LRU, so that new flows cannot evict them, and when it is full new
// flows stay in the LRU of half-open ones, where a flood may evict them
// (a port reservation, which needs the table, is refused). So the
// collection speeds up under pressure: every 5s while the table is over
// half full, every second while it is over 3/4 full, and at once when the
// datapath had no room for flows since the last one (the counters polled
// every second) or when the table, expired entries included, is 3/4 full
// (the kernel's count, polled every second where it has one): short
// flows (a client opening thousands a second) fill the table with expired
// entries between two collections (before the datapath kept such flows
// in the LRU, each was refused, a client stalled a second: the bench's
// last VIP lost a quarter of its connections per second so). A sweep of
// a full table of 262144 entries takes milliseconds. Pressure is logged:
// flows without room (at once, then summed at most once a minute:
// warnRefused), or a table over 90% full.
func runConntrackGC(ctx context.Context, m conntrackGC, every time.Duration, log *slog.Logger) {
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	g := newCTCollector(m, every, time.Now, log)
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
		g.poll()
	}
}

// ctCollector is runConntrackGC's state from one poll to the next.
type ctCollector struct {
	m     conntrackGC
	every time.Duration
	log   *slog.Logger
	// now is the collector's clock: time.Now in the agent; a test's own,
	// which it moves on instead of waiting.
	now func() time.Time
	// next is the interval in force (shorter under pressure), last when
	// the last collection ended (or the collector started), refused the
	// refusal counter as it was then.
	next    time.Duration
	last    time.Time
	refused uint64
	// warned is when refusals were last logged (zero: never); unlogged
	// how many the collections counted that are not logged yet, held
	// whether a poll kept some of them back; table the last collection
	// that counted some (warnRefused).
	warned   time.Time
	unlogged uint64
	held     bool
	table    datapath.ConntrackStats
	// fullWarned is when a nearly full table was last logged (zero:
	// never): at most once a refusalWarnEvery too, as a table that
	// stays over 90% full is collected every second.
	fullWarned time.Time
}

// refusalWarnEvery is how often at most the collector warns of flows the
// table had no room for. A flood (a SYN flood, a client opening flows
// faster than they expire) refuses flows every second, and each refusal
// makes the collector collect at once, so a warning per collection was
// one a second for as long as the flood lasted: the first says what is
// happening, and then one a minute, with the refusals summed since the
// last, says that it goes on and how hard, as the device watch's
// "changes missed" warning is rate-limited. The refusal counter and the
// metrics count every refusal still.
const refusalWarnEvery = time.Minute

// newCTCollector starts the collector's state at now(), with the
// refusal counter as it is then.
func newCTCollector(m conntrackGC, every time.Duration, now func() time.Time, log *slog.Logger) *ctCollector {
	g := &ctCollector{m: m, every: every, log: log, now: now, next: every, last: now()}
	refused, err := m.ConntrackRefused()
	if err != nil {
		log.Error("conntrack garbage collection", "err", err)
	}
	g.refused = refused
	return g
}

// poll is one of runConntrackGC's polls (every second): it collects if
// the datapath had no room for flows since the last collection, if the
// interval in force has passed since it, or if the table is filling up,
// and says whether it collected (failed collections included); then it
// logs the refusals not logged yet if it is time to (warnRefused).
func (g *ctCollector) poll() bool {
	collected := g.collect()
	g.warnRefused()
	return collected
}

// warnRefused logs the refusals counted and not logged yet: at once if
// none were logged for refusalWarnEvery (the first of a flood), with the
// collection that counted them; else once that long has passed since
// the last warning, summed, with that time ("over") and the table as the
// last collection that counted some found it. A flood that stops leaves
// its last refusals to the first poll refusalWarnEvery after the last
// warning, whether that poll collects or not.
func (g *ctCollector) warnRefused() {
	if g.unlogged == 0 {
		return
	}
	now := g.now()
	if !g.warned.IsZero() && now.Sub(g.warned) < refusalWarnEvery {
		g.held = true
		return
	}
	const msg = "conntrack table or half-open share full: new flows refused or kept in the LRU"
	st := &g.table
	if !g.held { // this poll's collection counted them all
		g.log.Warn(msg, "refused", g.unlogged, "established", st.Live, "max", st.Max, "deleted", st.Deleted)
	} else {
		g.log.Warn(msg, "refused", g.unlogged, "over", now.Sub(g.warned), "established", st.Live, "max", st.Max)
	}
	g.warned, g.unlogged, g.held = now, 0, false
}

// collect is poll's collection, if one is due; it says whether it
// collected.
func (g *ctCollector) collect() bool {
	r, err := g.m.ConntrackRefused()
	if err == nil && r == g.refused && g.now().Sub(g.last) < g.next && !filling(g.m, g.log) {
		return false
	}
	st, err := g.m.GCConntrack()
	g.last = g.now()
	for i, d := range st.HalfOpenResynced {
		if d != 0 {
			// Negative: flows counted and never taken off, which
			// refuse new source-NATed flows once they hold the share.
			// (Made, and so logged, before an error too.)
			g.log.Warn("conntrack half-open count corrected: it drifted from the flows the collections found", "family", []int{4, 6}[i], "by", d)
		}
	}
	if err != nil {
		g.log.Error("conntrack garbage collection", "err", err)
		g.next = g.every
		return true
	}
	switch {
	case st.Refused > g.refused:
		g.unlogged += st.Refused - g.refused
		g.table = st // logged by warnRefused
	case st.Live*10 >= st.Max*9:
		if now := g.now(); g.fullWarned.IsZero() || now.Sub(g.fullWarned) >= refusalWarnEvery {
			g.log.Warn("conntrack table nearly full", "established", st.Live, "max", st.Max, "deleted", st.Deleted)
			g.fullWarned = now
		}
	case st.Deleted > 0:
		g.log.Debug("conntrack garbage collection", "deleted", st.Deleted, "established", st.Live,
			"half_open", st.HalfOpen, "half_open_counted", st.HalfOpenCounted, "half_open_max", st.HalfOpenMax)
	}
	g.refused = st.Refused
	switch {
	case st.Live*4 >= st.Max*3:
		g.next = min(g.every, time.Second)
	case st.Live*2 >= st.Max:
		g.next = min(g.every, 5*time.Second)
	default:
		g.next = g.every
	}
	return true
}

// filling says whether m's table, expired entries included, is 3/4 full:
// time to collect before it refuses flows. A count that fails is logged
// and taken as not full (the refusal counter still speeds the GC up).
func filling(m conntrackGC, log *slog.Logger) bool {
	n, size, err := m.ConntrackEntries()
	if err != nil {
		log.Error("conntrack table entries", "err", err)
		return false
	}
	return size > 0 && n*4 >= size*3
}

// parseNodeIPs parses --node-ip: comma-separated addresses of either
// family, in any order (a dual-stack node's "IPv4,IPv6" or "IPv6,IPv4",
// as kubelet's --node-ip); the first of each family is the node's primary
// address of it. An IPv4-mapped address is IPv4.
func parseNodeIPs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range splitList(s) {
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("--node-ip %q: %w", f, err)
		}
		if a = a.Unmap(); a.IsUnspecified() || a.IsLoopback() || a.Zone() != "" {
			return nil, errors.New("--node-ip " + f + ": not an address of this node to serve NodePorts on")
		}
		out = append(out, a)
	}
	return out, nil
}
