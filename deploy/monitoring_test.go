package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// query is one expression of the alerts or the dashboard, as
// deploy/tools/promql reports it after parsing it with Prometheus's parser.
type query struct {
	File, Where, Expr string
	Selectors         []struct {
		Metric   string
		Matchers []struct{ Name, Type, Value string }
	}
}

// series is one sample line of a /metrics scrape: its name and labels.
type series struct {
	name   string
	labels map[string]string
}

// Every metric the alerts and the dashboard query, and every label value
// they select on, is exported by a real agent: the agent runs with a
// manifest, on a pin directory of its own, and its /metrics is scraped
// once it has programmed.
func TestMonitoringQueriesExistingMetrics(t *testing.T) {
	testutil.Privileged(t) // the agent loads BPF programs
	files := []string{filepath.Join("monitoring", "alerts.yaml"), filepath.Join("monitoring", "dashboard.json")}
	var args []string
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, abs)
	}
	out := run(t, filepath.Join(root, "deploy", "tools"), "go", append([]string{"run", "./promql"}, args...)...)
	var queries []query
	perFile := map[string]int{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var q query
		if err := dec.Decode(&q); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		queries = append(queries, q)
		perFile[filepath.Base(q.File)]++
	}
	if perFile["alerts.yaml"] < 4 || perFile["dashboard.json"] < 10 {
		t.Fatalf("queries per file %v: the parser found too few to prove anything", perFile)
	}

	scraped := scrapeAgent(t)
	byName := map[string][]series{}
	for _, s := range scraped {
		byName[s.name] = append(byName[s.name], s)
	}
	checked := 0
	for _, q := range queries {
		for _, sel := range q.Selectors {
			ss, ok := byName[sel.Metric]
			if !ok {
				t.Errorf("%s: %s queries %s, which the agent does not export\n  %s", q.File, q.Where, sel.Metric, q.Expr)
				continue
			}
			for _, m := range sel.Matchers {
				if m.Name == "instance" || m.Name == "job" {
					continue // target labels: Prometheus adds them at scrape
				}
				found := false
				for _, s := range ss {
					if v, ok := s.labels[m.Name]; ok && (m.Type != "=" || v == m.Value) {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: %s selects %s{%s%s%q}, which no exported series has\n  %s", q.File, q.Where, sel.Metric, m.Name, m.Type, m.Value, q.Expr)
				}
			}
			checked++
		}
	}
	t.Logf("%d selectors in %d queries checked against %d exported series", checked, len(queries), len(scraped))
}

// scrapeAgent runs the agent until it has programmed a manifest, and
// returns its /metrics.
func scrapeAgent(t *testing.T) []series {
	t.Helper()
	bin := buildSluice(t)
	dir := t.TempDir()
	manifest := filepath.Join(dir, "services.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- addresses: [10.1.1.2]
  conditions: {ready: true}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Pins of its own on the host's bpffs; no devices and no cgroup, so
	// nothing is attached and the host's traffic is untouched.
	bpffs := testutil.PinDir(t)
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "cleanup", "--bpffs", bpffs).CombinedOutput(); err != nil {
			t.Errorf("sluice cleanup: %v\n%s", err, out)
		}
	})
	ports := testutil.FreePorts(t, 2)
	health, metrics := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	var log bytes.Buffer
	cmd := exec.Command(bin, "--manifests", manifest, "--bpffs", bpffs, "--socket-lb=false",
		"--health-addr", health, "--metrics-addr", metrics, "--node-name", "node", "--log-level", "debug",
		"--names-file", filepath.Join(dir, "names.json"))
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Signalling fails only if the agent has exited already; its
		// exit status is collected below either way.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		var exit error
		select {
		case exit = <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			exit = <-exited
		}
		if t.Failed() {
			t.Logf("agent log (exit: %v):\n%s", exit, log.String())
		}
	})

	client := &http.Client{Timeout: 2 * time.Second}
	get := func(url string) (string, int) {
		resp, err := client.Get(url)
		if err != nil {
			return err.Error(), 0
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.StatusCode
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("agent exited: %v\n%s", err, log.String())
		default:
		}
		_, code := get("http://" + health + "/readyz")
		body, mcode := get("http://" + metrics + "/metrics")
		if code == http.StatusOK && mcode == http.StatusOK && strings.Contains(body, `sluice_syncs_total{result="success"}`) {
			return parseExposition(t, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready with metrics after 60s (readyz %d, metrics %d)\n%s", code, mcode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseExposition reads the sample lines of the Prometheus text format:
// name{label="value",...} value.
func parseExposition(t *testing.T, body string) []series {
	t.Helper()
	var out []series
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := series{labels: map[string]string{}}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			s.name = line[:i]
			if line[i] == '{' {
				end := strings.LastIndex(line, "}")
				for _, m := range labelPair.FindAllStringSubmatch(line[i+1:end], -1) {
					s.labels[m[1]] = m[2]
				}
			}
		} else {
			t.Fatalf("unreadable metrics line %q", line)
		}
		out = append(out, s)
	}
	return out
}
