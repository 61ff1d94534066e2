package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// services and backends show a dual-stack Service's IPv6 frontend and
// backends beside its IPv4 ones, read from the sluice6_* pins, in the
// bracketed form ([2001:db8::10]:80/TCP), with the Service's name.
func TestCommandsShowIPv6(t *testing.T) {
	bpffs, dp := openSmallPins(t)
	t.Cleanup(func() { dp.Close() })
	tcp := func(a string, port uint16) model.L4Addr {
		return model.L4Addr{Addr: netip.MustParseAddr(a), Port: port, Proto: model.TCP}
	}
	name := model.ServicePortName{Namespace: "default", Name: "web"}
	st := model.NewState()
	for fe, be := range map[model.L4Addr]model.L4Addr{
		tcp("10.96.0.10", 80): tcp("10.1.0.1", 8080), tcp("2001:db8::10", 80): tcp("2001:db8:1::1", 8080),
	} {
		st.Services.Set(fe, &model.Service{Name: name, Frontend: fe, Backends: []model.Backend{{L4Addr: be}}})
	}
	base := []string{"--bpffs", bpffs, "--names-file", programNamed(t, bpffs, dp, st)}

	svcs := decode[[]ServiceRow](t, runOK(t, append(base, "services", "-o", "json")...))
	if len(svcs) != 2 || svcs[1].Frontend != "[2001:db8::10]:80/TCP" || svcs[1].Service != "default/web" ||
		strings.Join(svcs[1].Backends, " ") != "[2001:db8:1::1]:8080" || svcs[0].ID == svcs[1].ID {
		t.Errorf("services -o json: %+v", svcs)
	}
	if table := runOK(t, append(base, "services")...); !strings.Contains(table, "[2001:db8::10]:80/TCP  default/web ") {
		t.Errorf("services table:\n%s", table)
	}
	bes := decode[[]BackendRow](t, runOK(t, append(base, "backends", "-o", "json")...))
	if len(bes) != 2 || bes[1].Backend != "[2001:db8:1::1]:8080/TCP" || strings.Join(bes[1].Frontends, ",") != "[2001:db8::10]:80/TCP" ||
		strings.Join(bes[1].Services, ",") != "default/web" {
		t.Errorf("backends -o json: %+v", bes)
	}
	if raw := runOK(t, append(base, "services", "--raw")...); !strings.Contains(raw, "[2001:db8::10]:80/TCP [0] id=") {
		t.Errorf("services --raw:\n%s", raw)
	}
}
