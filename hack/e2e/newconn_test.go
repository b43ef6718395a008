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
	// maxDialsToHung bounds, on an L4 path, the connections that go to a
	// hung apiserver from the fault until its probes mark it down (1-2s):
	// the first new connection gets stuck there, the next ones must go
	// elsewhere (the second too when the hung one was alone in the best
	// RTT tier: the bed's RTTs straddle the 2ms tier boundary). Without
	// the passive signals every new connection until its first failed
	// probe (about 1s, 20 at newConnRate) went there.
	maxDialsToHung = 3
)

// newConnLoad is a client that opens a new TLS connection for every
// request (kubectl in a shell loop, a CNI plugin), GET /version at
// newConnRate, through the path's client configuration. It samples the
// path's dial attempts per endpoint as it goes.
type newConnLoad struct {
	stop          func()
	total, failed atomic.Int64
	mu            sync.Mutex // guards the fields below
	samples       []dialSample
	// firstFailed and lastFailed are when the first and the last failed
	// requests were sent.
	firstFailed, lastFailed time.Time
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
		sent := time.Now()
		resp, err := hc.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != nil && ctx.Err() == nil {
			l.failed.Add(1)
			l.mu.Lock()
			if l.firstFailed.IsZero() || sent.Before(l.firstFailed) {
				l.firstFailed = sent
			}
			if sent.After(l.lastFailed) {
				l.lastFailed = sent
			}
			l.mu.Unlock()
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

// dialsTo returns the path's dial attempts to addr from the last sample
// at or before from to the last sample at or before to.
func (l *newConnLoad) dialsTo(addr string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var a, b map[string]int
	for _, s := range l.samples {
		if a == nil || !s.at.After(from) {
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

// checkAvoided asserts, on an L4 path, that at most maxDialsToHung
// connections went to addr, hung at t0, before its probes marked it down,
// and records newConnLoad's figures.
func (e *env) checkAvoided(l *newConnLoad, events *eventLog, addr string, t0 time.Time) {
	l.stop()
	e.figure("newconn_requests", float64(l.total.Load()), "")
	e.figure("newconn_failed", float64(l.failed.Load()), "")
	l.mu.Lock()
	if !l.firstFailed.IsZero() {
		e.seconds("newconn_outage", l.lastFailed.Sub(l.firstFailed))
	}
	l.mu.Unlock()
	downAt, ok := events.firstEvent(upstream.EventDown, addr, t0)
	if !ok {
		e.t.Errorf("%s never marked down after it hung; events:%s", addr, events)
		return
	}
	e.seconds("marked_down", downAt.Sub(t0))
	n := l.dialsTo(addr, t0, downAt)
	e.figure("dials_to_hung_before_down", float64(n), "")
	if n > maxDialsToHung {
		e.t.Errorf("%d new connections went to the hung %s in the %s before its probes marked it down: want at most %d",
			n, addr, downAt.Sub(t0).Round(time.Millisecond), maxDialsToHung)
	}
}
