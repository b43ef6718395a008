package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// successorReadyLimit bounds the wait for a new localproxy instance's
// /readyz before the old one is stopped, as the DaemonSet controller
// waits for the surge pod to be available; past it the soak records a
// violation and stops the old one anyway (which hands over after its
// HandoverTimeout, since the successor listens).
const successorReadyLimit = 30 * time.Second

// HandoverReport sums up the soak's localproxy hand-overs.
type HandoverReport struct {
	// Count is the hand-overs; HandedOver how many of the replaced
	// instances logged that they handed over to a ready successor.
	Count      int `json:"count"`
	HandedOver int `json:"handed_over"`
	// SuccessorReady is, per hand-over, the seconds from the new
	// instance's start until its /readyz answered 200 (its pool counted
	// an apiserver healthy); Stopped the seconds the old one took from
	// its stop (SIGTERM in a pod) until it returned: the wait for the
	// successor, the hand-over and the drain of its connections (up to
	// localproxy.DefaultShutdownTimeout).
	SuccessorReady []float64 `json:"successor_ready_s"`
	Stopped        []float64 `json:"stopped_s"`
	// Drained is, per hand-over, the client connections the old instance
	// had open when it was stopped: closed by their server, or cut at the
	// end of its drain, and reopened through the successor.
	Drained []int64 `json:"drained_conns"`
	// Failed counts the requests through localproxy (workloads and
	// kubectl) that failed in a hand-over's window; Refused those of them
	// whose connection was refused, which the hand-over promises never
	// happens (a violation).
	Failed  int `json:"failed"`
	Refused int `json:"refused"`
}

// proxyHandle is the soak's localproxy: whichever instance serves now. A
// hand-over starts a successor on the same addresses and moves the
// handle, with the pool subscriptions, to it; the replaced instance then
// hands over and drains.
type proxyHandle struct {
	bed    *testbed.Bed
	log    logr.Logger
	listen string

	mu     sync.Mutex // guards the fields below
	cur    *proxyInstance
	health string                 // the health address every instance binds, the first's
	subs   []func(upstream.Event) // subscribers, moved to each new instance
	n      int                    // instances started
}

// proxyInstance is one localproxy run in this process.
type proxyInstance struct {
	p            *localproxy.Proxy
	reg          *prometheus.Registry // its metrics
	stop         func()
	n            int
	unsubscribes []func()
}

// startLocalProxy runs the soak's first localproxy in this process in
// front of the bed's apiservers on the bed's LocalProxy address: held
// probes verified with the bed's CA, discovery through the proxy as the
// localproxy identity.
func (r *run) startLocalProxy(ctx context.Context, log logr.Logger) (*proxyHandle, error) {
	h := &proxyHandle{bed: r.bed, log: log, listen: strings.TrimPrefix(r.bed.RESTConfig(testbed.LocalProxy).Host, "https://")}
	in, err := h.launch(ctx)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.cur, h.health = in, in.p.HealthAddr().String()
	h.mu.Unlock()
	return h, nil
}

// launch starts an instance on the handle's addresses.
func (h *proxyHandle) launch(ctx context.Context) (*proxyInstance, error) {
	h.mu.Lock()
	h.n++
	n, health := h.n, h.health
	h.mu.Unlock()
	if health == "" {
		health = "127.0.0.1:0"
	}
	cfg, err := h.bed.LocalProxyConfig(h.listen, health, endpoint.ProbeHeld)
	if err != nil {
		return nil, err
	}
	cfg.Registry, cfg.Logger = prometheus.NewRegistry(), h.log.WithValues("instance", n)
	// The bed's configuration closes connections at once on stop; a
	// DaemonSet pod drains them (cmd/localproxy's default), which is
	// what a hand-over does on a node.
	cfg.ShutdownTimeout = localproxy.DefaultShutdownTimeout
	p, stop, err := testbed.RunLocalProxy(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("localproxy instance %d: %w", n, err)
	}
	return &proxyInstance{p: p, reg: cfg.Registry, stop: stop, n: n}, nil
}

// current is the instance that serves now.
func (h *proxyHandle) current() *localproxy.Proxy {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur.p
}

