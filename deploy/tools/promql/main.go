// Command promql lists the metrics that Sluice's alerts and dashboards
// query, with Prometheus's own PromQL parser, so that a test can check each
// against what a running agent exports (deploy/monitoring_test.go):
//
//	go run ./promql ../monitoring/alerts.yaml ../monitoring/dashboard.json
//
// It reads the expr of every rule of a PrometheusRule (YAML) and of every
// target and query variable of a Grafana dashboard (JSON), replaces
// Grafana's variables with values PromQL accepts, parses each, and prints
// one JSON object per expression: where it is, and every vector selector in
// it (metric name and label matchers). A parse error is an error: exit 1.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Query is one expression and what it selects.
type Query struct {
	File      string     `json:"file"`
	Where     string     `json:"where"`
	Expr      string     `json:"expr"`
	Selectors []Selector `json:"selectors"`
}

// Selector is one vector selector: a metric and its label matchers.
type Selector struct {
	Metric   string    `json:"metric"`
	Matchers []Matcher `json:"matchers"`
}

// Matcher is one label matcher; Type is =, !=, =~ or !~.
type Matcher struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promql FILE...")
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	failed := false
	for _, f := range os.Args[1:] {
		qs, err := queries(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", f, err)
			failed = true
			continue
		}
		for _, q := range qs {
			if err := parse(&q); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %s: %v\n  %s\n", q.File, q.Where, err, q.Expr)
				failed = true
				continue
			}
			if err := enc.Encode(q); err != nil {
				fmt.Fprintf(os.Stderr, "write: %v\n", err)
				os.Exit(1)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

// queries reads the expressions of a PrometheusRule or a Grafana dashboard.
func queries(path string) ([]Query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if filepath.Ext(path) == ".json" {
		var d map[string]any
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, err
		}
		return dashboardQueries(path, d), nil
	}
	var pr struct {
		Kind string
		Spec struct {
			Groups []struct {
				Name  string
				Rules []struct {
					Alert, Record, Expr string
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &pr); err != nil {
		return nil, err
	}
	if pr.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("kind %q, want PrometheusRule", pr.Kind)
	}
	var qs []Query
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			if r.Expr == "" {
				return nil, fmt.Errorf("group %s, rule %s: no expr", g.Name, name)
			}
			qs = append(qs, Query{File: path, Where: g.Name + "/" + name, Expr: r.Expr})
		}
	}
	return qs, nil
}

// dashboardQueries walks a dashboard: panels (and rows' panels) with their
// targets' expr, and query variables' label_values(SELECTOR, LABEL).
func dashboardQueries(path string, d map[string]any) []Query {
	var qs []Query
	var walk func(panels []any)
	walk = func(panels []any) {
		for _, p := range panels {
			pm, _ := p.(map[string]any)
			title, _ := pm["title"].(string)
			targets, _ := pm["targets"].([]any)
			for i, t := range targets {
				tm, _ := t.(map[string]any)
				if e, ok := tm["expr"].(string); ok {
					qs = append(qs, Query{File: path, Where: fmt.Sprintf("panel %q target %d", title, i), Expr: e})
				}
			}
			if sub, ok := pm["panels"].([]any); ok {
				walk(sub)
			}
		}
	}
	panels, _ := d["panels"].([]any)
	walk(panels)
	templating, _ := d["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]\w*\)$`)
	for _, v := range vars {
		vm, _ := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		var q string
		switch x := vm["query"].(type) {
		case string:
			q = x
		case map[string]any:
			q, _ = x["query"].(string)
		}
		if m := labelValues.FindStringSubmatch(strings.TrimSpace(q)); m != nil {
			q = m[1]
		}
		qs = append(qs, Query{File: path, Where: fmt.Sprintf("variable %v", vm["name"]), Expr: q})
	}
	return qs
}

// grafanaVars are replaced before parsing: intervals by a duration, any
// other variable (in a label matcher) by a regular expression matching all.
var grafanaVars = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`), "5m"},
	{regexp.MustCompile(`\$\{?[a-zA-Z_]\w*(:\w+)?\}?`), ".*"},
}

func parse(q *Query) error {
	expr := q.Expr
	for _, v := range grafanaVars {
		expr = v.re.ReplaceAllString(expr, v.with)
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return err
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				if s.Metric == "" {
					s.Metric = m.Value
				}
				continue
			}
			s.Matchers = append(s.Matchers, Matcher{m.Name, m.Type.String(), m.Value})
		}
		q.Selectors = append(q.Selectors, s)
		return nil
	})
	slices.SortFunc(q.Selectors, func(a, b Selector) int { return strings.Compare(a.Metric, b.Metric) })
	if len(q.Selectors) == 0 {
		return fmt.Errorf("selects no metric")
	}
	return nil
}
