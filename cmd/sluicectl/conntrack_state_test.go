package main

import (
	"testing"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestConntrackRowStates: `conntrack` names an entry's state: a TCP flow
// answered whose client has not acknowledged the answer yet (Unassured)
// is "unassured", whichever table it is in (its flags say replied), not
// "established" nor "overflow".
func TestConntrackRowStates(t *testing.T) {
	for _, c := range []struct {
		e    datapath.ConntrackEntry
		want string
	}{
		{datapath.ConntrackEntry{}, "new"},
		{datapath.ConntrackEntry{Established: true, Flags: []string{"replied"}}, "established"},
		{datapath.ConntrackEntry{Flags: []string{"replied"}}, "overflow"},
		{datapath.ConntrackEntry{Unassured: true, Flags: []string{"replied"}}, "unassured"},
	} {
		rows := conntrackRows([]datapath.ConntrackEntry{c.e}, &reconciler.KernelState{}, nil)
		if len(rows) != 1 || rows[0].State != c.want {
			t.Errorf("entry %+v: rows %+v, want state %q", c.e, rows, c.want)
		}
	}
}