// registry is the current instance's metrics registry.
func (h *proxyHandle) registry() *prometheus.Registry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur.reg
}

// subscribe makes fn a subscriber of the current instance's pool and of
// every later one's.
func (h *proxyHandle) subscribe(fn func(upstream.Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs = append(h.subs, fn)
	h.cur.unsubscribes = append(h.cur.unsubscribes, h.cur.p.Pool().Subscribe(fn))
}

// swap makes next the current instance, moves the subscribers to it and
// returns the one it replaces.
func (h *proxyHandle) swap(next *proxyInstance) *proxyInstance {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cur
	for _, u := range old.unsubscribes {
		u()
	}
	old.unsubscribes = nil
	for _, fn := range h.subs {
		next.unsubscribes = append(next.unsubscribes, next.p.Pool().Subscribe(fn))
	}
	h.cur = next
	return old
}

// close stops the current instance.
func (h *proxyHandle) close() {
	h.mu.Lock()
	in := h.cur
	for _, u := range in.unsubscribes {
		u()
	}
	in.unsubscribes = nil
	h.mu.Unlock()
	in.stop()
}

// handover starts a successor localproxy on the same addresses (bound
// beside the old one with SO_REUSEPORT: both serve, the kernel spreads
// new connections), waits for its /readyz as the DaemonSet controller
// waits for the surge pod, and moves the soak's handle to it. The lift
// stops the old instance as kubelet's SIGTERM does: it sees the
// successor, waits for its /readyz, steers new connections to it, serves
// what it had queued, closes its listeners and drains its connections.
func (r *run) handover(ctx context.Context) (func() error, error) {
	h := r.faults.lp
	began := time.Now()
	next, err := h.launch(ctx)
	if err != nil {
		return nil, err
	}
	err = waitFor(ctx, successorReadyLimit, func() bool { return next.p.Status().Ready })
	ready := time.Since(began)
	if err != nil {
		r.faults.violate(fmt.Sprintf("hand-over to localproxy instance %d: the successor was not ready within %s", next.n, successorReadyLimit))
	}
	old := h.swap(next)
	r.say("localproxy instance %d serves beside instance %d (ready after %.1fs)", next.n, old.n, ready.Seconds())
	return func() error {
		t := time.Now()
		open := old.p.Status().ActiveConnections
		old.stop()
		stopped := time.Since(t)
		r.say("localproxy instance %d stopped after %.1fs (it had %d client connections)", old.n, stopped.Seconds(), open)
		f := &r.faults
		f.mu.Lock()
		defer f.mu.Unlock()
		f.handovers.Count++
		f.handovers.SuccessorReady = append(f.handovers.SuccessorReady, seconds(ready))
		f.handovers.Stopped = append(f.handovers.Stopped, seconds(stopped))
		f.handovers.Drained = append(f.handovers.Drained, open)
		return nil
	}, nil
}

// handoverFailures counts the requests through localproxy (paths
// localproxy and kubectl) that failed in a hand-over's window, and those
// of them refused.
func handoverFailures(results map[string]workload.Results, windows []window) (failed, refused int) {
	for name, res := range results {
		path := name[:strings.IndexByte(name, '-')]
		if path != pathLocalProxy && path != pathKubectl {
			continue
		}
		for _, rq := range append(append([]workload.Request(nil), res.Gets...), res.Writes...) {
			if rq.OK() {
				continue
			}
			if _, kind := classify(rq, windows); kind != Handover {
				continue
			}
			failed++
			// client-go: "connect: connection refused"; kubectl: "The
			// connection to the server 127.0.0.1:7445 was refused".
			if strings.Contains(rq.Err.Error(), "refused") {
				refused++
			}
		}
	}
	return failed, refused
}

// handedOver counts the log lines in which a stopping localproxy says it
// handed over to a ready successor.
func handedOver(logs string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "successor listening; handing over") && strings.Contains(l, `"ready"=true`) {
			n++
		}
	}
	return n
}

// waitFor polls ok every 50ms until it holds, limit passes or ctx ends.
func waitFor(ctx context.Context, limit time.Duration, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
