package main

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestCostParseStat(t *testing.T) {
	// A command name with a space and a parenthesis; utime 150, stime 50
	// ticks (fields 14 and 15).
	line := "4242 (kube apiserver) x) S 1 4242 4242 0 -1 4194560 2061 0 0 0 150 50 0 0 20 0 12 0 1000 10000 100 18446744073709551615\n"
	got, err := costParseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * time.Second; got != want {
		t.Errorf("costParseStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 (x) S 1 2 3", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 abc 50 0"} {
		if _, err := costParseStat(bad); err == nil {
			t.Errorf("costParseStat(%q): no error", bad)
		}
	}
}

func TestCostStatCPUSelf(t *testing.T) {
	d, err := costStatCPU([]int{os.Getpid()})
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if d < 0 {
		t.Errorf("CPU time %v", d)
	}
	if _, err := costStatCPU([]int{0}); err == nil {
		t.Error("pid 0: no error")
	}
}

func TestCostRows(t *testing.T) {
	// One baseline before each contender and one after the last.
	baselines := []CostSample{
		{Contender: costNone, WallS: 30, APIServerMs: 100, EtcdMs: 10, ClientMs: 1},
		{Contender: costNone, WallS: 30, APIServerMs: 110, EtcdMs: 12, ClientMs: 3},
		{Contender: costNone, WallS: 30, APIServerMs: 104, EtcdMs: 10, ClientMs: 0},
		{Contender: costNone}, // could not measure
		{Contender: costNone, WallS: 30, APIServerMs: 106, EtcdMs: 10, ClientMs: 0},
	}
	samples := []CostSample{
		{Contender: costTransportReadyz, WallS: 30, APIServerMs: 125, EtcdMs: 11, ClientMs: 22},
		{Contender: costTransportHeld}, // could not run
		{Contender: costLocalProxyReadyz, WallS: 30, APIServerMs: 114, EtcdMs: 11, ClientMs: 8},
		{Contender: costHAProxyKubespray, WallS: 30, APIServerMs: 107, EtcdMs: 11, ClientMs: 1},
	}
	rows := costRows(samples, baselines, 2)
	if len(rows) != len(samples) {
		t.Fatalf("%d rows, want %d", len(rows), len(samples))
	}
	check := func(name string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	tr, held, lp, hap := rows[0], rows[1], rows[2], rows[3]
	check("transport apiserver", tr.APIServerPerClient, 10) // (125-(100+110)/2)/2
	check("transport drift", tr.Drift, 5)                   // (110-100)/2
	check("transport client", tr.ClientPerClient, 10)       // (22-2)/2: the bench process at rest taken off
	check("transport etcd", tr.EtcdPerClient, 0)
	check("transport vs haproxy", tr.VsHAProxy, 20)
	check("transport vs localproxy", tr.VsLocalProxy, 2)
	check("transport cores", tr.Cores5000, 50)              // 10 × 5000 / 1000
	check("localproxy apiserver", lp.APIServerPerClient, 5) // (114-104)/2: one baseline only
	check("localproxy drift", lp.Drift, 0)
	check("localproxy client", lp.ClientPerClient, 4) // 8/2: its own processes
	check("localproxy vs localproxy", lp.VsLocalProxy, 1)
	check("haproxy apiserver", hap.APIServerPerClient, 0.5) // (107-106)/2
	check("haproxy vs haproxy", hap.VsHAProxy, 1)
	check("haproxy cores", hap.Cores5000, 2.5)
	if !reflect.DeepEqual(held, CostRow{Contender: costTransportHeld, Raw: samples[1]}) {
		t.Errorf("row of a contender that did not run: %+v", held)
	}

	// In use: each against the direct contender with the same
	// connections and requests; requests per client.
	inUse := costRows([]CostSample{
		{Contender: costLocalProxyActive, WallS: 30, APIServerMs: 130, Requests: 10},
		{Contender: costDirectActive, WallS: 30, APIServerMs: 120, Requests: 10},
		{Contender: costHAProxyConn, WallS: 30, APIServerMs: 110},
		{Contender: costLocalProxyConn, WallS: 30, APIServerMs: 109},
		{Contender: costTransportHeldActive}, // could not run
	}, []CostSample{{WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}}, 2)
	if r := inUse[0]; r.AboveDirect == nil || *r.AboveDirect != 5 || r.ReqPerClientS != 5 { // (130-100)/2 - (120-100)/2
		t.Errorf("localproxy-held-active: above direct %v, %v requests per client; want 5, 5", r.AboveDirect, r.ReqPerClientS)
	}
	for _, r := range inUse[1:] {
		if r.AboveDirect != nil {
			t.Errorf("%s: above direct %v; want none (direct itself, or no direct-conn measured, or did not run)", r.Contender, *r.AboveDirect)
		}
	}
	if r := inUse[0]; r.VsHAProxy != 0 || r.VsLocalProxy != 0 {
		t.Errorf("localproxy-held-active: ratios %v, %v to health checks alone; want none", r.VsHAProxy, r.VsLocalProxy)
	}
	// HAProxy's in use against all on one apiserver, and no ratio to a
	// health check's either.
	one := costRows([]CostSample{
		{Contender: costHAProxyKubespray, WallS: 30, APIServerMs: 104},
		{Contender: costHAProxyActive, WallS: 30, APIServerMs: 126},
		{Contender: costDirectActive, WallS: 30, APIServerMs: 140},
		{Contender: costDirectActiveOne, WallS: 30, APIServerMs: 120},
	}, []CostSample{{WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 100}}, 2)
	if r := one[1]; r.AboveDirect == nil || *r.AboveDirect != 3 || r.VsHAProxy != 0 || r.VsLocalProxy != 0 { // (126-100)/2 - (120-100)/2
		t.Errorf("haproxy-kubespray-active: above direct %v, ratios %v, %v; want 3 (against direct-active-one), none", r.AboveDirect, r.VsHAProxy, r.VsLocalProxy)
	}
	if r := one[3]; r.VsHAProxy != 0 || r.AboveDirect != nil {
		t.Errorf("direct-active-one: ratio %v, above direct %v; want none", r.VsHAProxy, r.AboveDirect)
	}

	// Without a baseline beside it, no figure above direct.
	unbased := costRows([]CostSample{
		{Contender: costLocalProxyActive, WallS: 30, APIServerMs: 130},
		{Contender: costDirectActive, WallS: 30, APIServerMs: 120},
	}, []CostSample{{}, {}, {WallS: 30, APIServerMs: 100}}, 2)
	if r := unbased[0]; r.AboveDirect != nil {
		t.Errorf("localproxy-held-active without a baseline: above direct %v; want none", *r.AboveDirect)
	}
	for in, want := range map[string]string{costLocalProxyConn: costDirectConn, costTransportHeldActive: costDirectActive, costDirectActive: costDirectActive, costHAProxyActive: costDirectActiveOne, costLocalProxyHeld: "", costHAProxyInter1s: ""} {
		if got := costDirectFor(in); got != want {
			t.Errorf("costDirectFor(%s) = %q, want %q", in, got, want)
		}
	}

	// Without a baseline nothing per client is computed.
	for _, r := range costRows(samples, nil, 2) {
		if r.APIServerPerClient != 0 || r.VsHAProxy != 0 || r.Cores5000 != 0 {
			t.Errorf("no baseline: %+v", r)
		}
	}
}

func TestCostInter1sConfig(t *testing.T) {
	cfg := haproxyConfig("127.0.0.1:16000", []string{"a"}, []string{"10.250.0.1:6443"}, "/tmp/s.sock", 0)
	if !strings.Contains(cfg, "default-server inter 15s downinter 15s ") {
		t.Fatalf("kubespray's configuration changed; the cost measurement's inter 1s variant must follow:\n%s", cfg)
	}
	got, err := costInter1sConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "    default-server inter 1s downinter 1s rise 2 fall 2") || strings.Contains(got, "inter 15s") {
		t.Errorf("inter 1s configuration:\n%s", got)
	}
	if _, err := costInter1sConfig("global\n"); err == nil {
		t.Error("a configuration without default-server: no error")
	}
}

func TestCostMarkdown(t *testing.T) {
	above := 0.125
	c := &CostResults{
		Config: costConfig{Clients: 20, WindowS: 30, SettleS: 5, ActiveGapS: 0.2},
		Rows: []CostRow{
			{Contender: costLocalProxyReadyz, Raw: CostSample{WallS: 30}, APIServerPerClient: 5, Drift: 0.2, VsLocalProxy: 1, Cores5000: 25},
			{Contender: costLocalProxyHeld, Error: "clients do not count | every apiserver healthy"},
			{Contender: costLocalProxyActive, Raw: CostSample{WallS: 30, Requests: 95, RequestErrors: 2, APIServerEachMs: []float64{50.4, 60, 70.6}}, APIServerPerClient: 3.5, Drift: 0.1, AboveDirect: &above, ReqPerClientS: 4.75, Cores5000: 17.5},
		},
		Baselines: []CostSample{{WallS: 30, APIServerMs: 100}, {WallS: 30, APIServerMs: 104}, {}},
	}
	var b strings.Builder
	c.markdown(func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) })
	md := b.String()
	for _, want := range []string{
		"| localproxy-readyz | 5.000 | 0.200 | - | - | 1.00× | 0.000 | 0.000 | - | - | 25.00 |",
		"| localproxy-held | error: clients do not count / every apiserver healthy |",
		"| localproxy-held-active (2 requests failed) | 3.500 | 0.100 | 0.125 | - | - | 0.000 | 0.000 | 4.75 | 50 / 60 / 71 | 17.50 |",
		"send GET /version on it every 200ms",
		"- localproxy-readyz: 5.000 × 5000 / 1000 = 25.00 cores",
		"after the last: 100.0, 104.0, not measured ms/s",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "- localproxy-held:") {
		t.Errorf("extrapolation of a contender that could not run:\n%s", md)
	}
}
