package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// path is one way for a client to reach the API servers. Every scenario
// runs once per path.
type path struct {
	name string
	// connect builds a client for bed. It registers its own cleanup.
	connect func(t *testing.T, ctx context.Context, bed *testbed.Bed) *client
}

// paths are the client paths under test. A localproxy path adds an entry:
// a kubeconfig for testbed.LocalProxy served by a localproxy.Run started
// in connect, its /status for Endpoints/OpenConns/Serving and its dial
// metrics for DialAttempts.
var paths = []path{
	{name: "transport", connect: connectTransport},
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
	// Log returns what the client logged (state changes, failovers) and
	// its current state, for failed scenarios.
	Log func() string
}

// recoverySlack is added to rise × interval for the recovery budget.
const recoverySlack = 2 * time.Second

// connectTransport is the in-process path: transport.Wrap on the origin
// config with default options (discovery on).
func connectTransport(t *testing.T, ctx context.Context, bed *testbed.Bed) *client {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	opts := transport.Options{Registerer: reg, Logger: logs.logger()}
	f, err := transport.Wrap(ctx, bed.RESTConfig(testbed.Origin), opts)
	if err != nil {
		t.Fatalf("transport.Wrap: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	cfg := f.Pool().Config()
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
		DialAttempts:   func() map[string]int { return dialAttempts(t, reg) },
		RecoveryBudget: time.Duration(cfg.Rise)*cfg.Interval + recoverySlack,
		Log: func() string {
			st, _ := json.MarshalIndent(f.Pool().Status(), "", "  ")
			return fmt.Sprintf("%s\npool: %s\nopen connections: %v", logs.String(), st, f.OpenConns())
		},
	}
}

// dialAttempts sums apifailover_dial_duration_seconds observations per
// endpoint: one per connection attempt, successful or not.
func dialAttempts(t *testing.T, reg *prometheus.Registry) map[string]int {
	out := make(map[string]int)
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gathering metrics: %v", err)
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "apifailover_dial_duration_seconds" {
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
