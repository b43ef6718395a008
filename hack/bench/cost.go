package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Health cost: what health checking costs the control plane per client,
// at rest and in use. Each contender runs alone in turn, N clients of one
// kind against the bed's three apiservers, for a fixed window after a
// settle; the apiservers' CPU time over the window, less the apiservers'
// own at rest (contender "none", measured just before and just after,
// averaged: the apiservers' use at rest drifts over minutes), divided by
// N and by the window, is the cost per client. Most contenders' clients
// are idle (no client traffic, only their health checks); the -conn ones
// keep a connection open, the -active ones send requests on it, and each
// of those is compared with direct-conn or direct-active, the same
// connections and requests with no health check at all: what is left is
// what the health checking costs in use (a held probe PINGs the
// apiserver a request waits on, for one).

// Contender names of the cost measurement.
const (
	costTransportReadyz   = "transport-readyz"
	costTransportHeld     = "transport-held"
	costTransportHeldConn = "transport-held-conn"
	costLocalProxyReadyz  = "localproxy-readyz"
	costLocalProxyHeld    = "localproxy-held"
	costLocalProxyConn    = "localproxy-held-conn"
	costHAProxyKubespray  = "haproxy-kubespray"
	costHAProxyConn       = "haproxy-kubespray-conn"
	costHAProxyInter1s    = "haproxy-inter-1s"
	costDirectConn        = "direct-conn"
	// The -active contenders: each client sends a request every
	// costConfig.ActiveGap on its connection, as a busy node agent does.
	costTransportHeldActive = "transport-held-active"
	costLocalProxyActive    = "localproxy-held-active"
	costHAProxyActive       = "haproxy-kubespray-active"
	costDirectActive        = "direct-active"
	costDirectActiveOne     = "direct-active-one"
	costNone                = "none"
)

// costContenders in the order they run, each between two baselines. The
// -conn ones have one idle client connection open through each client,
// as a kubelet's or a controller's quiet watch keeps one: the endpoint it
// is on is in use (readyz every 10s, PINGs every 5s) but not busy (no
// request waiting: no PINGs every 250ms).
var costContenders = []string{
	costTransportReadyz, costTransportHeld, costTransportHeldConn,
	costLocalProxyReadyz, costLocalProxyHeld, costLocalProxyConn,
	costHAProxyKubespray, costHAProxyConn, costHAProxyInter1s, costDirectConn,
	costTransportHeldActive, costLocalProxyActive, costDirectActive, costHAProxyActive, costDirectActiveOne,
}

// costDescriptions for the report.
var costDescriptions = map[string]string{
	costTransportReadyz:     "transport.Wrap clients in the bench process, probe readyz (new TLS connection + GET /readyz per apiserver per second; the former default)",
	costTransportHeld:       "transport.Wrap clients in the bench process, probe held (the default: one HTTP/2 connection per apiserver; as no connection uses them, GET /readyz every 30s and a PING every 15s)",
	costTransportHeldConn:   "as transport-held, each client with one idle HTTP/2 request connection open (one GET /version first): that apiserver's held connection gets GET /readyz every 10s and a PING every 5s, and the request connection a PING after 5s without a frame (transport PingInterval with held probes)",
	costLocalProxyReadyz:    "localproxy processes, --probe=readyz",
	costLocalProxyHeld:      "localproxy processes, --probe=held (the default)",
	costLocalProxyConn:      "as localproxy-held, each with one idle client-go connection through it (one GET /version first)",
	costHAProxyKubespray:    "HAProxy processes, kubespray's configuration (GET /healthz over a new TLS connection, inter 15s)",
	costHAProxyConn:         "as haproxy-kubespray, each with one idle client-go connection through it (one GET /version first)",
	costHAProxyInter1s:      "HAProxy processes, kubespray's configuration with inter 1s downinter 1s",
	costDirectConn:          "no health check at all: one idle client-go connection (one GET /version first) per client straight to an apiserver (client i's to apiserver i mod 3), from the bench process: what the connection itself costs, on every path",
	costNone:                "no client: the apiservers at rest",
	costTransportHeldActive: "as transport-held-conn, each client sending GET /version on its connection every -cost-active-gap (a busy node agent): the held connection of the apiserver it uses is PINGed while a request waits, and while none is heard from",
	costLocalProxyActive:    "as localproxy-held-conn, each client sending GET /version through its localproxy every -cost-active-gap",
	costHAProxyActive:       "as haproxy-kubespray-conn, each client sending GET /version through its HAProxy every -cost-active-gap",
	costDirectActive:        "as direct-conn, each client sending GET /version every -cost-active-gap: what the requests cost by themselves, spread over the apiservers as transport's and localproxy's are",
	costDirectActiveOne:     "as direct-active, every client on the first apiserver, where each kubespray HAProxy (balance leastconn) sends its one connection: haproxy-kubespray-active's requests by themselves",
}

// Ports of the cost contenders' instance i: base + i, apart from the
// ports of the other measurements.
const (
	costHAProxyPortBase          = 16000
	costLocalProxyPortBase       = 17000
	costLocalProxyHealthPortBase = 18000
	costMaxClients               = 900
)

const (
	// costSettle is how long the clients run before the window opens,
	// once every one counts every apiserver healthy.
	costSettle = 5 * time.Second
	// costReadyLimit bounds the wait for that.
	costReadyLimit = 60 * time.Second
	// costUserHZ is the unit of utime and stime in /proc/PID/stat (USER_HZ,
	// 100 on every Linux architecture Go runs on).
	costUserHZ = 100
)

