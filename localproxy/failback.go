package localproxy

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Fail-back defaults (Config.FailbackSettle, Config.FailbackRate).
const (
	DefaultFailbackSettle = 30 * time.Second
	DefaultFailbackRate   = 2.0
)

// failbackPoll is how often fail-back looks again while it has nothing to
// do: connections can land on a worse endpoint without a pool event (a
// dial that fell back to a later candidate). Pool events wake it earlier.
const failbackPoll = time.Second

// failback moves client connections back to the endpoint the pool
// prefers (the one new connections go to, but for a moment of crowding:
// upstream.Status.Preferred) once it has been healthy without a break for
// settle: the connections to endpoints it outranks (upstream.Pool.Outranks:
// locality, static last resort, RTT tier — never between equals — or an
// endpoint that is down, to which a dial failed open) are
// closed one at a time, oldest first, at most one per
// gap, each gap stretched by up to half at random, so that kubelet and
// the node's watches reconnect to it without a herd. The first close of a
// recovery waits a random part of a gap more, so that the proxies of a
// fleet that saw the same recovery do not start together. A close is
// decided by Outranks at that moment: fail-back stops as soon as the
// better endpoint is not healthy. The connections go through the
// registry (endpoint.Registry.CloseOldest), which skips those a drain owns,
// those waiting for an answer and those that moved data in the last
// endpoint.QuietFor (an answer still arriving).
type failback[C endpoint.Conn] struct {
	pool   *upstream.Pool
	reg    *endpoint.Registry[C]
	settle time.Duration
	gap    time.Duration
	// closed is called with the endpoint of each connection closed.
	closed func(addr string)
	log    logr.Logger
	kick   chan struct{} // pool events; capacity 1

	// Used by run's goroutine only. target and since identify the
	// recovery being waited for or acted on: the preferred endpoint and when
	// it last became healthy; start is when its first close may happen.
	target      string
	since       time.Time
	start, next time.Time // next: the earliest next close
	moved       int       // connections closed for target
}

// newFailback returns the fail-back of settle and rate (connections per
// second): settle positive, rate within Config's bounds (1/3600 to 1000),
// so that the gap fits in a time.Duration with its jitter.
func newFailback[C endpoint.Conn](pool *upstream.Pool, reg *endpoint.Registry[C], settle time.Duration, rate float64, closed func(string), log logr.Logger) *failback[C] {
	if closed == nil {
		closed = func(string) {}
	}
	return &failback[C]{
		pool: pool, reg: reg, settle: settle, closed: closed, log: log,
		gap:  time.Duration(float64(time.Second) / rate),
		kick: make(chan struct{}, 1),
	}
}

// run moves connections back until ctx is done.
func (f *failback[C]) run(ctx context.Context) {
	defer f.pool.Subscribe(f.onEvent)()
	t := time.NewTimer(f.step(time.Now()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
		t.Reset(f.step(time.Now()))
	}
}

// onEvent wakes run: the preferred endpoint or its health may have changed.
func (f *failback[C]) onEvent(upstream.Event) {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// step closes one connection if one is due and returns how long to wait
// before the next step.
func (f *failback[C]) step(now time.Time) time.Duration {
	// The preferred endpoint is the first but for connections waiting
	// for their first byte, which send new connections past it for a
	// moment (a burst, or a server that stops answering): fail-back
	// follows the lasting order, not that moment.
	st := f.pool.Status()
	i := slices.IndexFunc(st, func(s upstream.Status) bool { return s.Preferred })
	if i < 0 {
		return failbackPoll
	}
	best := st[i]
	if best.State != upstream.StateHealthy || best.Suspect || best.Draining || best.Slow {
		return failbackPoll
	}
	if best.Addr != f.target || !best.Since.Equal(f.since) {
		// A new recovery (or a flap of the same endpoint): wait for it to
		// settle.
		f.target, f.since, f.moved = best.Addr, best.Since, 0
		f.start = best.Since.Add(f.settle + rand.N(f.gap+1))
	}
	switch {
	case now.Before(f.start):
		return f.start.Sub(now)
	case now.Before(f.next):
		return f.next.Sub(now)
	}
	target := best.Addr
	addr, skipped, ok := f.reg.CloseOldest(func(a string) bool { return f.pool.Outranks(target, a) })
	if !ok {
		if skipped > 0 {
			// Every candidate waits for an answer: look again soon.
			return f.jitteredGap()
		}
		if f.moved > 0 {
			f.log.Info("fail-back done: no connection left on an endpoint the preferred one outranks", "endpoint", target, "moved", f.moved)
			f.moved = 0
		}
		return failbackPoll
	}
	if f.moved == 0 {
		f.log.Info("moving client connections back to the preferred endpoint, one at a time", "endpoint", target,
			"healthyFor", now.Sub(best.Since).Round(time.Millisecond), "every", f.gap)
	}
	f.moved++
	f.closed(addr)
	f.log.V(4).Info("fail-back closed a client connection", "endpoint", addr, "to", target)
	d := f.jitteredGap()
	f.next = now.Add(d)
	return d
}

// jitteredGap returns the gap stretched by up to half at random, so that
// closes never come faster than the rate.
func (f *failback[C]) jitteredGap() time.Duration {
	return f.gap + rand.N(f.gap/2+1)
}
