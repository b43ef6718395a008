package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// path is one way for a client to reach the API servers. Every scenario
// runs once per path.
type path struct {
	name string
	// connect builds a client for bed. It registers its own cleanup.
	// auth, if set, changes the client's credentials (the admin token by
	// default) before it is built.
	connect func(t *testing.T, ctx context.Context, bed *testbed.Bed, o connectOptions) *client
}

// paths are the client paths under test: transport.Wrap in-process, and
// testbed.LocalProxy (https://127.0.0.1:7445) served by a localproxy.Run
// started in connect (see connectLocalProxy).
var paths = []path{
	{name: "transport", connect: connectTransport},
	{name: "localproxy", connect: connectLocalProxy},
}

// client is what a scenario needs from a path.
type client struct {
	// Config and HTTPClient are the client under test.
	Config     *rest.Config
	HTTPClient *http.Client
	// Serving is the apiserver ("host:port") the client's traffic goes to
	// now, "" if none (workload.Config.Serving).
	Serving func() string
	// Endpoints returns the client's endpoints and their health state
	// ("healthy", "unhealthy", ...).
	Endpoints func() map[string]string
	// Preferred returns the endpoint the client's pool puts first.
	Preferred func() string
	// Subscribe passes the changes of the client's pool to fn, in order,
	// until cancel.
	Subscribe func(fn func(upstream.Event)) (cancel func())
	// Settled reports whether the client knows addrs, healthy, well
	// enough that its choice will not move without cause (for the
	// transport: probed, RTT measured). Scenarios start their load then,
	// so the informer's watch and the requests start on one apiserver.
	Settled func(addrs []string) bool
	// OpenConns returns the client's open connections per endpoint.
	OpenConns func() map[string]int
	// DialAttempts returns the connection attempts (TCP connect + TLS) the
	// client made so far per endpoint, health probes excluded.
	DialAttempts func() map[string]int
	// RecoveryBudget is how soon after an apiserver becomes ready again,
	// with every apiserver down before, requests must succeed.
	RecoveryBudget time.Duration
	// KillBudget bounds the GET resume time of S1 (SIGKILL of the
	// serving apiserver); if zero, resumeBudget. The informer's resume is
	// held to resumeBudget either way (client-go's reflector waits about
	// a second before it watches again).
	KillBudget time.Duration
	// ShutdownRefusalsReachClient marks an L4 path: the 429 (Retry-After)
	// a stopping apiserver answers to new requests on a drained connection
	// reaches the client, whose client-go retries it by itself (the
	// workload turns those retries off). The request was not processed.
	// S4 and S7 count such refusals apart from failures.
	ShutdownRefusalsReachClient bool
	// Kubeconfig, if set, is a kubeconfig for the path (a node's, pointing
	// at the proxy): every scenario also runs the real kubectl through it
	// (see kubectlLoop), with its discovery cache in KubectlCacheDir.
	Kubeconfig, KubectlCacheDir string
	// ClientConns returns how many connections the client side opened so
	// far (a proxy's accepted connections); nil for in-process clients.
	ClientConns func() int
	// Log returns what the client logged (state changes, failovers) and
	// its current state, for failed scenarios.
	Log func() string
}

// recoverySlack is added to rise × interval for the recovery budget.
const recoverySlack = 2 * time.Second

