package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// frontendName spells a frontend and its scope in a list: a two-scope
// frontend's internal scope is marked [internal].
func frontendName(fe reconciler.Frontend) string {
	if fe.Scope == reconciler.ScopeInternal {
		return fe.L4Addr.String() + "[internal]"
	}
	return fe.L4Addr.String()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ServiceRow is one line of `services`: a frontend (and scope).
type ServiceRow struct {
	Frontend string   `json:"frontend"`
	Internal bool     `json:"internal,omitempty"` // the internal scope of a two-scope frontend
	Service  string   `json:"service,omitempty"`  // namespace/name:port, from the names file
	Kind     string   `json:"kind,omitempty"`
	ID       uint32   `json:"id"`
	Count    uint32   `json:"count"`
	Flags    uint8    `json:"flags"`
	Backends []string `json:"backends"` // in slot order
	// Empty says what happens to new connections without backends:
	// refused or dropped; retired: the frontend was removed, new ones
	// are not its, its established flows are still followed.
	Empty string `json:"empty,omitempty"`
	// Stats are the frontend's per-Service counters (--stats), both
	// scopes together: on the default scope's row only.
	Stats *ServiceStats `json:"stats,omitempty"`
}

// ServiceStats are a frontend's counters (sluice --service-metrics),
// summed over CPUs and scopes.
type ServiceStats struct {
	NewFlows uint64            `json:"newFlows"`
	Packets  uint64            `json:"packets"` // tc and XDP only: the socket path translates no packets
	Bytes    uint64            `json:"bytes"`
	Drops    map[string]uint64 `json:"drops"` // by reason, every reason
}

func servicesCmd(fs *flag.FlagSet) runner {
	raw := fs.Bool("raw", false, "print every map entry in the reconciler's dump format (not with -o json, whose rows hold the same entries)")
	stats := fs.Bool("stats", false, "add each frontend's counters: new flows, packets, bytes and drops (counted only while the agent runs with --service-metrics)")
	check := func(c *ctx) error {
		if *raw && c.output == "json" {
			return fmt.Errorf("--raw prints the reconciler's dump format; -o json prints the same entries as rows")
		}
		if *raw && *stats {
			return fmt.Errorf("--raw prints the maps' entries; --stats adds columns to the rows")
		}
		return nil
	}
	return runner{check: check, run: func(c *ctx) error {
		ks, err := c.pins.Dump()
		if err != nil {
			return fmt.Errorf("read maps: %w", err)
		}
		if *raw {
			_, err = io.WriteString(c.stdout, ks.String())
			return err
		}
		names := c.serviceNames()
		rows := serviceRows(ks, names)
		if *stats {
			st, err := c.pins.ServiceStats()
			if err != nil {
				return fmt.Errorf("read per-Service counters: %w", err)
			}
			if st == nil {
				warn(c.stderr, "sluicectl: no per-Service counters pinned (an agent of an older release): --stats shows none\n")
			}
			addStats(rows, st)
		}
		if c.output == "json" {
			return writeJSON(c.stdout, rows)
		}
		return writeServiceTable(c.stdout, rows, *stats, c.output == "wide")
	}}
}

// flagNames spells a master's flags (reconciler.Flag*) for -o wide.
func flagNames(f uint8) string {
	var out []string
	for _, x := range []struct {
		bit  uint8
		name string
	}{{reconciler.FlagExternal, "external"}, {reconciler.FlagLocal, "local"}, {reconciler.FlagSourceRanges, "source-ranges"},
		{reconciler.FlagTwoScopes, "two-scopes"}, {reconciler.FlagDropEmpty, "drop-empty"}, {reconciler.FlagAffinity, "affinity"},
		{reconciler.FlagRetired, "retired"}} {
		if f&x.bit != 0 {
			out = append(out, x.name)
		}
	}
	return or(strings.Join(out, ","))
}

// serviceRows lists the frontends of ks, sorted by frontend, named from
// names (by model.L4Addr's String; may be nil).
func serviceRows(ks *reconciler.KernelState, names map[string]namesfile.Frontend) []ServiceRow {
	fes := make([]reconciler.Frontend, 0, len(ks.Masters))
	for fe := range ks.Masters {
		fes = append(fes, fe)
	}
	slices.SortFunc(fes, reconciler.Frontend.Compare)
	rows := make([]ServiceRow, 0, len(fes))
	for _, fe := range fes {
		m := ks.Masters[fe]
		n := names[fe.L4Addr.String()]
		r := ServiceRow{Frontend: fe.L4Addr.String(), Internal: fe.Scope == reconciler.ScopeInternal,
			Service: n.Service, Kind: n.Kind, ID: uint32(m.ID), Count: m.Count, Flags: m.Flags, Backends: []string{}}
		slots := ks.Slots[fe]
		for _, s := range slices.Sorted(mapKeys(slots)) {
			id := slots[s]
			if b, ok := ks.Backends[id]; ok {
				r.Backends = append(r.Backends, netip.AddrPortFrom(b.Addr, b.Port).String())
			} else {
				r.Backends = append(r.Backends, fmt.Sprintf("<missing backend %d>", id))
			}
		}
		if len(r.Backends) == 0 {
			r.Empty = "refused"
			switch {
			case m.Flags&reconciler.FlagRetired != 0:
				// Removed; kept for its established flows only.
				r.Empty = "retired"
			case m.Flags&reconciler.FlagDropEmpty != 0:
				r.Empty = "dropped"
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// addStats gives each default-scope row of rows its frontend's counters
// from stats.
func addStats(rows []ServiceRow, stats []datapath.ServiceStats) {
	by := make(map[string]datapath.ServiceStats, len(stats))
	for _, s := range stats {
		by[s.Frontend.String()] = s
	}
	for i := range rows {
		s, ok := by[rows[i].Frontend]
		if !ok || rows[i].Internal {
			continue
		}
		rows[i].Stats = &ServiceStats{NewFlows: s.NewFlows, Packets: s.Packets, Bytes: s.Bytes, Drops: s.DropsByReason()}
	}
}

// writeServices prints one line per frontend (and scope: a two-scope
// frontend's internal scope is the line marked "internal"), its Service,
// and its backends in slot order.
func writeServices(w io.Writer, rows []ServiceRow) error {
	return writeServiceTable(w, rows, false, false)
}

// writeServiceTable is writeServices, with stats the frontends' counters
// too (on the default scope's line: they are the frontend's), drops
// summed over reasons (-o json has them by reason), and with wide (-o
// wide) the frontend's kind (from the names file) and its decoded flags.
func writeServiceTable(w io.Writer, rows []ServiceRow, stats, wide bool) error {
	cells := make([][]string, 0, len(rows))
	for _, r := range rows {
		fe := r.Frontend
		if r.Internal {
			fe += " internal"
		}
		bs := strings.Join(r.Backends, " ")
		if r.Empty != "" {
			bs = "(none: connections " + r.Empty + ")"
		}
		row := []string{fe, or(r.Service)}
		if wide {
			row = append(row, or(r.Kind))
		}
		row = append(row, strconv.Itoa(int(r.ID)), strconv.Itoa(int(r.Count)))
		if wide {
			row = append(row, flagNames(r.Flags))
		}
		if stats {
			row = append(row, statsCells(r.Stats)...)
		}
		cells = append(cells, append(row, bs))
	}
	header := []string{"FRONTEND", "SERVICE", "ID", "COUNT"}
	if wide {
		header = []string{"FRONTEND", "SERVICE", "KIND", "ID", "COUNT", "FLAGS"}
	}
	if stats {
		header = append(header, "FLOWS", "PACKETS", "BYTES", "DROPS")
	}
	return tabulate(w, table(append(header, "BACKENDS"), cells))
}

// statsCells are the --stats columns of a row: "-" where it has none.
func statsCells(s *ServiceStats) []string {
	if s == nil {
		return []string{"-", "-", "-", "-"}
	}
	var drops uint64
	for _, n := range s.Drops {
		drops += n
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return []string{u(s.NewFlows), u(s.Packets), u(s.Bytes), u(drops)}
}

// BackendRow is one line of `backends`.
type BackendRow struct {
	ID        uint32   `json:"id"`
	Backend   string   `json:"backend"`   // address:port/protocol
	Frontends []string `json:"frontends"` // whose slots name it, sorted
	Services  []string `json:"services"`  // their Services, from the names file, sorted
}

// serviceNames reads the agent's names file for these pins; without it
// (said on stderr) the Service columns show "-".
func (c *ctx) serviceNames() map[string]namesfile.Frontend {
	names, err := namesfile.Read(c.namesFile, c.bpffs)
	if err != nil {
		warn(c.stderr, "sluicectl: no Service names: %v\n", err)
		return nil
	}
	return names
}

func backendsCmd(*flag.FlagSet) runner {
	return runner{run: func(c *ctx) error {
		ks, err := c.pins.Dump()
		if err != nil {
			return fmt.Errorf("read maps: %w", err)
		}
		names := c.serviceNames()
		rows := backendRows(ks, names)
		if c.output == "json" {
			return writeJSON(c.stdout, rows)
		}
		cells := make([][]string, 0, len(rows))
		for _, r := range rows {
			cells = append(cells, []string{strconv.Itoa(int(r.ID)), r.Backend, or(strings.Join(r.Services, ",")), or(strings.Join(r.Frontends, " "))})
			if c.output == "wide" {
				cells[len(cells)-1] = append(cells[len(cells)-1], strconv.Itoa(len(r.Frontends)))
			}
		}
		header := []string{"ID", "BACKEND", "SERVICES", "FRONTENDS"}
		if c.output == "wide" {
			header = append(header, "USERS") // how many frontends' slots name it
		}
		return tabulate(c.stdout, table(header, cells))
	}}
}

// backendRows lists the backends of ks, sorted by address, port and
// protocol, with the frontends whose slots name them.
func backendRows(ks *reconciler.KernelState, names map[string]namesfile.Frontend) []BackendRow {
	users := map[reconciler.BackendID][]reconciler.Frontend{}
	for fe, slots := range ks.Slots {
		for _, id := range slots {
			if !slices.Contains(users[id], fe) {
				users[id] = append(users[id], fe)
			}
		}
	}
	ids := slices.SortedFunc(mapKeys(ks.Backends), func(a, b reconciler.BackendID) int {
		return cmp.Or(ks.Backends[a].Compare(ks.Backends[b]), cmp.Compare(a, b))
	})
	rows := make([]BackendRow, 0, len(ids))
	for _, id := range ids {
		r := BackendRow{ID: uint32(id), Backend: ks.Backends[id].String(), Frontends: []string{}, Services: []string{}}
		fes := users[id]
		slices.SortFunc(fes, reconciler.Frontend.Compare)
		for _, fe := range fes {
			r.Frontends = append(r.Frontends, frontendName(fe))
			if n := names[fe.L4Addr.String()].Service; n != "" && !slices.Contains(r.Services, n) {
				r.Services = append(r.Services, n)
			}
		}
		slices.Sort(r.Services)
		rows = append(rows, r)
	}
	return rows
}

// ConntrackRow is one line of `conntrack`.
type ConntrackRow struct {
	State     string   `json:"state"`     // established, new (not answered yet: in sluice_conntrack's half-open share or in sluice_ct_new), unassured (TCP answered, the client's ACK not seen yet: netfilter's SYN_RECV, in either table), or overflow (answered while the established table was full: kept in sluice_ct_new)
	Direction string   `json:"direction"` // forward (the client's tuple) or reverse (the reply's)
	Proto     string   `json:"proto"`
	Src       string   `json:"src"`
	Dst       string   `json:"dst"`
	NAT       string   `json:"nat"`            // the backend (forward) or the frontend (reverse)
	SNAT      string   `json:"snat,omitempty"` // the flow's source NAT, if any
	Service   string   `json:"service,omitempty"`
	ServiceID uint32   `json:"serviceID"`
	BackendID uint32   `json:"backendID"`
	Expires   string   `json:"expires"` // from now, or "expired"
	Flags     []string `json:"flags"`
}

func conntrackCmd(fs *flag.FlagSet) runner {
	f, check := conntrackFilterFlags(fs)
	return runner{check: check, run: func(c *ctx) error {
		entries, ks, names, err := c.conntrack()
		if err != nil {
			return err
		}
		rows := conntrackRows(f.selectEntries(entries, ks, names), ks, names)
		if c.output == "json" {
			return writeJSON(c.stdout, rows)
		}
		cells := make([][]string, 0, len(rows))
		for _, r := range rows {
			cells = append(cells, []string{r.State, r.Direction, r.Proto, r.Src, r.Dst, r.NAT, or(r.SNAT), or(r.Service), r.Expires, or(strings.Join(r.Flags, ","))})
			if c.output == "wide" {
				// The ids the entry names: its frontend's reverse-NAT
				// id (services' ID) and its backend's (backends' ID).
				cells[len(cells)-1] = append(cells[len(cells)-1], strconv.Itoa(int(r.ServiceID)), strconv.Itoa(int(r.BackendID)))
			}
		}
		header := []string{"STATE", "DIR", "PROTO", "SRC", "DST", "NAT", "SNAT", "SERVICE", "EXPIRES", "FLAGS"}
		if c.output == "wide" {
			header = append(header, "SERVICE-ID", "BACKEND-ID")
		}
		return tabulate(c.stdout, table(header, cells))
	}}
}

// conntrackFilterFlags declares the flags that select conntrack entries
// (conntrack and conntrack delete take the same) and returns the filter
// they fill in once check has run.
func conntrackFilterFlags(fs *flag.FlagSet) (*conntrackFilter, func(*ctx) error) {
	addr := fs.String("addr", "", "only entries with this address (client, frontend, backend or source NAT)")
	port := fs.Uint("port", 0, "only entries with this port (with --addr: on the same side)")
	proto := fs.String("proto", "", "only tcp or udp entries")
	service := fs.String("service", "", "only entries of this Service: NAMESPACE/NAME, or NAMESPACE/NAME:PORT for one of its ports (from the names file)")
	src := fs.String("src", "", "only the flow whose client is IP:PORT (with --dst: one flow)")
	dst := fs.String("dst", "", "only the flows to the frontend IP:PORT")
	f := &conntrackFilter{}
	check := func(*ctx) error {
		if *addr != "" {
			a, err := netip.ParseAddr(*addr)
			if err != nil {
				return fmt.Errorf("--addr: %w", err)
			}
			f.addr = a.Unmap()
		}
		if *port > 65535 {
			return fmt.Errorf("--port %d: out of range", *port)
		}
		f.port = uint16(*port)
		p, err := parseProto(*proto)
		if err != nil {
			return err
		}
		f.proto = p
		if *service != "" && !strings.Contains(*service, "/") {
			return fmt.Errorf("--service %q: want NAMESPACE/NAME[:PORT]", *service)
		}
		f.service = *service
		for _, x := range []struct {
			name, v string
			to      *netip.AddrPort
		}{{"src", *src, &f.src}, {"dst", *dst, &f.dst}} {
			if x.v == "" {
				continue
			}
			ap, err := netip.ParseAddrPort(x.v)
			if err != nil {
				return fmt.Errorf("--%s: %w", x.name, err)
			}
			*x.to = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		}
		return nil
	}
	return f, check
}

// conntrack reads what the conntrack commands show: the entries, the
// maps (for the Service ids) and the names file.
func (c *ctx) conntrack() ([]datapath.ConntrackEntry, *reconciler.KernelState, map[string]namesfile.Frontend, error) {
	entries, err := c.pins.Conntrack()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read conntrack: %w", err)
	}
	ks, err := c.pins.Dump()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read maps: %w", err)
	}
	return entries, ks, c.serviceNames(), nil
}

// ConntrackDeleted is what `conntrack delete` did.
type ConntrackDeleted struct {
	Flows   int `json:"flows"`   // the flows selected
	Entries int `json:"entries"` // the entries deleted (each flow has up to two)
}

func conntrackDeleteCmd(fs *flag.FlagSet) runner {
	f, checkFilter := conntrackFilterFlags(fs)
	yes := fs.Bool("yes", false, "delete when more than one flow matches")
	check := func(c *ctx) error {
		if err := checkFilter(c); err != nil {
			return err
		}
		if f.empty() {
			return fmt.Errorf("say which flows: --src and --dst (one flow), or --addr, --port, --proto, --service")
		}
		return nil
	}
	return runner{check: check, run: func(c *ctx) error {
		entries, ks, names, err := c.conntrack()
		if err != nil {
			return err
		}
		sel := f.selectEntries(entries, ks, names)
		flows := map[flowKey]bool{}
		for _, e := range sel {
			flows[flowOf(e)] = true
		}
		if len(flows) > 1 && !*yes {
			return fmt.Errorf("%d flows (%d entries) match; list them with `sluicectl conntrack` and the same filters, and give --yes to delete them all",
				len(flows), len(sel))
		}
		n, err := c.pins.DeleteConntrack(sel)
		if err != nil {
			return fmt.Errorf("deleted %d entries, then: %w", n, err)
		}
		res := ConntrackDeleted{Flows: len(flows), Entries: n}
		if c.output == "json" {
			return writeJSON(c.stdout, res)
		}
		_, err = fmt.Fprintf(c.stdout, "deleted %d entries (%s)\n", res.Entries, plural(res.Flows, "flow"))
		return err
	}}
}

// plural spells n things.
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

// flowKey names a flow by its client's tuple and frontend.
type flowKey struct {
	proto            model.Protocol
	client, frontend netip.AddrPort
}

// flowOf is the flow of an entry: a forward entry is keyed by it; a reverse
// one names the frontend, and the client is its destination (or, when the
// flow was source-NATed, its SNAT).
func flowOf(e datapath.ConntrackEntry) flowKey {
	if !e.Reverse {
		return flowKey{e.Proto, e.Src, e.Dst}
	}
	client := e.Dst
	if e.SNAT.IsValid() {
		client = e.SNAT
	}
	return flowKey{e.Proto, client, e.NAT}
}

// conntrackFilter selects entries; zero fields select all.
type conntrackFilter struct {
	addr     netip.Addr
	port     uint16
	proto    model.Protocol
	service  string         // namespace/name or namespace/name:port
	src, dst netip.AddrPort // the flow's client and frontend
}

func (f conntrackFilter) empty() bool {
	return f == conntrackFilter{}
}

// selectEntries returns the entries f selects. The Service of an entry is
// the name of the frontend its reverse-NAT id names.
func (f conntrackFilter) selectEntries(entries []datapath.ConntrackEntry, ks *reconciler.KernelState, names map[string]namesfile.Frontend) []datapath.ConntrackEntry {
	var sel []datapath.ConntrackEntry
	for _, e := range entries {
		if !f.match(e) {
			continue
		}
		if f.service != "" {
			svc := serviceOf(e, ks, names)
			if svc != f.service && !strings.HasPrefix(svc, f.service+":") {
				continue
			}
		}
		sel = append(sel, e)
	}
	return sel
}

func serviceOf(e datapath.ConntrackEntry, ks *reconciler.KernelState, names map[string]namesfile.Frontend) string {
	if fe, ok := ks.RevNat[reconciler.ServiceID(e.ServiceID)]; ok {
		return names[fe.L4Addr.String()].Service
	}
	return ""
}

func (f conntrackFilter) match(e datapath.ConntrackEntry) bool {
	if f.proto != 0 && e.Proto != f.proto {
		return false
	}
	if fl := flowOf(e); f.src.IsValid() && fl.client != f.src || f.dst.IsValid() && fl.frontend != f.dst {
		return false
	}
	if !f.addr.IsValid() && f.port == 0 {
		return true
	}
	for _, ap := range []netip.AddrPort{e.Src, e.Dst, e.NAT, e.SNAT} {
		if ap.IsValid() && (!f.addr.IsValid() || ap.Addr() == f.addr) && (f.port == 0 || ap.Port() == f.port) {
			return true
		}
	}
	return false
}

// conntrackRows turns entries into rows, sorted by state (established
// first), protocol, source, destination and direction; the Service is the
// name of the frontend the entry's reverse-NAT id names.
func conntrackRows(sel []datapath.ConntrackEntry, ks *reconciler.KernelState, names map[string]namesfile.Frontend) []ConntrackRow {
	slices.SortFunc(sel, func(a, b datapath.ConntrackEntry) int {
		return cmp.Or(cmp.Compare(b2i(b.Established), b2i(a.Established)), cmp.Compare(a.Proto, b.Proto), a.Src.Compare(b.Src), a.Dst.Compare(b.Dst),
			cmp.Compare(b2i(a.Reverse), b2i(b.Reverse)))
	})
	rows := make([]ConntrackRow, 0, len(sel))
	for _, e := range sel {
		r := ConntrackRow{State: "new", Direction: "forward", Proto: e.Proto.String(), Src: e.Src.String(), Dst: e.Dst.String(),
			NAT: e.NAT.String(), ServiceID: e.ServiceID, BackendID: e.BackendID, Flags: e.Flags}
		if r.Flags == nil {
			r.Flags = []string{}
		}
		switch {
		case e.Unassured:
			r.State = "unassured"
		case e.Established:
			r.State = "established"
		case slices.Contains(e.Flags, "replied"):
			r.State = "overflow"
		}
		if e.Reverse {
			r.Direction = "reverse"
		}
		if e.SNAT.IsValid() {
			r.SNAT = e.SNAT.String()
		}
		r.Service = serviceOf(e, ks, names)
		r.Expires = "expired"
		if e.ExpiresIn > 0 {
			r.Expires = e.ExpiresIn.Round(time.Second).String()
		}
		rows = append(rows, r)
	}
	return rows
}

// CounterRow is one line of `counters`.
type CounterRow struct {
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
}

func countersCmd(*flag.FlagSet) runner {
	return runner{run: func(c *ctx) error {
		counts, err := c.pins.Counters()
		if err != nil {
			return fmt.Errorf("read counters: %w", err)
		}
		if c.output == "json" {
			rows := []CounterRow{}
			for _, n := range slices.Sorted(mapKeys(counts)) {
				rows = append(rows, CounterRow{n, counts[n]})
			}
			return writeJSON(c.stdout, rows)
		}
		return writeCounters(c.stdout, counts)
	}}
}

func writeCounters(w io.Writer, c map[string]uint64) error {
	var cells [][]string
	for _, n := range slices.Sorted(mapKeys(c)) {
		cells = append(cells, []string{n, strconv.FormatUint(c[n], 10)})
	}
	return tabulate(w, table([]string{"REASON", "COUNT"}, cells))
}

// Status is what `status` reports.
type Status struct {
	Agent AgentStatus        `json:"agent"`
	Maps  []datapath.MapFill `json:"maps"` // none if nothing is pinned
}

// AgentStatus is what the agent's endpoints say.
type AgentStatus struct {
	// Reachable says the health endpoint answered; the rest is empty
	// otherwise, and Error says why.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	Ready     bool   `json:"ready"`
	// Readiness is the health address' /readyz answer: "ok", or why
	// not, then how many frontends of how many Services could not be
	// programmed (Unprogrammed names them).
	Readiness string `json:"readiness,omitempty"`
	// LastSync is the last successful sync
	// (kubeproxy_sync_proxy_rules_last_timestamp_seconds), if the
	// metrics endpoint answered and there was one.
	LastSync *time.Time `json:"lastSync,omitempty"`
	Services *int       `json:"services,omitempty"` // sluice_services: frontends programmed
	// Unprogrammed are the Service ports the last sync could not
	// program, with why (sluice_service_unprogrammed_frontends).
	Unprogrammed []string `json:"unprogrammed"`
	// Healthz and Livez are /healthz's and /livez's answers (KEP-3836):
	// "ok", or the status code and why.
	Healthz string `json:"healthz,omitempty"`
	Livez   string `json:"livez,omitempty"`
}

func statusCmd(fs *flag.FlagSet) runner {
	health := fs.String("health-addr", "127.0.0.1:10256", "the agent's --health-addr")
	metrics := fs.String("metrics-addr", "127.0.0.1:10249", "the agent's --metrics-addr")
	return runner{run: func(c *ctx) error {
		st := Status{Agent: askAgent(*health, *metrics), Maps: []datapath.MapFill{}}
		if c.pins != nil {
			fill, err := c.pins.MapFill()
			if err != nil {
				return fmt.Errorf("count map entries: %w", err)
			}
			st.Maps = fill
		}
		if c.output == "json" {
			return writeJSON(c.stdout, st)
		}
		return writeStatus(c.stdout, st, time.Now())
	}}
}

func writeStatus(w io.Writer, st Status, now time.Time) error {
	var b strings.Builder
	a := st.Agent
	switch {
	case !a.Reachable:
		fmt.Fprintf(&b, "Agent:\tnot reachable (%s)\n", a.Error)
	case a.Ready:
		b.WriteString("Agent:\tready\n")
	default:
		fmt.Fprintf(&b, "Agent:\tnot ready: %s\n", strings.TrimPrefix(firstLine(a.Readiness), "not ready: "))
	}
	if a.Healthz != "" {
		fmt.Fprintf(&b, "Health:\t/healthz %s, /livez %s\n", a.Healthz, a.Livez)
	}
	if a.LastSync != nil {
		fmt.Fprintf(&b, "Last sync:\t%s (%s ago)\n", a.LastSync.UTC().Format(time.RFC3339), now.Sub(*a.LastSync).Round(time.Second))
	} else if a.Reachable {
		b.WriteString("Last sync:\t-\n")
	}
	if a.Services != nil {
		fmt.Fprintf(&b, "Frontends:\t%d programmed\n", *a.Services)
	}
	if len(a.Unprogrammed) > 0 {
		fmt.Fprintf(&b, "Not programmed:\t%s\n", strings.Join(a.Unprogrammed, "\n\t"))
	}
	if err := tabulate(w, b.String()); err != nil {
		return err
	}
	if len(st.Maps) == 0 {
		_, err := io.WriteString(w, "\nNo datapath pinned.\n")
		return err
	}
	cells := make([][]string, 0, len(st.Maps))
	for _, m := range st.Maps {
		fill := "-"
		if m.Capacity > 0 {
			fill = strconv.FormatFloat(100*float64(m.Entries)/float64(m.Capacity), 'f', 1, 64) + "%"
		}
		cells = append(cells, []string{m.Name, strconv.Itoa(m.Entries), strconv.Itoa(m.Capacity), fill})
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	return tabulate(w, table([]string{"MAP", "ENTRIES", "CAPACITY", "FILL"}, cells))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// askAgent reads the agent's /readyz (the metrics address's verbose one
// when it is not ready) and /metrics. A metrics endpoint that
// does not answer leaves the sync fields empty; a health endpoint that
// does not answer makes the agent unreachable.
func askAgent(healthAddr, metricsAddr string) AgentStatus {
	client := &http.Client{Timeout: 2 * time.Second}
	st := AgentStatus{Unprogrammed: []string{}}
	resp, err := client.Get("http://" + healthAddr + "/readyz")
	if err != nil {
		st.Error = err.Error()
		return st
	}
	body, err := io.ReadAll(resp.Body)
	// A response body that was read to its end (or failed to be) has
	// nothing left a failed close could lose.
	_ = resp.Body.Close()
	if err != nil {
		st.Error = fmt.Sprintf("read /readyz: %v", err)
		return st
	}
	st.Reachable = true
	st.Ready = resp.StatusCode == http.StatusOK
	st.Readiness = strings.TrimSpace(string(body))
	st.Healthz, st.Livez = probe(client, healthAddr, "/healthz"), probe(client, healthAddr, "/livez")
	// The health address names no Service and cuts the reason short
	// (every address may reach it); the metrics address's
	// /readyz?verbose says all, as the health address did before.
	if !st.Ready {
		if r, err := client.Get("http://" + metricsAddr + "/readyz?verbose"); err == nil {
			b, err := io.ReadAll(r.Body)
			_ = r.Body.Close() // read to its end: nothing left to lose
			if err == nil && r.StatusCode == resp.StatusCode {
				st.Readiness = strings.TrimSpace(string(b))
			}
		}
	}

	resp, err = client.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return st
	}
	defer func() { _ = resp.Body.Close() }() // read-only: nothing to lose
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(series, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case series == `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}` && v > 0:
			t := time.Unix(0, int64(v*1e9))
			st.LastSync = &t
		case series == "sluice_services":
			n := int(v)
			st.Services = &n
		case strings.HasPrefix(series, "sluice_service_unprogrammed_frontends{"):
			st.Unprogrammed = append(st.Unprogrammed, fmt.Sprintf("%s (%s): %d frontends",
				label(series, "service"), label(series, "reason"), int(v)))
		}
	}
	slices.Sort(st.Unprogrammed)
	return st
}

// probe asks one of the agent's health probes: "ok" for a 200, else the
// status code and the reason the agent gives (its X-Sluice-Unhealthy
// header), or why it did not answer.
func probe(client *http.Client, addr, path string) string {
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return "no answer: " + err.Error()
	}
	_, _ = io.Copy(io.Discard, resp.Body) // only the status matters; a short read loses nothing
	_ = resp.Body.Close()                 // read to its end: nothing left to lose
	if resp.StatusCode == http.StatusOK {
		return "ok"
	}
	why := resp.Header.Get("X-Sluice-Unhealthy")
	if why == "" {
		return strconv.Itoa(resp.StatusCode)
	}
	return strconv.Itoa(resp.StatusCode) + ": " + why
}

// label returns the value of label name in a series of the exposition
// format (values Sluice writes need no unescaping: names and reasons).
func label(series, name string) string {
	_, rest, ok := strings.Cut(series, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// mapKeys returns the keys of m, for slices.Sorted.
func mapKeys[K comparable, V any](m map[K]V) func(yield func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// parseProto reads a --proto flag: tcp or udp in any case, or "" for
// none (0).
func parseProto(s string) (model.Protocol, error) {
	switch strings.ToLower(s) {
	case "":
		return 0, nil
	case "tcp":
		return model.TCP, nil
	case "udp":
		return model.UDP, nil
	}
	return 0, fmt.Errorf("--proto %q: want tcp or udp", s)
}
