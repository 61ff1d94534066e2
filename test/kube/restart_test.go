package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// An agent restart: the new agent restores from the maps, programs nothing
// while its caches cannot sync (here: the apiserver is down), and once they
// sync finds the maps already right and writes nothing.
func TestRestartWaitsForCachesAndKeepsMaps(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	p1 := startProxy(t, env.AgentConfig, dp, proxyOpts{})
	web := createService(t, c, "default", "web", nil, svcPort("http", 80, "http"), svcPort("grpc", 9000, "grpc"))
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080, "grpc": 9090},
		ready("10.0.1.1"), ready("10.0.1.2"), ready("10.0.1.3")))
	createNamespace(t, c, "db")
	db := createService(t, c, "db", "pg", nil, svcPort("pg", 5432, "pg"))
	wantProgrammed(t, dp, map[string][]string{
		fe(web, 80):   {be("10.0.1.1", 8080), be("10.0.1.2", 8080), be("10.0.1.3", 8080)},
		fe(web, 9000): {be("10.0.1.1", 9090), be("10.0.1.2", 9090), be("10.0.1.3", 9090)},
		fe(db, 5432):  {},
	})
	p1.stop()
	before := dp.String()
	dp.ResetCounts()

	env.StopAPIServer()
	p2 := startProxy(t, env.AgentConfig, dp, proxyOpts{})
	time.Sleep(3 * time.Second)
	if p2.src.Synced() || p2.applies.Load() != 0 {
		t.Fatalf("synced (%v) or applied (%d) without an apiserver", p2.src.Synced(), p2.applies.Load())
	}
	if w := dp.Writes(); w != 0 || dp.String() != before {
		t.Fatalf("%d map writes before the caches synced; maps now:\n%s\nwere:\n%s", w, dp.String(), before)
	}

	env.StartAPIServer()
	eventually(t, "caches to sync after the apiserver came back", 60*time.Second, func() error {
		if !p2.src.Synced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})
	if w := dp.Writes(); w != 0 {
		t.Errorf("the restarted agent wrote %d map entries for an unchanged state", w)
	}
	if after := dp.String(); after != before {
		t.Errorf("maps changed across the restart:\n%s\nwere:\n%s", after, before)
	}
	checkFake(t, dp)
}

// An API outage: the datapath keeps the last state while the apiserver is
// down; changes made meanwhile (through another apiserver of the same
// control plane) are applied once the watch comes back.
func TestAPIOutage(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	dp := newFake()
	startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: 100 * time.Millisecond})
	web := createService(t, c, "default", "web", nil, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080},
		ready("10.0.1.1"), ready("10.0.1.2"), ready("10.0.1.3")))
	old := createService(t, c, "default", "old", nil, svcPort("http", 80, "http"))
	createSlice(t, c, makeSlice("default", "old", "old-a", slicePorts{"http": 8080}, ready("10.0.2.1")))
	wantProgrammed(t, dp, map[string][]string{
		fe(web, 80): {be("10.0.1.1", 8080), be("10.0.1.2", 8080), be("10.0.1.3", 8080)},
		fe(old, 80): {be("10.0.2.1", 8080)},
	})
	other := env.StartExtraAPIServer()
	before := dp.String()

	env.StopAPIServer()
	ctx := context.Background()
	updateSlice(t, other, "default", "web-a", ready("10.0.1.3"), ready("10.0.1.4"))
	if err := other.CoreV1().Services("default").Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := createService(t, other, "default", "fresh", nil, svcPort("http", 80, "http"))
	createSlice(t, other, makeSlice("default", "fresh", "fresh-a", slicePorts{"http": 8080}, ready("10.0.3.1")))
	time.Sleep(2 * time.Second)
	if now := dp.String(); now != before {
		t.Fatalf("the datapath changed during the outage:\n%s\nwas:\n%s", now, before)
	}

	env.StartAPIServer()
	start := time.Now()
	wantProgrammed(t, dp, map[string][]string{
		fe(web, 80):   {be("10.0.1.3", 8080), be("10.0.1.4", 8080)},
		fe(fresh, 80): {be("10.0.3.1", 8080)},
	}, fe(old, 80))
	t.Logf("changes made during the outage applied %v after the apiserver was back", time.Since(start).Round(10*time.Millisecond))
	checkFake(t, dp)
}