// connectTransport is the in-process path: transport.Wrap on the origin
// config with default options (discovery on).
func connectTransport(t *testing.T, ctx context.Context, bed *testbed.Bed, o connectOptions) *client {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	opts := transport.Options{Registerer: reg, Logger: logs.logger(), Probe: o.probeMode(t), ProbeReadyzInterval: o.readyzInterval}
	cfg := bed.RESTConfig(testbed.Origin)
	if o.auth != nil {
		o.auth(cfg)
	}
	f, err := transport.Wrap(ctx, cfg, opts)
	if err != nil {
		t.Fatalf("transport.Wrap: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	pcfg := f.Pool().Config()
	return &client{
		Config:     f.Config(),
		HTTPClient: f.HTTPClient(),
		Serving:    workload.FailoverServing(f),
		Endpoints: func() map[string]string {
			out := make(map[string]string)
			for _, s := range f.Pool().Status() {
				out[s.Addr] = s.State.String()
			}
			return out
		},
		Settled: func(addrs []string) bool {
			st := make(map[string]upstream.Status)
			for _, s := range f.Pool().Status() {
				st[s.Addr] = s
			}
			for _, a := range addrs {
				if s, ok := st[a]; !ok || s.State != upstream.StateHealthy || s.RTT == 0 {
					return false
				}
			}
			return true
		},
		OpenConns:      f.OpenConns,
		DialAttempts:   func() map[string]int { return dialAttempts(t, reg, "apifailover_dial_duration_seconds") },
		Preferred:      func() string { return preferred(f.Pool()) },
		Subscribe:      f.Pool().Subscribe,
		RecoveryBudget: time.Duration(pcfg.Rise)*pcfg.Interval + recoverySlack,
		Log: func() string {
			st, _ := json.MarshalIndent(f.Pool().Status(), "", "  ")
			return fmt.Sprintf("%s\npool: %s\nopen connections: %v", logs.String(), st, f.OpenConns())
		},
	}
}

// dialAttempts sums the observations of histogram metric per endpoint
// (apifailover_dial_duration_seconds for the transport,
// apifailover_localproxy_dial_duration_seconds for the proxy): one per
// connection attempt, successful or not.
func dialAttempts(t *testing.T, reg *prometheus.Registry, metric string) map[string]int {
	out := make(map[string]int)
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gathering metrics: %v", err)
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			ep := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					ep = l.GetValue()
				}
			}
			out[ep] += int(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// logBuffer collects log lines with their time, for printing when a
// scenario fails (a test's t.Log must not be called after it ends, and
// the client's goroutines may log late).
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.lines) < 2000 {
			b.lines = append(b.lines, fmt.Sprintf("%s %s %s", time.Now().Format("15:04:05.000"), prefix, args))
		}
	}, funcr.Options{Verbosity: 2})
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// Addresses of the in-process localproxy: testbed.LocalProxy points at
// proxyAddr.
const (
	proxyAddr       = "127.0.0.1:7445"
	proxyHealthAddr = "127.0.0.1:7446"
)

// connectOptions are what a scenario changes in a path's client.
type connectOptions struct {
	// auth, if set, changes the client's credentials.
	auth func(*rest.Config)
	// readyzInterval, if set, is the held probes' GET /readyz interval
	// (default endpoint.DefaultReadyzInterval).
	readyzInterval time.Duration
	// probe, if set, is the probe mode instead of APIFAILOVER_E2E_PROBE.
	probe endpoint.ProbeMode
	// zone, if set, is the proxy's zone and zones the apiservers' (by
	// address): every apiserver address is on this network namespace's
	// loopback, so none counts as local then, and the one in zone is
	// preferred.
	zone  string
	zones map[string]string
	// failbackSettle, if set, is the proxy's FailbackSettle.
	failbackSettle time.Duration
}

// probeMode is o's probe mode, else the suite's.
func (o connectOptions) probeMode(t *testing.T) endpoint.ProbeMode {
	if o.probe != "" {
		return o.probe
	}
	return probeMode(t)
}

// probeMode is the health check of both paths: APIFAILOVER_E2E_PROBE
// (held, readyz, tls, tcp), held if unset, as in both paths.
func probeMode(t *testing.T) endpoint.ProbeMode {
	m, err := endpoint.ParseProbeMode(os.Getenv("APIFAILOVER_E2E_PROBE"))
	if err != nil {
		t.Fatalf("APIFAILOVER_E2E_PROBE: %v", err)
	}
	return m
}

// startLocalProxy runs a localproxy in this process (inside the bed's
// network namespace) on proxyAddr, health on proxyHealthAddr, in front of
// the bed's apiservers: readyz probes verified with the bed's CA and
// origin name, discovery through the proxy as the localproxy identity. It
// returns once the listeners are bound; cleanup stops it and waits.
// waitProxyHealthy waits until p counts every apiserver of bed healthy.
func waitProxyHealthy(t *testing.T, ctx context.Context, bed *testbed.Bed, p *localproxy.Proxy) {
	t.Helper()
	e := &env{t: t, ctx: ctx, bed: bed}
	if err := e.waitFor("every apiserver healthy in the proxy", observeLimit, func() bool {
		st := p.Pool().Status()
		for _, s := range st {
			if s.State != upstream.StateHealthy {
				return false
			}
		}
		return len(st) == len(bed.APIServers())
	}); err != nil {
		t.Fatal(err)
	}
}

