package e2e_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport/endpoint"
)

// Budgets and waits.
const (
	// resumeBudget: a hung or blackholed serving apiserver must be
	// replaced, for requests and for the informer, within this time.
	resumeBudget = 3 * time.Second
	// heldDetectBudget: with held probes a killed, blackholed or hung
	// serving apiserver must be marked down within this time (a PING
	// every 250ms, down 300ms after one unanswered: about 0.4s; the rest
	// is room for a loaded 2-core machine).
	heldDetectBudget = 1500 * time.Millisecond
	// afterResume is how long the load keeps running once the client has
	// resumed, so that late failures show.
	afterResume = time.Second
	// observeLimit bounds every wait for something to happen.
	observeLimit = 30 * time.Second
	// catchUp bounds the wait for the informer to see every created
	// object when the workload stops (client-go's reflector backs off up
	// to 30 s after failed lists).
	catchUp = 45 * time.Second
)

// env is one scenario's run on one path.
type env struct {
	t   *testing.T
	ctx context.Context
	bed *testbed.Bed
	c   *client
	row *row
	// faultAt is when the scenario's first fault was in place (inject).
	faultAt time.Time
	// kubectlTolerated are the windows in which kubectl runs may fail
	// (tolerateKubectl).
	kubectlTolerated [][2]time.Time
	// clientCert is the client's certificate file, for scenarios with
	// clientCert set.
	clientCert *clientCertFile
	// readyzInterval is the client's held /readyz interval, zero for the
	// default (endpoint.DefaultReadyzInterval).
	readyzInterval time.Duration
	// probe is the client's probe mode.
	probe endpoint.ProbeMode
}

// figure records a measurement in the summary row (to the millisecond)
// and the test log.
func (e *env) figure(name string, v float64, unit string) {
	if e.row.Figures == nil {
		e.row.Figures = make(map[string]float64)
	}
	e.row.Figures[name] = math.Round(v*1000) / 1000
	e.t.Logf("figure: %s = %.3f %s", name, v, unit)
}

// seconds records a duration figure.
func (e *env) seconds(name string, d time.Duration) float64 {
	s := math.Round(d.Seconds()*1000) / 1000
	e.figure(name, s, "s")
	return s
}

// startLoad starts a workload through the path's client in a namespace of
// its own. It is stopped by finish or, if the test fails first, by cleanup.
func (e *env) startLoad(cfg workload.Config) *workload.Workload {
	e.t.Helper()
	cfg.RESTConfig = e.c.Config
	cfg.HTTPClient = e.c.HTTPClient
	cfg.Serving = e.c.Serving
	if cfg.Namespace == "" {
		cfg.Namespace = e.namespace()
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	w, err := workload.Start(e.ctx, cfg)
	if err != nil {
		e.t.Fatalf("workload: %v", err)
	}
	e.t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w.Stop(sctx)
	})
	return w
}

// settle waits until the fresh client knows and has measured every
// apiserver (see client.Settled).
func (e *env) settle() {
	e.t.Helper()
	var addrs []string
	for _, s := range e.bed.APIServers() {
		addrs = append(addrs, s.Addr())
	}
	began := time.Now()
	if err := e.waitFor("client settled", observeLimit, func() bool { return e.c.Settled(addrs) }); err != nil {
		e.t.Fatalf("%v; endpoints %v", err, e.c.Endpoints())
	}
	e.t.Logf("client settled on %v after %s", addrs, time.Since(began).Round(time.Millisecond))
}

// namespace is the scenario's namespace: path and scenario name.
func (e *env) namespace() string {
	return strings.ToLower(e.row.Path + "-" + e.row.Scenario)
}

// waitSteady waits until every running apiserver is healthy in the
// client's view and the workload runs on one apiserver: GETs succeed and
// the informer sees writes (see converged).
func (e *env) waitSteady(w *workload.Workload) {
	e.t.Helper()
	began := time.Now()
	err := e.waitFor("steady state", observeLimit, func() bool {
		eps := e.c.Endpoints()
		for _, s := range e.bed.APIServers() {
			if eps[s.Addr()] != "healthy" {
				return false
			}
		}
		r := w.Snapshot()
		_, seen := r.FirstSeenWrite(began)
		return seen && e.converged(w, began)
	})
	if err != nil {
		e.t.Fatalf("%v; endpoints %v, serving %q, watch on %q", err, e.c.Endpoints(), e.c.Serving(), w.WatchEndpoint())
	}
	// A little history before the fault.
	e.sleep(500 * time.Millisecond)
}

// converged reports whether the workload's traffic runs on one apiserver
// since t: the client's serving apiserver carries the informer's watch
// and the last successful GETs and creates, when the client reports
// endpoints (see workload.Request.Endpoint).
func (e *env) converged(w *workload.Workload, t time.Time) bool {
	serving := e.c.Serving()
	if serving == "" {
		return false
	}
	if !e.isAPIServer(w.WatchEndpoint()) {
		return true // the client does not say which endpoint serves
	}
	if w.WatchEndpoint() != serving {
		return false
	}
	r := w.Snapshot()
	for _, rs := range [][]workload.Request{r.Gets, r.Writes} {
		n := 0
		for i := len(rs) - 1; i >= 0 && n < 3; i-- {
			if rs[i].OK() && !rs[i].Start.Before(t) {
				if rs[i].Endpoint != serving {
					return false
				}
				n++
			}
		}
		if n < 3 && rs != nil {
			return false
		}
	}
	return true
}

