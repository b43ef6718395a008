package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/apifailover/apifailover/hack/workload"
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

// handover starts a successor localproxy process on the same addresses
// (bound beside the old one with SO_REUSEPORT: both serve, the kernel
// spreads new connections), waits for its /readyz as the DaemonSet
// controller waits for the surge pod, and makes it the serving instance.
// The lift sends the old one SIGTERM as kubelet does: it sees the
// successor, waits for its /readyz, steers new connections to it, serves
// what it had queued, closes its listeners, drains its connections and
// exits.
func (r *run) handover(ctx context.Context) (func() error, error) {
	h := r.faults.lp
	began := time.Now()
	next, err := h.launch(ctx)
	if err != nil {
		return nil, err
	}
	err = waitFor(ctx, successorReadyLimit, func() bool { return h.ready(next) })
	ready := time.Since(began)
	if err != nil {
		r.faults.violate(fmt.Sprintf("hand-over to localproxy instance %d: the successor was not ready within %s", next.n, successorReadyLimit))
	}
	old := h.swap(next)
	r.say("localproxy instance %d (pid %d) serves beside instance %d (ready after %.1fs)", next.n, next.pid(), old.n, ready.Seconds())
	return func() error {
		t := time.Now()
		open := int64(readTCPTable().count(old.pid(), h.isClient))
		if !h.stop(old) {
			r.faults.violate(fmt.Sprintf("hand-over: localproxy instance %d did not exit within %s of SIGTERM", old.n, proxyExitLimit))
		}
		stopped := time.Since(t)
		r.say("localproxy instance %d exited %.1fs after SIGTERM (it had %d client connections): %v", old.n, stopped.Seconds(), open, old.err)
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
		if strings.Contains(l, `"msg":"successor listening; handing over"`) && strings.Contains(l, `"ready":true`) {
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