// costConfig are the cost measurement's settings.
type costConfig struct {
	// Contenders to measure, in costContenders' order.
	Contenders []string      `json:"contenders"`
	Clients    int           `json:"clients"`
	Window     time.Duration `json:"-"`
	WindowS    float64       `json:"window_s"`
	SettleS    float64       `json:"settle_s"`
	// ActiveGap is the pause between two requests of an -active
	// contender's client.
	ActiveGap  time.Duration `json:"-"`
	ActiveGapS float64       `json:"active_gap_s"`
}

// CostResults is the health cost in results.json.
type CostResults struct {
	Config     costConfig        `json:"config"`
	Contenders map[string]string `json:"contenders"`
	Rows       []CostRow         `json:"rows"`
	// Baselines are the "none" windows: before the first contender,
	// between two, after the last.
	Baselines []CostSample `json:"baselines"`
	Error     string       `json:"error,omitempty"`
}

// CostSample is the CPU use measured over one window, in milliseconds of
// CPU per second of wall time.
type CostSample struct {
	Contender string  `json:"contender"`
	WallS     float64 `json:"wall_s"`
	// APIServerMs: the three kube-apiserver processes together;
	// APIServerEachMs: each, in the bed's order. How a contender spreads
	// its clients' requests over them shows there, and counts: requests
	// on one apiserver cost it less than as many spread over three.
	APIServerMs     float64   `json:"apiserver_ms_per_s"`
	APIServerEachMs []float64 `json:"apiserver_each_ms_per_s,omitempty"`
	EtcdMs          float64   `json:"etcd_ms_per_s"`
	// ClientMs: the contender's processes, or for in-process clients the
	// bench process.
	ClientMs float64 `json:"client_ms_per_s"`
	// Requests: the clients' requests answered per second (the -active
	// contenders), RequestErrors those that failed in the window.
	Requests      float64 `json:"requests_per_s,omitempty"`
	RequestErrors int64   `json:"request_errors,omitempty"`
}

// CostRow is one contender's cost per client.
type CostRow struct {
	Contender string     `json:"contender"`
	Raw       CostSample `json:"raw"`
	// APIServerPerClient: apiserver CPU ms per client per second, the
	// baseline taken off.
	APIServerPerClient float64 `json:"apiserver_ms_per_client_s"`
	EtcdPerClient      float64 `json:"etcd_ms_per_client_s"`
	// ClientPerClient: the client side's own CPU ms per client per second
	// (in process: the bench process's use at rest taken off).
	ClientPerClient float64 `json:"client_ms_per_client_s"`
	// Drift: how much the apiservers' use at rest before and after the
	// contender differ, per client (ms/client/s): the noise of
	// APIServerPerClient.
	Drift float64 `json:"baseline_drift_ms_per_client_s"`
	// VsHAProxy and VsLocalProxy: APIServerPerClient against
	// haproxy-kubespray's and localproxy-readyz's (0: not computable).
	VsHAProxy    float64 `json:"vs_haproxy_kubespray,omitempty"`
	VsLocalProxy float64 `json:"vs_localproxy_readyz,omitempty"`
	// Cores5000: APIServerPerClient × 5000 / 1000, the cores of API
	// server CPU 5,000 such clients (one per node) take.
	Cores5000 float64 `json:"cores_5000_nodes"`
	// AboveDirect, for a contender whose clients use a connection (-conn,
	// -active): APIServerPerClient less that of its costDirectFor (the
	// same connections and requests, no health check): what its
	// health checking costs per client in use; nil: not computable.
	AboveDirect *float64 `json:"above_direct_ms_per_client_s,omitempty"`
	// ReqPerClientS: Raw.Requests per client.
	ReqPerClientS float64 `json:"requests_per_client_s,omitempty"`
	// based: the per-client figures were computed (a baseline was
	// measured).
	based bool
	// Unhealthy lists the apiservers a client did not count healthy at
	// the end of the window.
	Unhealthy string `json:"unhealthy,omitempty"`
	Error     string `json:"error,omitempty"`
}

// costGroup is one contender's N clients.
type costGroup struct {
	// pids are the client processes; nil for clients in the bench process.
	pids func() []int
	// unhealthy describes the apiservers some client does not count
	// healthy, "" when every client counts every one healthy.
	unhealthy func() string
	// exited describes client processes that died, "" if none did.
	exited func() string
	// connect, if set, opens the clients' connections once every client
	// counts every apiserver healthy (and starts their requests).
	connect func() error
	// requests counts the clients' requests so far (costConns.counts):
	// answered and failed.
	requests func() (ok, failed int64)
	close    func()
}

// costUse is how a contender's clients use a connection of their own.
type costUse int

const (
	// costUseNone: no connection; the health checks alone.
	costUseNone costUse = iota
	// costUseIdle: one connection, opened with GET /version, then idle.
	costUseIdle
	// costUseActive: one connection, a GET /version on it every
	// ActiveGap.
	costUseActive
)

// costDefaultActiveGap is -cost-active-gap's default: a node agent with
// a request going every few hundred milliseconds (its node status,
// lease, pods' status, a controller's writes), shorter than the held
// probes' PingInterval, so that the apiserver it uses is busy.
const costDefaultActiveGap = 200 * time.Millisecond

