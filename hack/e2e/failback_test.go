package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Fail-back scenario settings: a short settle time, the default rate.
const (
	failbackSettle = 3 * time.Second
	failbackRate   = localproxy.DefaultFailbackRate
	// failbackIdleClients are clients that each hold one HTTP/2
	// connection through the proxy, mostly idle (a GET every 2s), as
	// kube-proxy's and a CNI's do.
	failbackIdleClients = 4
	// failbackLimit bounds the time from the preferred apiserver's
	// return until every client connection is on it: the settle time,
	// the closes at the rate, and the clients' own reconnects.
	failbackLimit = 30 * time.Second
)

// testFailback: the proxy is in zone a, and so is one apiserver, home,
// which it prefers. kubectl loops, a client-go informer (with a writer)
// and idle long-lived clients go through the proxy while every apiserver
// is restarted gracefully, one after another, home last; its connections
// then land on the others. Once home is back and has been healthy for the
// settle time, fail-back moves every client connection to it, gradually.
// No kubectl run fails and the informer misses no object.
func testFailback(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	servers := bed.APIServers()
	if len(servers) < 2 {
		t.Fatalf("want at least 2 apiservers, have %d", len(servers))
	}
	home := servers[0]
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	p := startLocalProxy(t, ctx, bed, reg, logs.logger(), connectOptions{
		zone: "zone-a", zones: map[string]string{home.Addr(): "zone-a"}, failbackSettle: failbackSettle,
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	waitProxyHealthy(t, ctx, bed, p)
	e := &env{t: t, ctx: ctx, bed: bed, row: &row{}}
	if got := preferred(p.Pool()); got != home.Addr() {
		t.Fatalf("the proxy prefers %s, want %s (zone-a): %+v", got, home.Addr(), p.Pool().Status())
	}

	kubeconfig := filepath.Join(t.TempDir(), "localproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	const ns = "failback-kubectl"
	if _, err := kubectlAt(ctx, bed, kubeconfig, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	cfg := bed.RESTConfig(testbed.LocalProxy)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	w, err := workload.Start(ctx, workload.Config{RESTConfig: cfg, HTTPClient: hc, Namespace: "failback-informer",
		WriteInterval: 500 * time.Millisecond, GetInterval: -1})
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	idle := startIdleClients(ctx, t, bed, failbackIdleClients)
	loop := startKubectlLoop(ctx, bed, kubeconfig, t.TempDir(), ns)
	closes := sampleCounter(ctx, t, reg, "apifailover_localproxy_failback_closed_total")

	onHome := func() bool {
		conns := clientConns(p)
		for addr, n := range conns {
			if addr != home.Addr() && n > 0 {
				return false
			}
		}
		return conns[home.Addr()] > failbackIdleClients
	}
	if err := e.waitFor("every client connection on "+home.Addr(), observeLimit, onHome); err != nil {
		t.Fatalf("%v: %v", err, clientConns(p))
	}

	// Rolling restart, home last.
	order := append(others(bed, home), home)
	var homeBack time.Time
	for _, s := range order {
		if err := s.Restart(ctx); err != nil {
			t.Fatalf("restart %s: %v", s.Name(), err)
		}
		if err := e.waitFor(s.Addr()+" healthy in the proxy", observeLimit, func() bool {
			for _, st := range p.Pool().Status() {
				if st.Addr == s.Addr() {
					return st.State == upstream.StateHealthy
				}
			}
			return false
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("restarted %s; client connections: %v", s.Addr(), clientConns(p))
		if s == home {
			homeBack = time.Now()
		}
	}
	away := clientConns(p)
	if away[home.Addr()] == sum(away) {
		t.Logf("every connection is back on %s already: %v", home.Addr(), away)
	}
	if err := e.waitFor("every client connection back on "+home.Addr(), failbackLimit, onHome); err != nil {
		t.Errorf("%v: %v", err, clientConns(p))
	}
	back := time.Since(homeBack)
	t.Logf("figure: failback_all_home = %.3f s (settle %v, limit %v); connections %v before, %v after",
		back.Seconds(), failbackSettle, failbackLimit, away, clientConns(p))

	kruns := loop.stop()
	e.checkKubectl(kruns)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r := w.Stop(stopCtx)
	if lost := r.Lost(); len(lost) > 0 {
		t.Errorf("the informer missed %d created ConfigMaps: %v", len(lost), firstN(lost, 10))
	}
	t.Logf("informer: %d created, %d seen, %d relists, %d watch errors; %d creates failed", len(r.Created()), len(r.Seen), r.Relists(), r.WatchErrors, r.FailedWrites())
	if n := idle.stop(); n > 0 {
		t.Logf("idle clients: %d GETs failed", n)
	}
	checkSpread(t, closes.stop())
}

// clientConns returns the proxy's client connections per endpoint,
// removed ones included.
func clientConns(p *localproxy.Proxy) map[string]int {
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
}

// checkSpread: fail-back closed connections, and spread them over time:
// never more in one second than the rate allows (plus one for the
// sampling), the first to the last at least (n-1) gaps apart, generously.
func checkSpread(t *testing.T, samples []counterSample) {
	if len(samples) == 0 || samples[len(samples)-1].v == 0 {
		t.Errorf("fail-back closed no connection")
		return
	}
	total := samples[len(samples)-1].v
	maxPerSecond := 0
	var first, last time.Time
	for i, s := range samples {
		if i > 0 && s.v > samples[i-1].v {
			if first.IsZero() {
				first = s.at
			}
			last = s.at
		}
		for _, u := range samples[i:] {
			if u.at.Sub(s.at) > time.Second {
				break
			}
			maxPerSecond = max(maxPerSecond, u.v-s.v)
		}
	}
	t.Logf("figure: failback_closes = %d, most in one second %d, spread over %.3f s", total, maxPerSecond, last.Sub(first).Seconds())
	if limit := int(failbackRate) + 1; maxPerSecond > limit {
		t.Errorf("fail-back closed %d connections within one second, want at most %d", maxPerSecond, limit)
	}
	gap := time.Duration(float64(time.Second) / failbackRate)
	if want := time.Duration(total-1) * gap / 2; last.Sub(first) < want {
		t.Errorf("fail-back closed %d connections within %v, want them spread over at least %v", total, last.Sub(first), want)
	}
}

type counterSample struct {
	at time.Time
	v  int
}

// counterSampler samples an unlabelled-or-summed counter every 100ms.
type counterSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []counterSample
}

func sampleCounter(ctx context.Context, t *testing.T, reg *prometheus.Registry, name string) *counterSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &counterSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			s.samples = append(s.samples, counterSample{time.Now(), counter(t, reg, name)})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *counterSampler) stop() []counterSample {
	s.cancel()
	<-s.done
	return s.samples
}

// idleClients are clients with one HTTP/2 connection each through the
// proxy (a transport of their own), sending a GET every 2s.
type idleClients struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex // guards failed
	failed int
}

func startIdleClients(ctx context.Context, t *testing.T, bed *testbed.Bed, n int) *idleClients {
	ctx, cancel := context.WithCancel(ctx)
	c := &idleClients{cancel: cancel}
	for i := range n {
		cfg := bed.RESTConfig(testbed.LocalProxy)
		cfg.Dial = (&net.Dialer{}).DialContext // a transport of its own
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(hc.CloseIdleConnections)
		c.wg.Go(func() { c.run(ctx, hc, cfg.Host, i) })
	}
	return c
}

func (c *idleClients) run(ctx context.Context, hc *http.Client, host string, i int) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host+"/version", nil)
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("client %d: status %d", i, resp.StatusCode)
			}
		}
		if err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.failed++
			c.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stop ends the clients and returns how many GETs failed.
func (c *idleClients) stop() int {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}
