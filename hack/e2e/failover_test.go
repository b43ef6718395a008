package e2e_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
	"github.com/apifailover/apifailover/transport/endpoint"
)

// scenario is one fault injected under load. run asserts its invariants
// and fills e.row.
type scenario struct {
	name  string
	fault string
	run   func(e *env)
	// clientCert, if set, makes the client authenticate with a client
	// certificate file (see withClientCert) instead of the admin token.
	clientCert bool
	// readyzInterval, if set, is the client's held /readyz interval.
	readyzInterval time.Duration
	// probe, if set, is the client's probe mode instead of the suite's.
	probe endpoint.ProbeMode
}

var scenarios = []scenario{
	{name: "S1-kill", fault: "SIGKILL the serving apiserver", run: s1Kill},
	{name: "S2-blackhole", fault: "iptables DROP to and from the serving apiserver", run: s2Blackhole},
	{name: "S3-hang", fault: "SIGSTOP the serving apiserver", run: s3Hang},
	// With /readyz every second, within the shutdown delay: new requests
	// leave at once. With the default (10s, longer than the delay) they
	// leave on the server's GOAWAY when the delay ends: S4b.
	{name: "S4-graceful", fault: "SIGTERM the serving apiserver (shutdown delay 2s)", run: s4Graceful, readyzInterval: time.Second},
	{name: "S4b-graceful-goaway", fault: "SIGTERM the serving apiserver (shutdown delay 2s, shorter than the /readyz interval)", run: s4Graceful},
	{name: "S5-generatename", fault: "SIGKILL then blackhole the serving apiserver under generateName creates", run: s5GenerateName},
	{name: "S6-all-down", fault: "SIGKILL every apiserver, then restart one", run: s6AllDown},
	{name: "S7-churn", fault: "AddAPIServer, move traffic to it, RemoveAPIServer", run: s7Churn},
	// The pause is shorter than the held probes' default /readyz interval
	// (10s), which would mostly not see it: /readyz every second, so that
	// every apiserver fails it and the clients fail open.
	{name: "S8-etcd-pause", fault: "SIGSTOP etcd until every apiserver is marked down (at most 7s): every apiserver fails /readyz at once", run: s8EtcdPause, readyzInterval: time.Second},
	// The shim slows only new connections; a held probe connection made
	// before keeps its speed, and only new connections could tell. So
	// the probes here make a new connection each, as the readyz mode
	// does (a server slow itself is seen by the held connection's PINGs,
	// as in S3).
	{name: "S9-slow", fault: "new connections to the serving apiserver answer slowly (+300ms handshake, +2s per response)", run: s9Slow, probe: endpoint.ProbeReadyz},
	{name: "S10-lossy", fault: "20% of packets to and from the serving apiserver dropped at random", run: s10Lossy},
	{name: "S11-cert", fault: "an apiserver restarts with a not-yet-valid serving certificate, then a misnamed one, then a good one", run: s11Cert},
	{name: "S12-client-cert-rotation", fault: "the client certificate file is replaced before the old certificate expires", run: s12ClientCertRotation, clientCert: true},
}

// TestFailover runs every scenario on every path against one test bed,
// healed between scenarios so each starts with every apiserver healthy.
func TestFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 35*time.Minute)
	defer cancel()
	bed := startBed(t, ctx)
	for _, p := range paths {
		for _, sc := range scenarios {
			t.Run(p.name+"/"+sc.name, func(t *testing.T) {
				r := &row{Scenario: sc.name, Path: p.name, Fault: sc.fault}
				addRow(r)
				began := time.Now()
				t.Cleanup(func() {
					r.Passed = !t.Failed()
					r.DurationSeconds = math.Round(time.Since(began).Seconds()*1000) / 1000
				})
				if err := bed.Heal(ctx); err != nil {
					r.Error = err.Error()
					t.Fatalf("heal before the scenario: %v", err)
				}
				var cc *clientCertFile
				o := connectOptions{readyzInterval: sc.readyzInterval, probe: sc.probe}
				if sc.clientCert {
					cc, o.auth = withClientCert(t, bed)
				}
				c := p.connect(t, ctx, bed, o)
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("client log:\n%s", c.Log())
					}
				})
				e := &env{t: t, ctx: ctx, bed: bed, c: c, row: r, clientCert: cc, readyzInterval: sc.readyzInterval, probe: o.probeMode(t)}
				e.settle()
				e.startKubectl()
				sc.run(e)
			})
		}
	}
}

// startBed starts a bed of three apiservers (see bedtest.Start).
func startBed(t *testing.T, ctx context.Context) *testbed.Bed {
	t.Helper()
	bed := bedtest.Start(t, ctx, testbed.Options{APIServers: 3})
	if !bed.LoopbackExempt() {
		t.Log("apiserver loopback connections are not exempt from faults: a blackholed apiserver may flap in the EndpointSlice")
	}
	return bed
}