// costRequestTimeout bounds each request of an -active client.
const costRequestTimeout = 5 * time.Second

// runCost measures every contender and the baselines.
func runCost(ctx context.Context, e *env, cfg costConfig, say func(string, ...any)) (*CostResults, []string) {
	cfg.WindowS, cfg.SettleS, cfg.ActiveGapS = cfg.Window.Seconds(), costSettle.Seconds(), cfg.ActiveGap.Seconds()
	res := &CostResults{Config: cfg, Contenders: make(map[string]string)}
	for _, c := range append(slices.Clone(cfg.Contenders), costNone) {
		res.Contenders[c] = costDescriptions[c]
	}
	var failures []string
	apiPids := func() []int {
		var out []int
		for _, s := range e.bed.APIServers() {
			out = append(out, s.PID())
		}
		return out
	}
	etcdPid := costFindEtcd()
	say("health cost: %d clients per contender, %s window after %s", cfg.Clients, cfg.Window, costSettle)

	baseline := func() {
		s, err := costWindow(ctx, costNone, cfg.Window, apiPids, etcdPid, nil, say)
		if err != nil {
			failures = append(failures, "cost baseline: "+err.Error())
			say("  %s: could not measure: %v", costNone, err)
			s = CostSample{Contender: costNone}
		} else {
			say("  %s: apiservers %.1fms/s, etcd %.1fms/s, bench process %.1fms/s", costNone, s.APIServerMs, s.EtcdMs, s.ClientMs)
		}
		res.Baselines = append(res.Baselines, s)
	}
	var samples []CostSample
	var errs, unhealthies []string
	for _, name := range cfg.Contenders {
		if ctx.Err() != nil {
			break
		}
		baseline()
		s, unhealthy, err := costContender(ctx, e, name, cfg, apiPids, etcdPid, say)
		samples = append(samples, s)
		msg := ""
		if err != nil {
			msg = err.Error()
			failures = append(failures, fmt.Sprintf("cost %s: %v", name, err))
			say("  %s: could not measure: %v", name, err)
		} else {
			say("  %s: apiservers %.1fms/s, etcd %.1fms/s, clients %.1fms/s", name, s.APIServerMs, s.EtcdMs, s.ClientMs)
			if unhealthy != "" {
				say("  %s: at the end of the window: %s", name, unhealthy)
			}
		}
		errs, unhealthies = append(errs, msg), append(unhealthies, unhealthy)
		// Let the closed clients' connections go before the next baseline.
		select {
		case <-ctx.Done():
		case <-time.After(costSettle):
		}
	}
	if ctx.Err() == nil {
		baseline()
	}
	res.Rows = costRows(samples, res.Baselines, cfg.Clients)
	for i := range res.Rows {
		res.Rows[i].Error, res.Rows[i].Unhealthy = errs[i], unhealthies[i]
	}
	return res, failures
}

// costRows turns the raw samples into per-client rows: sample i's
// baseline is the mean of baselines i and i+1 (the "none" windows just
// before and after it; those measured), taken off and divided by
// clients; ratios against haproxy-kubespray and localproxy-readyz. A
// sample of a contender that could not run (WallS 0), or without a
// baseline, gives a row with its name only.
func costRows(samples, baselines []CostSample, clients int) []CostRow {
	n := float64(clients)
	rows := make([]CostRow, len(samples))
	for i, s := range samples {
		r := CostRow{Contender: s.Contender, Raw: s}
		var near []CostSample
		for _, k := range []int{i, i + 1} {
			if k < len(baselines) && baselines[k].WallS > 0 {
				near = append(near, baselines[k])
			}
		}
		if s.WallS > 0 && len(near) > 0 {
			r.based = true
			var base CostSample
			for _, b := range near {
				base.APIServerMs += b.APIServerMs / float64(len(near))
				base.EtcdMs += b.EtcdMs / float64(len(near))
				base.ClientMs += b.ClientMs / float64(len(near))
			}
			r.APIServerPerClient = round((s.APIServerMs-base.APIServerMs)/n, 3)
			r.EtcdPerClient = round((s.EtcdMs-base.EtcdMs)/n, 3)
			if costInProcess(s.Contender) {
				r.ClientPerClient = round((s.ClientMs-base.ClientMs)/n, 3)
			} else {
				r.ClientPerClient = round(s.ClientMs/n, 3)
			}
			if len(near) == 2 {
				d := near[1].APIServerMs - near[0].APIServerMs
				r.Drift = round(max(d, -d)/n, 3)
			}
			r.Cores5000 = round(r.APIServerPerClient*5000/1000, 2)
			r.ReqPerClientS = round(s.Requests/n, 2)
		}
		rows[i] = r
	}
	ref := func(name string) float64 {
		for _, r := range rows {
			if r.Contender == name && r.Raw.WallS > 0 {
				return r.APIServerPerClient
			}
		}
		return 0
	}
	hap, lp := ref(costHAProxyKubespray), ref(costLocalProxyReadyz)
	for i, r := range rows {
		direct := costDirectFor(r.Contender)
		if direct == "" || direct == r.Contender || !r.based {
			continue
		}
		for _, d := range rows {
			if d.Contender == direct && d.based {
				v := round(r.APIServerPerClient-d.APIServerPerClient, 3)
				rows[i].AboveDirect = &v
			}
		}
	}
	for i := range rows {
		// An -active figure holds its requests' cost: no ratio to a
		// health check's.
		if rows[i].Raw.WallS == 0 || rows[i].APIServerPerClient == 0 || costActive(rows[i].Contender) {
			continue
		}
		if hap > 0 {
			rows[i].VsHAProxy = round(rows[i].APIServerPerClient/hap, 2)
		}
		if lp > 0 {
			rows[i].VsLocalProxy = round(rows[i].APIServerPerClient/lp, 2)
		}
	}
	return rows
}

