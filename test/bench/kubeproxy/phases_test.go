package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStartPhases(t *testing.T) {
	started := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	log := `time=2026-12-02T00:00:01.000Z level=INFO msg="tc programs attached" devices=[eth0]
time=2026-12-02T00:00:01.250Z level=INFO msg="waiting for caches to sync" source=kube
time=2026-12-02T00:00:02.900Z level=INFO msg="caches synced" source=kube after=1.65s
time=2026-12-02T00:00:03.200Z level=INFO msg="first sync done" source=kube services=10
`
	startup, caches, ok := startPhases(log, started)
	if !ok || startup != 1.25 || caches != 1.65 {
		t.Fatalf("startPhases = %v, %v, %v; want 1.25, 1.65, true", startup, caches, ok)
	}
	for _, bad := range []string{
		"",
		`time=2026-12-02T00:00:01.250Z level=INFO msg="waiting for caches to sync" source=kube`,
		`time=2026-12-02T00:00:02.900Z level=INFO msg="caches synced" source=kube after=1.65s`,
		`time=bad level=INFO msg="waiting for caches to sync"
time=2026-12-02T00:00:02.900Z level=INFO msg="caches synced" after=1.65s`,
	} {
		if _, _, ok := startPhases(bad, started); ok {
			t.Errorf("startPhases(%q) ok; want not ok", bad)
		}
	}
}

func TestRoundOrder(t *testing.T) {
	modes := []string{"a", "b", "c"}
	for round, want := range map[int]string{1: "a b c", 2: "c b a", 3: "a b c"} {
		if got := strings.Join(roundOrder(modes, round), " "); got != want {
			t.Errorf("round %d: %s, want %s", round, got, want)
		}
	}
	if strings.Join(modes, " ") != "a b c" {
		t.Errorf("roundOrder changed its argument: %v", modes)
	}
}

// A Sluice agent whose maps are full is not waited for: the wait for every
// Service to be programmed ends at once, saying why, rather than at its
// timeout (the twenty-seventh pass's round that waited for it).
func TestWaitEndsWhenMapsAreFull(t *testing.T) {
	body := "sluice_services 26215\n" +
		`sluice_service_unprogrammed_frontends{reason="capacity",service="default/svc-1:http"} 1` + "\n" +
		`sluice_service_unprogrammed_frontends{reason="capacity",service="default/svc-2:http"} 1` + "\n"
	p := &proxy{exited: func() error { return nil }}
	polls := 0
	err := waitFor(t.Context(), time.Hour, p, func() (bool, error) {
		polls++
		return false, mapsFull(body)
	})
	if !errors.Is(err, errHopeless) || polls != 1 || !strings.Contains(err.Error(), "2 frontends not programmed for capacity") {
		t.Errorf("waiting on full maps: %v after %d polls, want at once an error counting the 2 frontends", err, polls)
	}
	if err := mapsFull("sluice_services 3\n"); err != nil {
		t.Errorf("maps not full: %v", err)
	}
}
