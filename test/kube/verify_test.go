package kube

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The check deploy/README.md has an operator make after installing:
// sluice_services on the metrics port counts every frontend, the lines of
// `sluicectl services` (ClusterIP ports, and for a NodePort Service also
// each node address with its nodePort, each ExternalIP), not only the
// ClusterIP ports.
func TestDeployReadmeVerificationStep(t *testing.T) {
	e := setupTraffic(t)
	c := e.kube.Client
	web := createService(t, c, "default", "web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalIPs = []string{"198.51.100.7"}
	}, svcPort("http", 80, "http"), svcPort("alt", 81, "alt"))
	createSlice(t, c, makeSlice("default", "web", "web-a", slicePorts{"http": 8080, "alt": 8080}, ready(e.addrs[0])))
	createService(t, c, "default", "db", nil, svcPort("pg", 5432, "pg"))
	const clusterIPPorts = 4 // web's two, db's, and default/kubernetes's
	nodePort := fmt.Sprintf(":%d/TCP", web.Spec.Ports[0].NodePort)

	eventually(t, "sluice_services to count the lines of sluicectl services", 30*time.Second, func() error {
		body, err := e.agent.Metrics()
		if err != nil {
			return err
		}
		metric := -1
		sc := bufio.NewScanner(strings.NewReader(body))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "sluice_services "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return err
				}
				metric = int(f)
			}
		}
		out, err := e.agent.Services(context.Background())
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")[1:] // after the header
		if metric != len(lines) {
			return fmt.Errorf("sluice_services %d, sluicectl services lists %d frontends:\n%s", metric, len(lines), out)
		}
		if !strings.Contains(out, nodePort) || !strings.Contains(out, "198.51.100.7:80/TCP") {
			return fmt.Errorf("the NodePort (%s) and ExternalIP frontends are not programmed yet:\n%s", nodePort, out)
		}
		if len(lines) <= clusterIPPorts {
			return fmt.Errorf("%d frontends for %d ClusterIP ports", len(lines), clusterIPPorts)
		}
		t.Logf("sluice_services %d for %d ClusterIP ports:\n%s", metric, clusterIPPorts, out)
		return nil
	})
}