func costInProcess(contender string) bool {
	return strings.HasPrefix(contender, "transport-") || strings.HasPrefix(contender, "direct-")
}

// costActive reports whether contender's clients send requests (the
// -active contenders and their direct baselines).
func costActive(contender string) bool {
	d := costDirectFor(contender)
	return d == costDirectActive || d == costDirectActiveOne
}

// costDirectFor is the contender with contender's connections and
// requests and no health checking: direct-conn for a -conn one,
// direct-active for an -active one (direct-active-one for HAProxy's,
// which sends them all to one apiserver), "" for others.
func costDirectFor(contender string) string {
	switch {
	case contender == costHAProxyActive || contender == costDirectActiveOne:
		return costDirectActiveOne
	case strings.HasSuffix(contender, "-conn"):
		return costDirectConn
	case strings.HasSuffix(contender, "-active"):
		return costDirectActive
	}
	return ""
}

// costContender starts contender name's clients, waits until every one
// counts every apiserver healthy, lets them settle and measures one
// window.
func costContender(ctx context.Context, e *env, name string, cfg costConfig, apiPids func() []int, etcdPid int, say func(string, ...any)) (CostSample, string, error) {
	s := CostSample{Contender: name}
	dir := filepath.Join(e.dir, "cost", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return s, "", err
	}
	say("  %s: starting %d clients", name, cfg.Clients)
	g, err := startCostGroup(ctx, e, name, dir, cfg.Clients, cfg.ActiveGap)
	if err != nil {
		return s, "", err
	}
	defer g.close()
	began := time.Now()
	if !waitUntil(ctx, costReadyLimit, func() bool { return g.unhealthy() == "" }) {
		if ctx.Err() != nil {
			return s, "", ctx.Err()
		}
		return s, "", fmt.Errorf("clients do not count every apiserver healthy after %s: %s", costReadyLimit, g.unhealthy())
	}
	if g.connect != nil {
		if err := g.connect(); err != nil {
			return s, "", fmt.Errorf("opening the client connections: %w", err)
		}
	}
	say("  %s: every client counts every apiserver healthy after %.1fs; settling %s", name, time.Since(began).Seconds(), costSettle)
	select {
	case <-ctx.Done():
		return s, "", ctx.Err()
	case <-time.After(costSettle):
	}
	ok0, failed0 := g.requests()
	s, err = costWindow(ctx, name, cfg.Window, apiPids, etcdPid, g.pids, say)
	if err != nil {
		return s, "", err
	}
	ok1, failed1 := g.requests()
	s.Requests, s.RequestErrors = round(float64(ok1-ok0)/s.WallS, 2), failed1-failed0
	if dead := g.exited(); dead != "" {
		return CostSample{Contender: name}, "", fmt.Errorf("client processes exited during the window: %s", dead)
	}
	return s, g.unhealthy(), nil
}

// costWindow measures the CPU use of the apiservers, etcd and the
// clients (pids; nil: the bench process) over window.
func costWindow(ctx context.Context, name string, window time.Duration, apiPids func() []int, etcdPid int, pids func() []int, say func(string, ...any)) (CostSample, error) {
	s := CostSample{Contender: name}
	clientPids := func() []int {
		if pids == nil {
			return []int{os.Getpid()}
		}
		return pids()
	}
	api0 := apiPids()
	// read returns the CPU time of each apiserver, of them all, of etcd
	// and of the clients.
	read := func() (each []time.Duration, api, etcd, client time.Duration, err error) {
		for _, p := range api0 {
			d, err := costStatCPU([]int{p})
			if err != nil {
				return nil, 0, 0, 0, fmt.Errorf("apiserver CPU: %w", err)
			}
			each, api = append(each, d), api+d
		}
		etcd, _ = costStatCPU([]int{etcdPid})
		if client, err = costStatCPU(clientPids()); err != nil {
			return nil, 0, 0, 0, fmt.Errorf("client CPU: %w", err)
		}
		return each, api, etcd, client, nil
	}
	each0, a0, e0, c0, err := read()
	if err != nil {
		return s, err
	}
	began := time.Now()
	say("  %s: measuring for %s", name, window)
	select {
	case <-ctx.Done():
		return s, ctx.Err()
	case <-time.After(window):
	}
	wall := time.Since(began)
	if api1 := apiPids(); !slices.Equal(api0, api1) {
		return s, fmt.Errorf("an apiserver restarted during the window (pids %v, then %v)", api0, api1)
	}
	each1, a1, e1, c1, err := read()
	if err != nil {
		return s, err
	}
	perSec := func(d time.Duration) float64 { return round(float64(d.Milliseconds())/wall.Seconds(), 2) }
	s.WallS = round(wall.Seconds(), 2)
	s.APIServerMs, s.EtcdMs, s.ClientMs = perSec(a1-a0), perSec(e1-e0), perSec(c1-c0)
	for i := range each0 {
		s.APIServerEachMs = append(s.APIServerEachMs, perSec(each1[i]-each0[i]))
	}
	return s, nil
}

