package e2e_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

// scenario is one fault injected under load. run asserts its invariants
// and fills e.row.
type scenario struct {
	name  string
	fault string
	run   func(e *env)
}

var scenarios = []scenario{
	{"S1-kill", "SIGKILL the serving apiserver", s1Kill},
	{"S2-blackhole", "iptables DROP to and from the serving apiserver", s2Blackhole},
	{"S3-hang", "SIGSTOP the serving apiserver", s3Hang},
	{"S4-graceful", "SIGTERM the serving apiserver (shutdown delay 2s)", s4Graceful},
	{"S5-generatename", "SIGKILL then blackhole the serving apiserver under generateName creates", s5GenerateName},
	{"S6-all-down", "SIGKILL every apiserver, then restart one", s6AllDown},
	{"S7-churn", "AddAPIServer, move traffic to it, RemoveAPIServer", s7Churn},
	{"S8-etcd-pause", "SIGSTOP etcd for 5s: every apiserver fails /readyz at once", s8EtcdPause},
}

// TestFailover runs every scenario on every path against one test bed,
// healed between scenarios so each starts with every apiserver healthy.
func TestFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
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
				c := p.connect(t, ctx, bed)
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("client log:\n%s", c.Log())
					}
				})
				e := &env{t: t, ctx: ctx, bed: bed, c: c, row: r}
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
