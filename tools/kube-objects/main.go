// Command kube-objects reads Kubernetes manifests (multi-document YAML streams) as parsed objects.
//
//	kube-objects same A.yaml B.yaml   exits 1 unless both hold the same objects: keyed by
//	                                  kind/namespace/name, equal once parsed (order, comments,
//	                                  quoting and key order do not matter); prints every difference
//	kube-objects rules RULE.yaml      prints the spec of the PrometheusRule in RULE.yaml: a plain
//	                                  Prometheus rules file, for promtool
//
// `make chart-test` uses `same` to hold the Helm chart's default rendering to `kubectl kustomize
// manifests/`, and `make alerts-test` uses `rules` to test the PrometheusRule with promtool.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"

	"go.yaml.in/yaml/v3"
)

func main() {
	var err error
	switch {
	case len(os.Args) == 4 && os.Args[1] == "same":
		err = same(os.Args[2], os.Args[3])
	case len(os.Args) == 3 && os.Args[1] == "rules":
		err = rules(os.Args[2])
	default:
		err = errors.New("usage: kube-objects same A.yaml B.yaml | kube-objects rules RULE.yaml")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-objects:", err)
		os.Exit(1)
	}
}

// object is one parsed manifest, in JSON's types (what the API server would receive).
type object = map[string]any

// load parses every non-empty document of a YAML stream.
func load(path string) ([]object, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decoder := yaml.NewDecoder(bytes.NewReader(raw))
	var objects []object
	for {
		var doc any
		err := decoder.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return objects, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if doc == nil {
			continue
		}
		// Through JSON: the types the API server sees (every number a float64, keys strings).
		encoded, err := json.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var obj object
		if err := json.Unmarshal(encoded, &obj); err != nil {
			return nil, fmt.Errorf("%s: a document is not an object: %w", path, err)
		}
		objects = append(objects, obj)
	}
}

func field(obj object, path ...string) string {
	var value any = obj
	for _, name := range path {
		m, ok := value.(map[string]any)
		if !ok {
			return ""
		}
		value = m[name]
	}
	s, _ := value.(string)
	return s
}

func key(obj object) string {
	return field(obj, "kind") + "/" + field(obj, "metadata", "namespace") + "/" + field(obj, "metadata", "name")
}

func index(path string) (map[string]object, error) {
	objects, err := load(path)
	if err != nil {
		return nil, err
	}
	byKey := map[string]object{}
	for _, obj := range objects {
		k := key(obj)
		if _, dup := byKey[k]; dup {
			return nil, fmt.Errorf("%s: %s appears twice", path, k)
		}
		byKey[k] = obj
	}
	return byKey, nil
}

func same(pathA, pathB string) error {
	a, err := index(pathA)
	if err != nil {
		return err
	}
	b, err := index(pathB)
	if err != nil {
		return err
	}
	var diffs []string
	for k, objA := range a {
		objB, ok := b[k]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s: only in %s", k, pathA))
			continue
		}
		diffs = append(diffs, differences(k, objA, objB)...)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: only in %s", k, pathB))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		for _, d := range diffs {
			fmt.Println(d)
		}
		return fmt.Errorf("%s and %s differ in %d places", pathA, pathB, len(diffs))
	}
	fmt.Printf("%s and %s hold the same %d objects\n", pathA, pathB, len(a))
	return nil
}

// differences names every path where a and b differ (the first side's value, then the second's).
func differences(path string, a, b any) []string {
	mapA, aIsMap := a.(map[string]any)
	mapB, bIsMap := b.(map[string]any)
	if aIsMap && bIsMap {
		var out []string
		for k, va := range mapA {
			vb, ok := mapB[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s: %s only in the first", path, k, compact(va)))
				continue
			}
			out = append(out, differences(path+"."+k, va, vb)...)
		}
		for k, vb := range mapB {
			if _, ok := mapA[k]; !ok {
				out = append(out, fmt.Sprintf("%s.%s: %s only in the second", path, k, compact(vb)))
			}
		}
		return out
	}
	listA, aIsList := a.([]any)
	listB, bIsList := b.([]any)
	if aIsList && bIsList && len(listA) == len(listB) {
		var out []string
		for i := range listA {
			out = append(out, differences(fmt.Sprintf("%s[%d]", path, i), listA[i], listB[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s != %s", path, compact(a), compact(b))}
}

func compact(value any) string {
	encoded, err := json.Marshal(value)
	if err != nil {
		return fmt.Sprint(value)
	}
	return string(encoded)
}

func rules(path string) error {
	objects, err := load(path)
	if err != nil {
		return err
	}
	if len(objects) != 1 || field(objects[0], "kind") != "PrometheusRule" {
		return fmt.Errorf("%s: want exactly one PrometheusRule", path)
	}
	spec, ok := objects[0]["spec"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: the PrometheusRule has no spec", path)
	}
	out, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}