// costStatCPU returns the CPU time (utime + stime of /proc/PID/stat: every
// thread's, those that exited included) of pids.
func costStatCPU(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, p := range pids {
		if p <= 0 {
			return 0, fmt.Errorf("no process (pid %d)", p)
		}
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "stat"))
		if err != nil {
			return 0, err
		}
		d, err := costParseStat(string(b))
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", p, err)
		}
		total += d
	}
	return total, nil
}

// costParseStat returns utime + stime of a /proc/PID/stat line.
func costParseStat(stat string) (time.Duration, error) {
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so
	// split after the last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", oneLine(stat, 80))
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("utime/stime %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / costUserHZ, nil
}

// costFindEtcd returns the pid of the bed's etcd, a child of this process; 0
// if not found (its column is then 0).
func costFindEtcd() int {
	for _, p := range processTree(os.Getpid()) {
		if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "comm")); err == nil && strings.TrimSpace(string(b)) == "etcd" {
			return p
		}
	}
	return 0
}

// startCostGroup starts n clients of contender name; the -active ones
// send a request every gap.
func startCostGroup(ctx context.Context, e *env, name, dir string, n int, gap time.Duration) (*costGroup, error) {
	switch name {
	case costTransportReadyz:
		return startCostTransport(ctx, e, n, endpoint.ProbeReadyz, costUseNone, gap)
	case costTransportHeld:
		return startCostTransport(ctx, e, n, endpoint.ProbeHeld, costUseNone, gap)
	case costTransportHeldConn:
		return startCostTransport(ctx, e, n, endpoint.ProbeHeld, costUseIdle, gap)
	case costTransportHeldActive:
		return startCostTransport(ctx, e, n, endpoint.ProbeHeld, costUseActive, gap)
	case costLocalProxyReadyz:
		return startCostLocalProxies(ctx, e, dir, n, "readyz", costUseNone, gap)
	case costLocalProxyHeld:
		return startCostLocalProxies(ctx, e, dir, n, "held", costUseNone, gap)
	case costLocalProxyConn:
		return startCostLocalProxies(ctx, e, dir, n, "held", costUseIdle, gap)
	case costLocalProxyActive:
		return startCostLocalProxies(ctx, e, dir, n, "held", costUseActive, gap)
	case costHAProxyKubespray:
		return startCostHAProxies(ctx, e, dir, n, false, costUseNone, gap)
	case costHAProxyConn:
		return startCostHAProxies(ctx, e, dir, n, false, costUseIdle, gap)
	case costHAProxyActive:
		return startCostHAProxies(ctx, e, dir, n, false, costUseActive, gap)
	case costHAProxyInter1s:
		return startCostHAProxies(ctx, e, dir, n, true, costUseNone, gap)
	case costDirectConn:
		return startCostDirect(e, n, costUseIdle, gap, false)
	case costDirectActive:
		return startCostDirect(e, n, costUseActive, gap, false)
	case costDirectActiveOne:
		return startCostDirect(e, n, costUseActive, gap, true)
	}
	return nil, fmt.Errorf("unknown contender %q", name)
}

// startCostTransport builds n transport.Wrap clients, client i of
// apiserver i mod 3 with the others as static endpoints (so that the
// clients are spread over the apiservers, as the proxies spread
// theirs), discovery off (its watch would add to what is measured),
// probe mode; each uses a connection of its own as use says (costConns).
func startCostTransport(ctx context.Context, e *env, n int, mode endpoint.ProbeMode, use costUse, gap time.Duration) (*costGroup, error) {
	_, addrs := e.servers()
	var fs []*transport.Failover
	var conns costConns
	closeAll := func() {
		conns.close()
		for _, f := range fs {
			f.Close()
		}
	}
	err := costStartEach(ctx, n, func(i int) error {
		k := i % len(addrs)
		others := slices.Delete(slices.Clone(addrs), k, k+1)
		f, err := transport.Wrap(ctx, e.bed.RESTConfig(testbed.Direct(k+1)), transport.Options{
			Endpoints: others, DisableDiscovery: true, Probe: mode,
		})
		if err == nil {
			fs = append(fs, f)
		}
		return err
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	return &costGroup{
		connect: conns.connect(use, gap, func() error {
			for _, f := range fs {
				if err := conns.add(f.HTTPClient(), f.Config().Host+"/version"); err != nil {
					return err
				}
			}
			return nil
		}),
		requests: conns.counts,
		unhealthy: func() string {
			var bad []string
			for i, f := range fs {
				bad = append(bad, costUnhealthy(i, addrs, f.Pool().Status())...)
			}
			return costSummary(bad)
		},
		exited: func() string { return "" },
		close:  closeAll,
	}, nil
}

// costSpread is how long starting a contender's clients takes: client i
// starts i × costSpread / n after the first, so that their probes, PINGs
// and checks fall at unrelated moments, as those of a fleet's nodes do,
// rather than all at once (a burst costs a server less than as many
// events spread out: it wakes once for them). The readyz interval of the
// held probes, the longest period among the contenders' but HAProxy
// kubespray's.
const costSpread = endpoint.DefaultReadyzInterval

// costStartEach calls start for clients 0 to n-1, client i at i ×
// costSpread / n after the first (see costSpread), and stops at the first
// error, or when ctx is done.
func costStartEach(ctx context.Context, n int, start func(i int) error) error {
	began := time.Now()
	for i := range n {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(began.Add(time.Duration(i) * costSpread / time.Duration(n)))):
		}
		if err := start(i); err != nil {
			return err
		}
	}
	return nil
}

