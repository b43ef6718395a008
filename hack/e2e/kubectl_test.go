package e2e_test

import (
	"context"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// kubectlPause is the time between the end of one kubectl run and the
// start of the next in a kubectlLoop.
const kubectlPause = 300 * time.Millisecond

// kubectlRun is one kubectl command of a kubectlLoop.
type kubectlRun struct {
	start, end time.Time
	err        error
}

// kubectlLoop runs the real kubectl, one process after another, through a
// path's kubeconfig while a scenario runs: a client that is not Go and
// that kubelet operators run by hand, with client-go's own retries (a GET
// is retried after a connection reset or EOF, and after a 429 with
// Retry-After) and a discovery cache shared between runs, as on a node.
type kubectlLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex // guards runs
	runs   []kubectlRun
}

// startKubectlLoop lists the ConfigMaps of ns through kubeconfig until
// stop. Each run may take up to 20 s (kubectlAt), far longer than any
// failover, so a run fails only if the path itself failed it.
func startKubectlLoop(ctx context.Context, bed *testbed.Bed, kubeconfig, cacheDir, ns string) *kubectlLoop {
	ctx, cancel := context.WithCancel(ctx)
	l := &kubectlLoop{cancel: cancel, done: make(chan struct{})}
	go l.run(ctx, bed, kubeconfig, cacheDir, ns)
	return l
}

func (l *kubectlLoop) run(ctx context.Context, bed *testbed.Bed, kubeconfig, cacheDir, ns string) {
	defer close(l.done)
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
		r := kubectlRun{start: time.Now()}
		_, r.err = kubectlAt(ctx, bed, kubeconfig, "--cache-dir="+cacheDir, "--request-timeout=15s",
			"get", "configmaps", "-n", ns, "-o", "name")
		r.end = time.Now()
		if ctx.Err() != nil {
			return // cut short by stop: not the path's doing
		}
		l.mu.Lock()
		l.runs = append(l.runs, r)
		l.mu.Unlock()
		pause.Reset(kubectlPause)
	}
}

// ranAfter reports whether a run that started after t has ended, or the
// loop has.
func (l *kubectlLoop) ranAfter(t time.Time) bool {
	select {
	case <-l.done:
		return true
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs) > 0 && l.runs[len(l.runs)-1].start.After(t)
}

// stop ends the loop, waits for it and returns its runs.
func (l *kubectlLoop) stop() []kubectlRun {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs
}

// tolerateKubectl marks kubectl failures of runs started in [from, to) as
// expected (every apiserver down); runs outside must succeed.
func (e *env) tolerateKubectl(from, to time.Time) {
	e.kubectlTolerated = append(e.kubectlTolerated, [2]time.Time{from, to})
}

// startKubectl starts the path's kubectl loop, if it has a kubeconfig;
// checkKubectl, registered as a cleanup, stops it and asserts on it.
func (e *env) startKubectl() {
	if e.c.Kubeconfig == "" {
		return
	}
	l := startKubectlLoop(e.ctx, e.bed, e.c.Kubeconfig, e.c.KubectlCacheDir, e.namespace())
	e.t.Cleanup(func() {
		// A scenario may end while the only run since its fault is still
		// going: let kubectl run across the fault before judging.
		if !e.faultAt.IsZero() {
			// A timeout is reported by checkKubectl.
			_ = e.waitFor("a kubectl run after the fault", observeLimit, func() bool { return l.ranAfter(e.faultAt) })
		}
		e.checkKubectl(l.stop())
	})
}

// checkKubectl: every run outside the tolerated windows succeeded, and
// kubectl ran across the fault (a run that started after it succeeded).
func (e *env) checkKubectl(runs []kubectlRun) {
	failed, tolerated, afterFault := 0, 0, 0
	var longest time.Duration
	for _, r := range runs {
		longest = max(longest, r.end.Sub(r.start))
		if r.err == nil {
			if !e.faultAt.IsZero() && r.start.After(e.faultAt) {
				afterFault++
			}
			continue
		}
		if e.kubectlTolerable(r.start) {
			tolerated++
			continue
		}
		failed++
		if failed <= 5 {
			e.t.Errorf("kubectl run started %+.3fs after the fault failed after %s: %s",
				r.start.Sub(e.faultAt).Seconds(), r.end.Sub(r.start).Round(time.Millisecond), oneLine(r.err.Error(), 400))
		}
	}
	e.figure("kubectl_runs", float64(len(runs)), "runs")
	e.figure("kubectl_failed", float64(failed), "runs")
	if tolerated > 0 {
		e.figure("kubectl_failed_while_all_down", float64(tolerated), "runs")
	}
	e.seconds("kubectl_longest_run", longest)
	if !e.faultAt.IsZero() && afterFault == 0 && !e.t.Failed() {
		e.t.Errorf("no kubectl run started after the fault and succeeded (%d runs)", len(runs))
	}
}

func (e *env) kubectlTolerable(t time.Time) bool {
	for _, w := range e.kubectlTolerated {
		if !t.Before(w[0]) && t.Before(w[1]) {
			return true
		}
	}
	return false
}
