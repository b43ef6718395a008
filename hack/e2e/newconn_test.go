package e2e_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"

	"github.com/apifailover/apifailover/transport/upstream"
)

const (
	// newConnRate and newConnTimeout shape newConnLoad: a request a
	// newConnRate, each on a new connection, each with its deadline.
	newConnRate    = 50 * time.Millisecond
	newConnTimeout = 3 * time.Second
	// avoidBudget: on an L4 path, from this long after a fault on, no new
	// connection may go to a hung apiserver, although its probes have not
	// marked it down yet (they take about 2s).
	avoidBudget = time.Second
)

// newConnLoad is a client that opens a new TLS connection for every
// request (kubectl in a shell loop, a CNI plugin), GET /version at
// newConnRate, through the path's client configuration. It samples the
// path's dial attempts per endpoint as it goes.
type newConnLoad struct {
	stop           func()
	total, failed  atomic.Int64
	mu             sync.Mutex // guards samples
	samples        []dialSample
	firstFailed    atomic.Pointer[time.Time]
	lastFailedNano atomic.Int64
}

type dialSample struct {
	at    time.Time
	dials map[string]int
}

func (e *env) startNewConnLoad() *newConnLoad {
	e.t.Helper()
	cfg := rest.CopyConfig(e.c.Config)
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		e.t.Fatalf("TLS configuration of the path: %v", err)
	}
	var rt http.RoundTripper = &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}
	if cfg.BearerToken != "" {
		rt = transport.NewBearerAuthRoundTripper(cfg.BearerToken, rt)
	}
	hc := &http.Client{Transport: rt, Timeout: newConnTimeout}
	url := cfg.Host + "/version"
	ctx, cancel := context.WithCancel(e.ctx)
	l := &newConnLoad{}
	var wg sync.WaitGroup
	get := func() {
		l.total.Add(1)
		resp, err := hc.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != nil && ctx.Err() == nil {
			now := time.Now()
			l.failed.Add(1)
			l.firstFailed.CompareAndSwap(nil, &now)
			l.lastFailedNano.Store(now.UnixNano())
		}
	}
	wg.Go(func() {
		tick := time.NewTicker(newConnRate)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				wg.Go(get)
			}
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			s := dialSample{at: time.Now(), dials: e.c.DialAttempts()}
			l.mu.Lock()
			l.samples = append(l.samples, s)
			l.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	l.stop = sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
	e.t.Cleanup(l.stop)
	return l
}

// dialsTo returns the path's dial attempts to addr between the samples
// nearest from and to.
func (l *newConnLoad) dialsTo(addr string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var a, b map[string]int
	for _, s := range l.samples {
		if a == nil && !s.at.Before(from) {
			a = s.dials
		}
		if !s.at.After(to) {
			b = s.dials
		}
	}
	if a == nil || b == nil {
		return 0
	}
	return max(0, b[addr]-a[addr])
}

// firstEvent returns the time of the first event of kind for addr at or
// after from.
func (l *eventLog) firstEvent(kind upstream.EventKind, addr string, from time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		if ev.Kind == kind && ev.Addr == addr && !ev.at.Before(from) {
			return ev.at, true
		}
	}
	return time.Time{}, false
}

// checkAvoided asserts, on an L4 path, that new connections stopped going
// to s, hung at t0, avoidBudget after the fault, although its probes had
// not marked it down yet; and records newConnLoad's figures.
func (e *env) checkAvoided(l *newConnLoad, events *eventLog, addr string, t0 time.Time) {
	l.stop()
	e.figure("newconn_requests", float64(l.total.Load()), "")
	e.figure("newconn_failed", float64(l.failed.Load()), "")
	if first := l.firstFailed.Load(); first != nil {
		e.seconds("newconn_outage", time.Unix(0, l.lastFailedNano.Load()).Sub(*first))
	}
	downAt, ok := events.firstEvent(upstream.EventDown, addr, t0)
	if !ok {
		e.t.Errorf("%s never marked down after it hung; events:%s", addr, events)
		return
	}
	e.seconds("marked_down", downAt.Sub(t0))
	if downAt.Sub(t0) <= avoidBudget {
		e.t.Logf("the probes marked %s down %s after the fault, within the %s budget of the passive signals: nothing to compare",
			addr, downAt.Sub(t0).Round(time.Millisecond), avoidBudget)
		return
	}
	n := l.dialsTo(addr, t0.Add(avoidBudget), downAt)
	e.figure("dials_to_hung_before_down", float64(n), "")
	if n > 0 {
		e.t.Errorf("%d new connections went to the hung %s between %s after the fault and its probes marking it down (%s): want none",
			n, addr, avoidBudget, downAt.Sub(t0).Round(time.Millisecond))
	}
}