func startLocalProxy(t *testing.T, ctx context.Context, bed *testbed.Bed, reg *prometheus.Registry, log logr.Logger, o connectOptions) *localproxy.Proxy {
	t.Helper()
	cfg, err := bed.LocalProxyConfig(proxyAddr, proxyHealthAddr, o.probeMode(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Probe.ReadyzInterval = o.readyzInterval
	cfg.Pool.Zone = o.zone
	if o.zone != "" {
		cfg.Pool.IsLocal = func(string) bool { return false }
	}
	cfg.FailbackSettle = o.failbackSettle
	cfg.Registry, cfg.Logger = reg, log
	eps := cfg.Endpoints
	p, err := localproxy.New(cfg)
	if err != nil {
		t.Fatalf("localproxy.New: %v", err)
	}
	if o.zones != nil {
		specs := make([]upstream.Spec, len(eps))
		for i, a := range eps {
			specs[i] = upstream.Spec{Addr: a, Zone: o.zones[a]}
		}
		if err := p.Pool().Set(upstream.SourceStatic, specs); err != nil {
			t.Fatalf("zones: %v", err)
		}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("localproxy.Run: %v", err)
		}
	})
	select {
	case <-p.Ready():
	case err := <-done:
		done <- err
		t.Fatalf("localproxy.Run: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return p
}

// connectLocalProxy is the node-local proxy path: a localproxy in this
// process and an admin client for testbed.LocalProxy through it.
func connectLocalProxy(t *testing.T, ctx context.Context, bed *testbed.Bed, o connectOptions) *client {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	p := startLocalProxy(t, ctx, bed, reg, logs.logger(), o)
	cfg := bed.RESTConfig(testbed.LocalProxy)
	if o.auth != nil {
		o.auth(cfg)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("rest.HTTPClientFor: %v", err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	pcfg := p.Pool().Config()
	kubeconfig := filepath.Join(t.TempDir(), "localproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	status := func() map[string]upstream.Status {
		out := make(map[string]upstream.Status)
		for _, s := range p.Pool().Status() {
			out[s.Addr] = s
		}
		return out
	}
	return &client{
		Config:     cfg,
		HTTPClient: hc,
		// The endpoint with the most proxied connections (the client's
		// and discovery's), the preferred one on a tie.
		Serving: workload.PoolServing(p.Pool()),
		Endpoints: func() map[string]string {
			out := make(map[string]string)
			for a, s := range status() {
				out[a] = s.State.String()
			}
			return out
		},
		Settled: func(addrs []string) bool {
			st := status()
			for _, a := range addrs {
				if s, ok := st[a]; !ok || s.State != upstream.StateHealthy || s.RTT == 0 {
					return false
				}
			}
			return true
		},
		// Connections to endpoints in the pool and to removed ones that
		// are still draining.
		OpenConns: func() map[string]int {
			st := p.Status()
			out := make(map[string]int)
			for _, u := range st.Upstreams {
				if u.Conns > 0 {
					out[u.Addr] = u.Conns
				}
			}
			for _, u := range st.Removed {
				out[u.Addr] += u.Conns
			}
			return out
		},
		Preferred:                   func() string { return preferred(p.Pool()) },
		Subscribe:                   p.Pool().Subscribe,
		DialAttempts:                func() map[string]int { return dialAttempts(t, reg, "apifailover_localproxy_dial_duration_seconds") },
		RecoveryBudget:              time.Duration(pcfg.Rise)*pcfg.Interval + recoverySlack,
		KillBudget:                  100 * time.Millisecond, // issue 4
		ShutdownRefusalsReachClient: true,
		Kubeconfig:                  kubeconfig,
		KubectlCacheDir:             t.TempDir(),
		ClientConns:                 func() int { return counter(t, reg, "apifailover_localproxy_connections_accepted_total") },
		Log: func() string {
			st, _ := json.MarshalIndent(p.Status(), "", "  ")
			return fmt.Sprintf("%s\nproxy: %s", logs.String(), st)
		},
	}
}

// counter returns the value of an unlabelled counter in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) int {
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gathering metrics: %v", err)
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			n := 0
			for _, m := range mf.GetMetric() {
				n += int(m.GetCounter().GetValue())
			}
			return n
		}
	}
	return 0
}

// preferred is the endpoint pool puts first, "" if none.
func preferred(pool *upstream.Pool) string {
	for _, s := range pool.Status() {
		if s.Preferred {
			return s.Addr
		}
	}
	return ""
}
