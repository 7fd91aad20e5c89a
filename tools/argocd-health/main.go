// Command argocd-health runs an Argo CD resource health check (a Lua script) against test cases
// the way Argo CD does: in gopher-lua, the interpreter Argo CD embeds (Lua 5.1), with only the
// libraries Argo CD opens (base, package, table), the resource as the global `obj` (converted
// from its JSON as Argo CD's decodeValue does), and the script's returned table read as a
// health status whose status must be one of Argo CD's codes.
//
// The test file has Argo CD's own resource_customizations format:
//
//	tests:
//	  - healthStatus: {status: Healthy, message: "..."}
//	    inputPath: testdata/healthy.yaml
//
// Usage: argocd-health health.lua health_test.yaml. Exits 1 when any case fails.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// status is what a health check returns (Argo CD's health.HealthStatus).
type status struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type testFile struct {
	Tests []struct {
		HealthStatus status `json:"healthStatus"`
		InputPath    string `json:"inputPath"`
	} `json:"tests"`
}

// The health codes Argo CD accepts; anything else it reports as Unknown.
var codes = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true,
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua TESTS.yaml")
		os.Exit(2)
	}
	failed, total, err := run(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(2)
	}
	if failed > 0 {
		fmt.Printf("%d of %d cases failed\n", failed, total)
		os.Exit(1)
	}
	fmt.Printf("%d cases passed (gopher-lua)\n", total)
}

func run(scriptPath, testsPath string) (failed, total int, err error) {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return 0, 0, err
	}
	raw, err := os.ReadFile(testsPath)
	if err != nil {
		return 0, 0, err
	}
	var tests testFile
	if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", testsPath, err)
	}
	if len(tests.Tests) == 0 {
		return 0, 0, fmt.Errorf("%s: no tests", testsPath)
	}
	for _, test := range tests.Tests {
		input := filepath.Join(filepath.Dir(testsPath), test.InputPath)
		got, err := healthOf(string(script), input)
		ok := err == nil && got == test.HealthStatus
		if !ok {
			failed++
		}
		switch {
		case err != nil:
			fmt.Printf("FAIL %s: %v\n", test.InputPath, err)
		case !ok:
			fmt.Printf("FAIL %s: got %s (%q), want %s (%q)\n", test.InputPath, got.Status, got.Message,
				test.HealthStatus.Status, test.HealthStatus.Message)
		default:
			fmt.Printf("ok   %s: %s (%q)\n", test.InputPath, got.Status, got.Message)
		}
	}
	return failed, len(tests.Tests), nil
}

// healthOf runs the script on the resource in inputPath (YAML).
func healthOf(script, inputPath string) (status, error) {
	raw, err := os.ReadFile(inputPath)
	if err != nil {
		return status{}, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return status{}, fmt.Errorf("%s: %w", inputPath, err)
	}
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true},
			lua.LString(lib.name)); err != nil {
			return status{}, err
		}
	}
	// Argo CD gives a script one second.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return status{}, err
	}
	returned, isTable := l.Get(-1).(*lua.LTable)
	if !isTable {
		return status{}, fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	encoded, err := json.Marshal(fromLua(returned))
	if err != nil {
		return status{}, err
	}
	var got status
	if err := json.Unmarshal(encoded, &got); err != nil {
		return status{}, fmt.Errorf("the returned table is not a health status: %w", err)
	}
	if !codes[got.Status] {
		return status{}, fmt.Errorf("status %q is not an Argo CD health code (Argo CD would say Unknown)", got.Status)
	}
	return got, nil
}

// toLua converts a decoded JSON value as Argo CD's decodeValue does: numbers become LNumber,
// arrays and objects tables, null nil.
func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case []any:
		table := l.CreateTable(len(v), 0)
		for _, item := range v {
			table.Append(toLua(l, item))
		}
		return table
	case map[string]any:
		table := l.CreateTable(0, len(v))
		for key, item := range v {
			table.RawSetH(lua.LString(key), toLua(l, item))
		}
		return table
	default:
		return lua.LNil
	}
}

// fromLua turns the returned table's string-keyed fields into Go values (enough for a status).
func fromLua(table *lua.LTable) map[string]any {
	out := map[string]any{}
	table.ForEach(func(key, value lua.LValue) {
		name, isString := key.(lua.LString)
		if !isString {
			return
		}
		switch v := value.(type) {
		case lua.LString:
			out[string(name)] = string(v)
		case lua.LNumber:
			out[string(name)] = float64(v)
		case lua.LBool:
			out[string(name)] = bool(v)
		case *lua.LTable:
			out[string(name)] = fromLua(v)
		}
	})
	return out
}
