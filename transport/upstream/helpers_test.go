package upstream_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// notLocal keeps tests independent of the addresses of the machine they run on.
func notLocal(string) bool { return false }

// newPool returns a pool with cfg; addresses are not local unless cfg says so.
func newPool(t testing.TB, cfg upstream.Config) *upstream.Pool {
	t.Helper()
	if cfg.IsLocal == nil {
		cfg.IsLocal = notLocal
	}
	p, err := upstream.New(cfg)
	require.NoError(t, err)
	return p
}

// specs turns addresses into specs without zones.
func specs(addrs ...string) []upstream.Spec {
	out := make([]upstream.Spec, len(addrs))
	for i, a := range addrs {
		out[i] = upstream.Spec{Addr: a}
	}
	return out
}

// mustSet calls p.Set and requires success.
func mustSet(t testing.TB, p *upstream.Pool, src upstream.Source, s []upstream.Spec) {
	t.Helper()
	require.NoError(t, p.Set(src, s))
}

// statusOf returns the status of addr; the test fails if it is not in the pool.
func statusOf(t testing.TB, p *upstream.Pool, addr string) upstream.Status {
	t.Helper()
	for _, s := range p.Status() {
		if s.Addr == addr {
			return s
		}
	}
	require.Failf(t, "endpoint not in pool", "%s not in %v", addr, p.Candidates())
	return upstream.Status{}
}

// stateOf returns the health state of addr.
func stateOf(t testing.TB, p *upstream.Pool, addr string) upstream.State {
	t.Helper()
	return statusOf(t, p, addr).State
}

// preferredOf returns the addresses marked preferred in Status.
func preferredOf(p *upstream.Pool) []string {
	var out []string
	for _, s := range p.Status() {
		if s.Preferred {
			out = append(out, s.Addr)
		}
	}
	return out
}

// ev is the comparable part of an Event.
type ev struct {
	Kind  upstream.EventKind
	Addr  string
	Prev  string
	State upstream.State
}

// recorder collects the events of a pool.
type recorder struct {
	mu  sync.Mutex
	evs []upstream.Event
	at  []time.Time
}

func record(p *upstream.Pool) *recorder {
	r := &recorder{}
	p.Subscribe(func(e upstream.Event) {
		r.mu.Lock()
		r.evs = append(r.evs, e)
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
	})
	return r
}

// take returns the events recorded since the last call.
func (r *recorder) take() []upstream.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs, r.at = nil, nil
	return out
}

// short returns the events recorded since the last take, without errors.
func (r *recorder) short() []ev {
	var out []ev
	for _, e := range r.take() {
		out = append(out, ev{e.Kind, e.Addr, e.Prev, e.State})
	}
	return out
}

// first returns the time of the first recorded event of kind for addr.
func (r *recorder) first(kind upstream.EventKind, addr string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.evs {
		if e.Kind == kind && e.Addr == addr {
			return r.at[i], true
		}
	}
	return time.Time{}, false
}

// noDeadlock runs f and fails the test if it does not return within a
// generous real-time limit. It guards tests of lock handling only; nothing
// is asserted about durations.
func noDeadlock(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	limit := time.NewTimer(5 * time.Second)
	defer limit.Stop()
	select {
	case <-done:
	case <-limit.C:
		t.Fatalf("%s: deadlock (no return after 5s)", what)
	}
}

// probeLog is a Prober for synctest bubbles: it records every call and
// answers with fn (nil fn: success at once).
type probeLog struct {
	fn func(ctx context.Context, addr string, n int) error

	mu    sync.Mutex
	calls map[string][]time.Time
}

func newProbeLog(fn func(ctx context.Context, addr string, n int) error) *probeLog {
	return &probeLog{fn: fn, calls: make(map[string][]time.Time)}
}

func (l *probeLog) Probe(ctx context.Context, addr string) error {
	l.mu.Lock()
	n := len(l.calls[addr])
	l.calls[addr] = append(l.calls[addr], time.Now())
	l.mu.Unlock()
	if l.fn == nil {
		return nil
	}
	return l.fn(ctx, addr, n)
}

// times returns when addr was probed.
func (l *probeLog) times(addr string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.calls[addr]...)
}

// count returns how often addr was probed.
func (l *probeLog) count(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls[addr])
}

// startRun runs p.Run in the current synctest bubble; stop cancels it and
// waits for Run to return.
func startRun(t *testing.T, p *upstream.Pool) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	synctest.Wait()
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}

// sleepUntil advances the bubble's clock to at and lets everything settle.
func sleepUntil(at time.Time) {
	time.Sleep(time.Until(at))
	synctest.Wait()
}

// advance advances the bubble's clock by d and lets everything settle.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// blockUntilDone is a probe that honours ctx and never succeeds on its own
// (a blackholed endpoint).
func blockUntilDone(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