// costUnhealthy lists the addrs client i does not count healthy, with the
// last error it saw.
func costUnhealthy(i int, addrs []string, st []upstream.Status) []string {
	by := make(map[string]upstream.Status, len(st))
	for _, s := range st {
		by[s.Addr] = s
	}
	var bad []string
	for _, a := range addrs {
		s, ok := by[a]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("client %d: %s not in the pool", i+1, a))
		case s.State != upstream.StateHealthy || s.RTT == 0:
			msg := fmt.Sprintf("client %d: %s %s", i+1, a, s.State)
			if s.LastError != "" {
				msg += " (" + s.LastError + ")"
			}
			bad = append(bad, msg)
		}
	}
	return bad
}

// costSummary shows the first few problems and how many there are.
func costSummary(bad []string) string {
	if len(bad) == 0 {
		return ""
	}
	const show = 3
	if len(bad) <= show {
		return strings.Join(bad, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(bad[:show], "; "), len(bad)-show)
}

// startCostLocalProxies starts n localproxy processes with the bed's
// apiservers as static endpoints, discovery off, --probe=mode, probes
// authenticated with the localproxy identity's token; a client-go HTTP
// client uses a connection through each as use says (costConns); extra
// are more flags for each.
func startCostLocalProxies(ctx context.Context, e *env, dir string, n int, mode string, use costUse, gap time.Duration, extra ...string) (*costGroup, error) {
	kubeconfig := filepath.Join(dir, "localproxy.kubeconfig")
	if err := e.bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.LocalProxyIdentity); err != nil {
		return nil, err
	}
	_, addrs := e.servers()
	var procs []*proc
	var conns costConns
	closeAll := func() {
		conns.close()
		for _, p := range procs {
			p.stop()
		}
	}
	err := costStartEach(ctx, n, func(i int) error {
		listen := "127.0.0.1:" + strconv.Itoa(costLocalProxyPortBase+i)
		p, err := startProc(ctx, fmt.Sprintf("localproxy-%d", i+1), filepath.Join(dir, fmt.Sprintf("localproxy-%d.log", i+1)), listen, e.localproxyBin,
			append(costLocalProxyArgs(addrs, e.bed.CAFile(), e.bed.OriginName(), kubeconfig, i, mode), extra...)...)
		if err == nil {
			procs = append(procs, p)
		}
		return err
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	client := http.Client{Timeout: time.Second}
	return &costGroup{
		connect:  conns.connect(use, gap, func() error { return conns.openLocal(e, costLocalProxyPortBase, len(procs)) }),
		requests: conns.counts,
		pids:     func() []int { return costPids(procs) },
		unhealthy: func() string {
			var bad []string
			for i := range procs {
				var st localproxy.Status
				body, err := getBody(context.Background(), &client, "http://127.0.0.1:"+strconv.Itoa(costLocalProxyHealthPortBase+i)+"/status")
				if err == nil {
					err = json.Unmarshal(body, &st)
				}
				if err != nil {
					bad = append(bad, fmt.Sprintf("localproxy %d: /status: %v", i+1, err))
					continue
				}
				up := make([]upstream.Status, len(st.Upstreams))
				for k, u := range st.Upstreams {
					up[k] = u.Status
					if u.State == "healthy" {
						up[k].State = upstream.StateHealthy
					} else if up[k].State == upstream.StateHealthy {
						up[k].State = upstream.StateUnknown
					}
					if u.LastError == "" && u.State != "healthy" {
						up[k].LastError = u.State
					}
				}
				bad = append(bad, costUnhealthy(i, addrs, up)...)
			}
			return costSummary(bad)
		},
		exited: func() string { return costExited(procs) },
		close:  closeAll,
	}, nil
}

// costLocalProxyArgs are the flags of localproxy instance i: as
// localproxyArgs, on ports of their own, without discovery, --probe=mode.
func costLocalProxyArgs(servers []string, caFile, serverName, kubeconfig string, i int, mode string) []string {
	return []string{
		"--endpoints=" + strings.Join(servers, ","),
		"--bind-address=127.0.0.1",
		"--bind-port=" + strconv.Itoa(costLocalProxyPortBase+i),
		"--health-port=" + strconv.Itoa(costLocalProxyHealthPortBase+i),
		"--ca-file=" + caFile,
		"--tls-server-name=" + serverName,
		"--kubeconfig=" + kubeconfig,
		"--enable-discovery=false",
		"--probe=" + mode,
		"--shutdown-timeout=0",
	}
}

func costPids(procs []*proc) []int {
	out := make([]int, len(procs))
	for i, p := range procs {
		out[i] = p.pid()
	}
	return out
}

func costExited(procs []*proc) string {
	var dead []string
	for _, p := range procs {
		if done, err := p.exited(); done {
			dead = append(dead, fmt.Sprintf("%s (%v; log %s)", p.name, err, p.logPath))
		}
	}
	return costSummary(dead)
}

// costInter1sConfig changes kubespray's HAProxy configuration to check every
// second.
func costInter1sConfig(cfg string) (string, error) {
	const from = "default-server inter 15s downinter 15s "
	if !strings.Contains(cfg, from) {
		return "", fmt.Errorf("haproxy configuration: no %q to change", strings.TrimSpace(from))
	}
	return strings.Replace(cfg, "    "+from,
		"    # not in kubespray: inter 1s downinter 1s (kubespray: 15s).\n    default-server inter 1s downinter 1s ", 1), nil
}

// startCostHAProxies starts n HAProxy processes with kubespray's
// configuration (inter1s: checking every second) on ports of their own;
// a client-go HTTP client uses a connection through each as use says
// (costConns).
func startCostHAProxies(ctx context.Context, e *env, dir string, n int, inter1s bool, use costUse, gap time.Duration) (*costGroup, error) {
	names, addrs := e.servers()
	var procs []*proc
	var socks []string
	var conns costConns
	closeAll := func() {
		conns.close()
		for _, p := range procs {
			p.stop()
		}
	}
	err := costStartEach(ctx, n, func(i int) error {
		listen := "127.0.0.1:" + strconv.Itoa(costHAProxyPortBase+i)
		sock := filepath.Join(dir, fmt.Sprintf("haproxy-%d.sock", i+1))
		cfg := haproxyConfig(listen, names, addrs, sock, 0)
		if inter1s {
			var err error
			if cfg, err = costInter1sConfig(cfg); err != nil {
				return err
			}
		}
		cfgPath := filepath.Join(dir, fmt.Sprintf("haproxy-%d.cfg", i+1))
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return err
		}
		p, err := startProc(ctx, fmt.Sprintf("haproxy-%d", i+1), filepath.Join(dir, fmt.Sprintf("haproxy-%d.log", i+1)), listen, "haproxy", "-db", "-f", cfgPath)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		socks = append(socks, sock)
		return nil
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	return &costGroup{
		connect:  conns.connect(use, gap, func() error { return conns.openLocal(e, costHAProxyPortBase, len(procs)) }),
		requests: conns.counts,
		pids:     func() []int { return costPids(procs) },
		unhealthy: func() string {
			var bad []string
			for i, sock := range socks {
				st, err := haproxyServerStates(sock)
				if err != nil {
					bad = append(bad, fmt.Sprintf("haproxy %d: stats: %v", i+1, err))
					continue
				}
				for _, n := range names {
					if st[n] != "UP" {
						bad = append(bad, fmt.Sprintf("haproxy %d: %s %q", i+1, n, st[n]))
					}
				}
			}
			return costSummary(bad)
		},
		exited: func() string { return costExited(procs) },
		close:  closeAll,
	}, nil
}

// costConns are client connections, one per client, each of its own
// HTTP client, opened with one GET /version and then, as a kubelet's or a
// controller's watch keeps one, left open (costUseIdle) or used for a GET
// /version every gap (costUseActive: run).
type costConns struct {
	clients []*http.Client
	urls    []string
	// ok and failed count the requests of run.
	ok, failed atomic.Int64
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// connect is a costGroup's connect for use: open opens the connections
// (with add or open), then, for costUseActive, their requests start; nil
// for costUseNone.
func (c *costConns) connect(use costUse, gap time.Duration, open func() error) func() error {
	if use == costUseNone {
		return nil
	}
	return func() error {
		if err := open(); err != nil {
			return err
		}
		if use == costUseActive {
			c.run(gap)
		}
		return nil
	}
}

// add opens hc's connection to url's host with one GET of url, the
// request the client repeats.
func (c *costConns) add(hc *http.Client, url string) error {
	if _, err := getBody(context.Background(), hc, url); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	c.clients, c.urls = append(c.clients, hc), append(c.urls, url)
	return nil
}

// open opens a connection to each of hosts, each of its own client-go
// HTTP client (client-go's defaults).
func (c *costConns) open(e *env, hosts []string) error {
	for _, h := range hosts {
		_, hc, _, err := clientGo(e, h)
		if err != nil {
			return err
		}
		if err := c.add(hc, h+"/version"); err != nil {
			return err
		}
	}
	return nil
}

// openLocal opens a connection to each of n proxies listening on
// 127.0.0.1, ports base to base+n-1.
func (c *costConns) openLocal(e *env, base, n int) error {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = "https://127.0.0.1:" + strconv.Itoa(base+i)
	}
	return c.open(e, hosts)
}

// run makes each client send its GET again gap after its last one
// ended, client i first i × gap / n from now (their requests spread, as
// a fleet's are), until close.
func (c *costConns) run(gap time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	n := time.Duration(len(c.clients))
	for i := range c.clients {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			t := time.NewTimer(time.Duration(i) * gap / n)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				rctx, rcancel := context.WithTimeout(ctx, costRequestTimeout)
				_, err := getBody(rctx, c.clients[i], c.urls[i])
				rcancel()
				switch {
				case ctx.Err() != nil:
					return
				case err != nil:
					c.failed.Add(1)
				default:
					c.ok.Add(1)
				}
				t.Reset(gap)
			}
		}()
	}
}

// counts are run's requests so far, answered and failed.
func (c *costConns) counts() (ok, failed int64) { return c.ok.Load(), c.failed.Load() }

// close stops run's requests and closes the connections.
func (c *costConns) close() {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
	}
	for _, hc := range c.clients {
		hc.CloseIdleConnections()
	}
}

