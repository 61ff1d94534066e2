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
// sync finds the maps already right and writes nothing. Per family, over
// one apiserver: each family's agents start on maps of their own.
func TestRestartWaitsForCachesAndKeepsMaps(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	forFamilies(t, func(t *testing.T, f family) {
		ns, dbNS := f.namespace(t, c, "restart"), f.namespace(t, c, "db")
		dp := newFake()
		p1 := startProxy(t, env.AgentConfig, dp, proxyOpts{})
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"), svcPort("grpc", 9000, "grpc"))
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080, "grpc": 9090},
			ready(f.addr(1, 1)), ready(f.addr(1, 2)), ready(f.addr(1, 3))))
		db := f.service(t, c, dbNS, "pg", nil, svcPort("pg", 5432, "pg"))
		wantProgrammed(t, dp, map[string][]string{
			fe(web, 80):   {be(f.addr(1, 1), 8080), be(f.addr(1, 2), 8080), be(f.addr(1, 3), 8080)},
			fe(web, 9000): {be(f.addr(1, 1), 9090), be(f.addr(1, 2), 9090), be(f.addr(1, 3), 9090)},
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
	})
}

// An API outage: the datapath keeps the last state while the apiserver is
// down; changes made meanwhile (through another apiserver of the same
// control plane) are applied once the watch comes back. Per family, over
// one control plane: each family's agent on maps of its own.
func TestAPIOutage(t *testing.T) {
	env := startEnv(t)
	c := env.Client
	other := env.StartExtraAPIServer()
	forFamilies(t, func(t *testing.T, f family) {
		ns := f.namespace(t, c, "outage")
		dp := newFake()
		startProxy(t, env.AgentConfig, dp, proxyOpts{minSync: 100 * time.Millisecond})
		web := f.service(t, c, ns, "web", nil, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "web", "web-a", slicePorts{"http": 8080},
			ready(f.addr(1, 1)), ready(f.addr(1, 2)), ready(f.addr(1, 3))))
		old := f.service(t, c, ns, "old", nil, svcPort("http", 80, "http"))
		createSlice(t, c, f.slice(ns, "old", "old-a", slicePorts{"http": 8080}, ready(f.addr(2, 1))))
		wantProgrammed(t, dp, map[string][]string{
			fe(web, 80): {be(f.addr(1, 1), 8080), be(f.addr(1, 2), 8080), be(f.addr(1, 3), 8080)},
			fe(old, 80): {be(f.addr(2, 1), 8080)},
		})
		before := dp.String()

		env.StopAPIServer()
		ctx := context.Background()
		updateSlice(t, other, ns, "web-a", ready(f.addr(1, 3)), ready(f.addr(1, 4)))
		if err := other.CoreV1().Services(ns).Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		fresh := f.service(t, other, ns, "fresh", nil, svcPort("http", 80, "http"))
		createSlice(t, other, f.slice(ns, "fresh", "fresh-a", slicePorts{"http": 8080}, ready(f.addr(3, 1))))
		time.Sleep(2 * time.Second)
		if now := dp.String(); now != before {
			t.Fatalf("the datapath changed during the outage:\n%s\nwas:\n%s", now, before)
		}

		env.StartAPIServer()
		start := time.Now()
		wantProgrammed(t, dp, map[string][]string{
			fe(web, 80):   {be(f.addr(1, 3), 8080), be(f.addr(1, 4), 8080)},
			fe(fresh, 80): {be(f.addr(3, 1), 8080)},
		}, fe(old, 80))
		t.Logf("changes made during the outage applied %v after the apiserver was back", time.Since(start).Round(10*time.Millisecond))
		checkFake(t, dp)
	})
}
