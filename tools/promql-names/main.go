// Command promql-names prints the metric names that PromQL queries select, parsed with
// Prometheus' own PromQL parser (the version promtool is pinned to), one `NAME<TAB>WHERE` line per
// selector. It reads Grafana dashboards (*.json: every panel target's `expr` and every
// `label_values(...)` variable query) and PrometheusRules (*.yaml: every rule's `expr`). Grafana's
// interval variables ($__rate_interval, $__interval, $__range) are read as 5m.
//
// It exits 1 when a query does not parse or selects no metric by name. The e2e test
// dashboard_metrics checks every printed name against a live controller's /metrics.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// query is one PromQL expression and where it was found.
type query struct {
	where, expr string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promql-names DASHBOARD.json|PROMETHEUSRULE.yaml...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		queries, err := load(path)
		if err == nil && len(queries) == 0 {
			err = errors.New("no queries found")
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "promql-names: %s: %v\n", path, err)
			failed = true
			continue
		}
		for _, q := range queries {
			names, err := metricNames(q.expr)
			if err == nil && len(names) == 0 {
				err = errors.New("selects no metric by name")
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "promql-names: %s: %s: %v\n", path, q.where, err)
				failed = true
				continue
			}
			for _, name := range names {
				fmt.Printf("%s\t%s: %s\n", name, path, q.where)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

func load(path string) ([]query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if strings.HasSuffix(path, ".json") {
		err = json.Unmarshal(raw, &doc)
	} else {
		err = yaml.Unmarshal(raw, &doc)
	}
	if err != nil {
		return nil, err
	}
	var queries []query
	collect(doc, "", &queries)
	return queries, nil
}

var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)

// collect walks a decoded document for `expr` strings (panel targets, rules) and Grafana
// variable queries, naming each by its title, alert or record, or variable name.
func collect(node any, where string, out *[]query) {
	switch v := node.(type) {
	case map[string]any:
		for _, key := range []string{"title", "alert", "record", "name"} {
			if name, ok := v[key].(string); ok {
				where = fmt.Sprintf("%s %q", key, name)
				break
			}
		}
		if expr, ok := v["expr"].(string); ok {
			*out = append(*out, query{where, expr})
		}
		if v["type"] == "query" {
			if q, ok := v["query"].(map[string]any); ok {
				if text, ok := q["query"].(string); ok {
					if m := labelValues.FindStringSubmatch(text); m != nil {
						*out = append(*out, query{where, m[1]})
					}
				}
			}
		}
		for key, child := range v {
			if key != "expr" {
				collect(child, where, out)
			}
		}
	case []any:
		for _, child := range v {
			collect(child, where, out)
		}
	}
}

var grafanaIntervals = strings.NewReplacer("$__rate_interval", "5m", "${__rate_interval}", "5m",
	"$__interval", "5m", "${__interval}", "5m", "$__range", "5m", "${__range}", "5m")

// metricNames parses expr and returns the metric name of every vector selector in it.
func metricNames(expr string) ([]string, error) {
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaIntervals.Replace(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	var unnamed error
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		selector, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := selector.Name
		for _, m := range selector.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			unnamed = fmt.Errorf("selector %s names no metric", selector)
			return nil
		}
		names = append(names, name)
		return nil
	})
	return names, unnamed
}