// startCostDirect is n client connections straight to the apiservers,
// client i's to apiserver i mod 3 (spread, as transport's and
// localproxy's are) or, with one, all to the first, used as use says,
// and no health check: what the -conn and -active contenders'
// connections and requests cost by themselves.
func startCostDirect(e *env, n int, use costUse, gap time.Duration, one bool) (*costGroup, error) {
	servers := e.bed.APIServers()
	if one {
		servers = servers[:1]
	}
	var conns costConns
	return &costGroup{
		connect: conns.connect(use, gap, func() error {
			hosts := make([]string, n)
			for i := range hosts {
				hosts[i] = servers[i%len(servers)].URL()
			}
			return conns.open(e, hosts)
		}),
		requests:  conns.counts,
		unhealthy: func() string { return "" },
		exited:    func() string { return "" },
		close:     conns.close,
	}, nil
}

// markdown renders the cost table.
func (c *CostResults) markdown(w func(string, ...any)) {
	w("### Health cost at rest and in use")
	w("")
	w("Each contender runs alone in turn: %d clients (idle but for the -conn and -active ones, below: only their health checks; started "+costSpread.String()+" apart in all, so that their checks fall at unrelated moments as a fleet's do) against the three apiservers, measured over %.0fs after every client counts every apiserver healthy and %.0fs more. \"apiserver\": CPU time (utime+stime, /proc/PID/stat) of the three kube-apiserver processes together, less their use at rest (contender none, measured just before and just after), per client per second; etcd likewise. \"client\": the contender's own CPU per client per second (its processes; in-process transport.Wrap and direct clients: the bench process, less its use at rest, which for the -conn and -active ones holds the client-go work of their requests: direct's figure is that work alone; the proxies' clients do that work in the bench process, counted nowhere). Discovery is off for transport.Wrap and localproxy, whose EndpointSlice watch would add to the figures; their probes send a bearer token, HAProxy's are anonymous. Ratios of the apiserver figure against haproxy-kubespray and localproxy-readyz (\"-\": that figure is not above zero, within the noise).",
		c.Config.Clients, c.Config.WindowS, c.Config.SettleS)
	w("")
	if c.Error != "" {
		w("Error: %s", c.Error)
		w("")
	}
	if len(c.Baselines) > 0 {
		var parts []string
		for _, b := range c.Baselines {
			if b.WallS == 0 {
				parts = append(parts, "not measured")
				continue
			}
			parts = append(parts, fmt.Sprintf("%.1f", b.APIServerMs))
		}
		w("Apiservers at rest, before the first contender, between two, after the last: %s ms/s. Each contender's baseline is the mean of the windows just before and after it; \"drift\" is their difference per client, the noise of its apiserver figure.", strings.Join(parts, ", "))
		w("")
	}
	w("The -conn contenders' clients each keep one client-go connection (one GET /version, then idle), the -active ones send GET /version on it every %s (a busy node agent); \"above direct\": the apiserver figure less direct-conn's, direct-active's or, for HAProxy's, direct-active-one's (the same connections and requests, spread over the apiservers as the contender spreads them, no health check at all), what health checking costs per client in use; \"req/client/s\": the -active clients' requests answered per second each, the same for every contender if the comparison holds.", time.Duration(c.Config.ActiveGapS*float64(time.Second)))
	w("")
	w("| contender | apiserver ms/client/s | drift | above direct | vs haproxy-kubespray | vs localproxy-readyz | etcd ms/client/s | client ms/client/s | req/client/s | each apiserver ms/s | 5,000 nodes: apiserver cores |")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range c.Rows {
		if r.Error != "" || r.Raw.WallS == 0 {
			msg := r.Error
			if msg == "" {
				msg = "not measured"
			}
			w("| %s | error: %s | | | | | | | | | |", r.Contender, strings.ReplaceAll(oneLine(msg, 300), "|", "/"))
			continue
		}
		name := r.Contender
		if r.Unhealthy != "" {
			name += " (at the end: " + strings.ReplaceAll(oneLine(r.Unhealthy, 200), "|", "/") + ")"
		}
		above := "-"
		if r.AboveDirect != nil {
			above = fmt.Sprintf("%.3f", *r.AboveDirect)
		}
		if r.Raw.RequestErrors > 0 {
			name += fmt.Sprintf(" (%d requests failed)", r.Raw.RequestErrors)
		}
		each := make([]string, len(r.Raw.APIServerEachMs))
		for i, ms := range r.Raw.APIServerEachMs {
			each[i] = fmt.Sprintf("%.0f", ms)
		}
		w("| %s | %.3f | %.3f | %s | %s | %s | %.3f | %.3f | %s | %s | %.2f |", name, r.APIServerPerClient, r.Drift, above, fmtRatio(r.VsHAProxy), fmtRatio(r.VsLocalProxy),
			r.EtcdPerClient, r.ClientPerClient, fmtPositive("%.2f", r.ReqPerClientS), cmp.Or(strings.Join(each, " / "), "-"), r.Cores5000)
	}
	w("")
	w("5,000 nodes, one client each, each checking the 3 API servers: cores of API server CPU = ms/client/s × 5000 clients / 1000 ms per core-second:")
	w("")
	for _, r := range c.Rows {
		if r.Error == "" && r.Raw.WallS > 0 {
			w("- %s: %.3f × 5000 / 1000 = %.2f cores", r.Contender, r.APIServerPerClient, r.Cores5000)
		}
	}
	w("")
}
