package kube

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// deploy/'s ClusterRole is exactly what the agent uses. The real agent runs
// with the ServiceAccount's token (kubeenv creates both from
// deploy/sluice.yaml) and programs a Service the test creates, against an
// apiserver that streams lists in watches (WatchList, on by default since
// 1.34) and against one that does not (the agent then lists, then
// watches). The apiservers' audit logs of that identity show: no request
// refused (a missing permission), and every permission the role grants
// used in one run or the other (an excessive one: a rule the agent never
// needs is a rule to remove). A cause of an event that goes away and comes
// back (a Service's endpoints that outgrow the agent's backends map, shrink
// and grow again) makes client-go's broadcaster patch the Event into a
// series, which the role must grant as it grants kube-proxy's.
func TestAgentUsesExactlyItsClusterRole(t *testing.T) {
	_, role, _, err := kubeenv.DeployRBAC()
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %v: the agent's role has no use for resource names or non-resource URLs", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted[permission(g, res, v)] = true
				}
			}
		}
	}

	used := map[string]int{}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"streamed lists", nil},
		{"lists then watches", []string{"--feature-gates=WatchList=false"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Room for 16 backends of a family: web's 3, the
			// kubernetes Service's and grow's 4, not 20 of grow.
			e := setupTrafficAgent(t, false, []string{"--max-backends", "16"}, c.args...)
			vip := e.webService(t, 0)
			eventually(t, "the service to answer", 30*time.Second, func() error {
				_, err := e.get(vip, time.Second)
				return err
			})
			// Two Services claiming one frontend: the agent
			// creates an Event on the loser.
			withIP := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.50"} }
			createService(t, e.kube.Client, "default", "claim-a", withIP, svcPort("http", 80, "http"))
			createService(t, e.kube.Client, "default", "claim-b", withIP, svcPort("http", 80, "http"))
			eventually(t, "an event on the loser", 30*time.Second, func() error {
				for _, name := range []string{"claim-a", "claim-b"} {
					if evs, err := eventsOn(e.kube.Client, "default", name); err != nil || len(evs) > 0 {
						return err
					}
				}
				return errors.New("no event yet")
			})
			// A cause that comes back: the Event patched.
			createService(t, e.kube.Client, "default", "grow", nil, svcPort("http", 80, "http"))
			createSlice(t, e.kube.Client, makeSlice("default", "grow", "grow-a", slicePorts{"http": 8080}, growingEndpoints(4)...))
			unprogrammed := regexp.MustCompile(`(?m)^sluice_service_unprogrammed_frontends\{[^}]*default/grow`)
			fits := func() error {
				m, err := e.agent.Metrics()
				if err != nil {
					return err
				}
				if !strings.Contains(m, "sluice_") || unprogrammed.MatchString(m) {
					return errors.New("default/grow not programmed")
				}
				return nil
			}
			eventually(t, "grow programmed", 30*time.Second, fits)
			causeComesBack(t, e.kube.Client, "default", "grow", 4, 20, fits)
			requests := e.kube.AgentRequests()
			if len(requests) == 0 {
				t.Fatal("no request of the agent in the audit log: the test proves nothing")
			}
			here := map[string]int{}
			for _, ev := range requests {
				code := 0
				if ev.ResponseStatus != nil {
					code = ev.ResponseStatus.Code
				}
				if code == 403 {
					t.Errorf("the apiserver refused the agent %s %s: deploy/'s ClusterRole lacks a permission it needs", ev.Verb, ev.RequestURI)
					continue
				}
				if ev.ObjectRef == nil {
					continue // discovery and other non-resource requests
				}
				p := permission(ev.ObjectRef.APIGroup, ev.ObjectRef.Resource, ev.Verb)
				if ev.ObjectRef.Subresource != "" {
					p += " (subresource " + ev.ObjectRef.Subresource + ")"
				}
				here[p]++
				used[p]++
				if !granted[p] {
					t.Errorf("the agent did %s (%s, answered %d), which its role does not grant", p, ev.RequestURI, code)
				}
			}
			t.Logf("%d requests of the agent; by permission: %v", len(requests), here)
		})
	}
	if t.Failed() {
		return
	}
	for _, p := range slices.Sorted(maps.Keys(granted)) {
		if used[p] == 0 {
			t.Errorf("deploy/'s ClusterRole grants %s, which the agent never used: remove it", p)
		}
	}
}

func permission(group, resource, verb string) string {
	if group == "" {
		group = "core"
	}
	return fmt.Sprintf("%s %s/%s", verb, group, resource)
}