func (e *env) isAPIServer(addr string) bool {
	for _, s := range e.bed.APIServers() {
		if s.Addr() == addr {
			return true
		}
	}
	return false
}

// serving returns the test bed apiserver serving the workload (the one
// with the informer's watch, when the client reports it).
func (e *env) serving(w *workload.Workload) *testbed.APIServer {
	e.t.Helper()
	addr := w.WatchEndpoint()
	if !e.isAPIServer(addr) {
		addr = e.c.Serving()
	}
	for _, s := range e.bed.APIServers() {
		if s.Addr() == addr {
			return s
		}
	}
	e.t.Fatalf("serving %q is no apiserver of the bed", addr)
	return nil
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func (e *env) waitFor(what string, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not reached within %s", what, timeout)
		case <-tick.C:
		}
	}
	return nil
}

// sleep lets the workload run for d (the workload, not the test, is what
// is being observed).
func (e *env) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.ctx.Done():
	case <-t.C:
	}
}

// waitResumed waits until, after fault time t0, a GET and a create sent
// after t0 succeeded and the informer saw such a create; then lets the
// load run afterResume longer.
func (e *env) waitResumed(w *workload.Workload, t0 time.Time) {
	e.t.Helper()
	err := e.waitFor("resume after the fault", observeLimit, func() bool {
		r := w.Snapshot()
		_, get := r.FirstGetOK(t0)
		_, seen := r.FirstSeenWrite(t0)
		return get && seen
	})
	if err != nil {
		e.t.Error(err)
	}
	e.sleep(afterResume)
}

// stopLoad stops the workload, waiting for the informer to catch up, and
// fills the common figures of the row.
func (e *env) stopLoad(w *workload.Workload) workload.Results {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, catchUp)
	defer cancel()
	began := time.Now()
	r := w.Stop(ctx)
	if lost := r.Lost(); len(lost) > 0 {
		e.t.Errorf("informer never saw %d created ConfigMaps (waited %s): %v", len(lost), catchUp, firstN(lost, 10))
	} else {
		e.seconds("informer_catch_up", time.Since(began))
	}
	e.row.EventsLost = len(r.Lost())
	e.row.Duplicates = len(r.Duplicates())
	e.row.FailedGets = r.FailedGets()
	e.row.FailedWrites = r.FailedWrites()
	e.row.FailedRequests = e.row.FailedGets + e.row.FailedWrites
	e.row.Gets = len(r.Gets)
	e.row.Writes = len(r.Writes)
	e.row.Relists = r.Relists()
	e.t.Logf("load: %d GETs (%d failed, %d skipped), %d creates (%d failed), %d seen, %d lost, %d lists (%d relists), %d resumed watches, %d watch errors",
		len(r.Gets), r.FailedGets(), r.SkippedGets, len(r.Writes), r.FailedWrites(), len(r.Seen), len(r.Lost()), r.Lists, r.Relists(), r.Watches, r.WatchErrors)
	return r
}

// logTimeline prints the notable events from 2 s before t0 on: serving
// changes, list and watch requests, watch errors and failed requests.
func (e *env) logTimeline(r workload.Results, t0 time.Time) {
	var b strings.Builder
	failed := 0
	for _, ev := range r.Timeline {
		if ev.Time.Before(t0.Add(-2 * time.Second)) {
			continue
		}
		switch {
		case ev.Kind == workload.KindServing, ev.Kind == workload.KindList, ev.Kind == workload.KindWatch, ev.Kind == workload.KindWatchError:
		case (ev.Kind == workload.KindGet || ev.Kind == workload.KindWrite) && ev.Err != nil:
			failed++
			if failed > 20 {
				continue
			}
		default:
			continue
		}
		fmt.Fprintf(&b, "\n  %+7.3fs %-11s", ev.Time.Sub(t0).Seconds(), ev.Kind)
		if ev.Name != "" {
			fmt.Fprintf(&b, " %s", ev.Name)
		}
		if ev.Latency > 0 {
			fmt.Fprintf(&b, " after %s", ev.Latency.Round(time.Millisecond))
		}
		if ev.Endpoint != "" {
			fmt.Fprintf(&b, " via=%s", ev.Endpoint)
		}
		if ev.Serving != "" && ev.Kind == workload.KindServing {
			fmt.Fprintf(&b, " serving=%s", ev.Serving)
		}
		if ev.Err != nil {
			fmt.Fprintf(&b, " err=%s", oneLine(ev.Err.Error(), 300))
		}
	}
	if failed > 20 {
		fmt.Fprintf(&b, "\n  (%d failed requests in all)", failed)
	}
	e.t.Logf("timeline (t0 = fault):%s", b.String())
}

func others(bed *testbed.Bed, not ...*testbed.APIServer) []*testbed.APIServer {
	return slices.DeleteFunc(bed.APIServers(), func(s *testbed.APIServer) bool { return slices.Contains(not, s) })
}

func firstN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " | ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// sum adds up per-endpoint counts.
func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
