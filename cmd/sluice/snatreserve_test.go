package main

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// TestReserveSNATPortsRefusedWarning: a SNAT range the agent does not
// reserve because it would leave the node too few ephemeral ports is
// logged with its own advice (narrow --snat-port-range or move it out of
// ip_local_port_range, never "reserve them"), saying how many ports it
// would leave; a reservation that could not be written is logged with the
// advice to reserve the ports on the node. The refusal is a real one, in
// a network namespace of the test's own.
func TestReserveSNATPortsRefusedWarning(t *testing.T) {
	testutil.Privileged(t)
	topology.NewNS(t, "snatwarn").Enter(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("32768 60999"), 0); err != nil {
		t.Fatal(err)
	}
	logged := func(res datapath.PortReservation, err error) string {
		var out testutil.Buffer
		logSNATReservation(res, err, slog.New(slog.NewTextHandler(&out, nil)))
		return out.String()
	}
	res, err := datapath.ReserveSNATPortRange(32768, 60000) // 999 left
	got := logged(res, err)
	for _, want := range []string{"level=WARN", "it would leave the node 999 ephemeral ports", "narrow --snat-port-range",
		"move it out of ip_local_port_range 32768-60999", "sent to that flow's client", "ports=32768-60000"} {
		if !strings.Contains(got, want) {
			t.Errorf("refused reservation: logged %q, want %q in it", got, want)
		}
	}
	if strings.Contains(got, "reserve them on the node") {
		t.Errorf("refused reservation: logged %q, which advises reserving the ports by hand", got)
	}
	got = logged(datapath.PortReservation{Exposed: "61000-65535"}, errors.New("reserve the SNAT ports: read-only file system"))
	if !strings.Contains(got, "reserve them on the node") || strings.Contains(got, "narrow --snat-port-range") {
		t.Errorf("failed write: logged %q, want the advice to reserve the ports on the node", got)
	}
}
