package localproxy_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Endpoints of the fail-back tests: this proxy is in zone a, so A (zone
// a) outranks B and C (zone b), which are equals; or, in a bed of RTT
// tiers (newFBBedTiers), all in one zone, A answers in 1ms (tier 0), B
// and C in 5ms (tier 1).
const (
	fbA = "10.0.0.1:6443"
	fbB = "10.0.0.2:6443"
	fbC = "10.0.0.3:6443"
)

// fbConn is a client connection as the registry keeps it.
type fbConn struct {
	bed     *fbBed
	id      int
	addr    string
	waiting atomic.Bool // sent a request, no answer yet
}

func (c *fbConn) Retire() {}

func (c *fbConn) Close() {
	c.bed.mu.Lock()
	defer c.bed.mu.Unlock()
	c.bed.closes = append(c.bed.closes, fbClose{id: c.id, addr: c.addr, at: time.Now()})
}

func (c *fbConn) SinceData() (sent, recv time.Duration, ok bool) {
	if c.waiting.Load() {
		return 100 * time.Millisecond, time.Minute, true
	}
	return time.Minute, time.Minute, true
}

type fbClose struct {
	id   int
	addr string
	at   time.Time
}

// fbBed is a pool probed by a fake prober (A fails until up), a registry
// and fail-back over them, in a synctest bubble.
type fbBed struct {
	t      *testing.T
	pool   *upstream.Pool
	reg    *endpoint.Registry[*fbConn]
	aDown  atomic.Bool
	cDown  atomic.Bool
	ids    int
	mu     sync.Mutex // guards closes and counted
	closes []fbClose
	// counted: the endpoints fail-back reported, in order.
	counted []string
}

func newFBBed(t *testing.T, settle time.Duration, rate float64) *fbBed {
	return newFBBedOf(t, settle, rate, false)
}

// newFBBedTiers is newFBBed with A outranking B and C by RTT tier.
func newFBBedTiers(t *testing.T, settle time.Duration, rate float64) *fbBed {
	return newFBBedOf(t, settle, rate, true)
}

func newFBBedOf(t *testing.T, settle time.Duration, rate float64, tiers bool) *fbBed {
	b := &fbBed{t: t}
	b.aDown.Store(true)
	var err error
	b.pool, err = upstream.New(upstream.Config{
		Zone: "a", IsLocal: func(string) bool { return false }, Interval: time.Second, Jitter: -1, Rise: 1, Fall: 1,
		Prober: upstream.ProberFunc(func(_ context.Context, addr string) error {
			if addr == fbA && b.aDown.Load() || addr == fbC && b.cDown.Load() {
				return errors.New("connection refused")
			}
			if tiers {
				rtt := 5 * time.Millisecond
				if addr == fbA {
					rtt = time.Millisecond
				}
				time.Sleep(rtt)
			}
			return nil
		}),
	})
	require.NoError(t, err)
	zoneB := "b"
	if tiers {
		zoneB = "a"
	}
	require.NoError(t, b.pool.Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: fbA, Zone: "a"}, {Addr: fbB, Zone: zoneB}, {Addr: fbC, Zone: zoneB}}))
	b.reg = endpoint.NewRegistry[*fbConn](endpoint.RegistryConfig{Healthy: b.pool.Healthy})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { b.pool.Run(ctx) })
	wg.Go(func() {
		localproxy.RunFailback(ctx, b.pool, b.reg, settle, rate, func(addr string) {
			b.mu.Lock()
			b.counted = append(b.counted, addr)
			b.mu.Unlock()
		}, testr.New(t))
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	synctest.Wait()
	if tiers {
		sleep(10 * time.Millisecond) // the probes' answers
	}
	require.Equal(t, upstream.StateUnhealthy, b.state(fbA))
	return b
}

func (b *fbBed) state(addr string) upstream.State {
	for _, s := range b.pool.Status() {
		if s.Addr == addr {
			return s.State
		}
	}
	return upstream.StateUnknown
}

// add registers a connection to addr.
func (b *fbBed) add(addr string) *fbConn {
	b.ids++
	c := &fbConn{bed: b, id: b.ids, addr: addr}
	mark := b.reg.Begin()
	defer b.reg.End()
	require.True(b.t, b.reg.Add(addr, c, mark))
	return c
}

// setA makes A's probes succeed (up) or fail, and waits for the pool to
// see it (probes every second).
func (b *fbBed) setA(up bool) time.Time {
	b.aDown.Store(!up)
	want := upstream.StateUnhealthy
	if up {
		want = upstream.StateHealthy
	}
	for range 3 {
		if b.state(fbA) == want {
			break
		}
		time.Sleep(time.Second)
		synctest.Wait()
	}
	require.Equal(b.t, want, b.state(fbA))
	for _, s := range b.pool.Status() {
		if s.Addr == fbA {
			return s.Since
		}
	}
	return time.Time{}
}

func (b *fbBed) taken() []fbClose {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]fbClose(nil), b.closes...)
}

// sleep advances the bubble's clock by d and lets everything run.
func sleep(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// After A, which outranks B and C, has been healthy for the settle time,
// the connections on B and C are closed one at a time, oldest first
// across both, at most rate per second with jittered gaps, never all at
// once; A's own connections and one waiting for an answer stay; the
// metric hook hears each.
func TestFailbackMovesConnectionsBackGradually(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const settle, rate = 30 * time.Second, 2.0
		b := newFBBed(t, settle, rate)
		var moved []*fbConn
		for i := range 8 {
			moved = append(moved, b.add([]string{fbB, fbC}[i%2]))
		}
		busy := b.add(fbB)
		busy.waiting.Store(true)

		sleep(time.Minute)
		assert.Empty(t, b.taken(), "A is down: nothing to move to")

		since := b.setA(true)
		b.add(fbA)
		sleep(settle - time.Since(since) - time.Nanosecond)
		assert.Empty(t, b.taken(), "closed before A settled")

		sleep(time.Minute)
		got := b.taken()
		require.Len(t, got, len(moved), "closed: %+v", got)
		gap := time.Duration(float64(time.Second) / rate)
		for i, c := range got {
			assert.Equal(t, moved[i].id, c.id, "close %d: not the oldest", i)
			assert.False(t, c.at.Before(since.Add(settle)), "close %d before the settle time", i)
			if i > 0 {
				d := c.at.Sub(got[i-1].at)
				assert.GreaterOrEqual(t, d, gap, "closes %d and %d: faster than %v/s", i-1, i, rate)
				assert.LessOrEqual(t, d, gap*3/2, "closes %d and %d: gap beyond its jitter", i-1, i)
			}
		}
		// Any one-second window holds at most rate closes.
		for i := range got {
			n := 0
			for _, c := range got[i:] {
				if c.at.Sub(got[i].at) < time.Second {
					n++
				}
			}
			assert.LessOrEqual(t, n, int(rate), "window from close %d", i)
		}
		spread := got[len(got)-1].at.Sub(got[0].at)
		assert.GreaterOrEqual(t, spread, time.Duration(len(got)-1)*gap, "all at once")
		assert.Equal(t, map[string]int{fbA: 1, fbB: 1}, b.reg.Counts(), "A's and the waiting connection stay")

		busy.waiting.Store(false) // answered
		sleep(5 * time.Second)
		assert.Len(t, b.taken(), len(moved)+1, "the answered connection is moved too")
		b.mu.Lock()
		assert.Len(t, b.counted, len(moved)+1)
		b.mu.Unlock()
	})
}

// Fail-back stops as soon as A fails again, and A's next recovery waits
// the whole settle time again; so does a flap before A settled.
func TestFailbackStopsWhenBetterFailsAndFlapResetsSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const settle, rate = 10 * time.Second, 1.0
		b := newFBBed(t, settle, rate)
		for i := range 10 {
			b.add([]string{fbB, fbC}[i%2])
		}
		since := b.setA(true)
		sleep(settle - time.Since(since) + 3*time.Second)
		before := len(b.taken())
		require.NotZero(t, before)
		require.Less(t, before, 10)

		b.setA(false)
		downAt := time.Now()
		sleep(time.Minute)
		got := b.taken()
		for _, c := range got[before:] {
			assert.True(t, c.at.Before(downAt), "closed at %v, after A went down at %v", c.at, downAt)
		}
		stopped := len(got)

		// A comes back, then flaps before it settled.
		b.setA(true)
		sleep(settle / 2)
		b.setA(false)
		since = b.setA(true)
		sleep(settle - time.Since(since) - time.Nanosecond)
		assert.Len(t, b.taken(), stopped, "the flap did not start the settle time over")
		sleep(time.Minute)
		got = b.taken()
		require.Len(t, got, 10, "the rest moved once A settled again")
		for _, c := range got[stopped:] {
			assert.False(t, c.at.Before(since.Add(settle)), "closed at %v, before %v", c.at, since.Add(settle))
		}
	})
}

// A preferred endpoint crowded with connections waiting for their first
// byte ranks one RTT tier slower for new connections (upstream.Pool's
// order): B goes first in the candidate order meanwhile. Fail-back keeps
// moving connections to A, the preferred endpoint, as before.
func TestFailbackFollowsThePreferredEndpointThroughCrowding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const settle, rate = 10 * time.Second, 1.0
		b := newFBBedTiers(t, settle, rate)
		for i := range 20 {
			b.add([]string{fbB, fbC}[i%2])
		}
		since := b.setA(true)
		sleep(settle - time.Since(since) + 3*time.Second)
		require.Equal(t, fbA, b.pool.Candidates()[0])
		n := len(b.taken())
		require.NotZero(t, n, "nothing moved once A settled")

		b.pool.AddWaiting(fbA, 2)
		require.NotEqual(t, fbA, b.pool.Candidates()[0], "A, crowded, still first")
		sleep(5 * time.Second) // 3-5 closes at 1/s, each gap up to 1.5s
		assert.GreaterOrEqual(t, len(b.taken()), n+3, "fail-back stopped while A was crowded")
		b.pool.AddWaiting(fbA, -2)
	})
}

// Equals are never moved between each other: with A out of the pool, B and
// C keep their connections however long they are healthy.
func TestFailbackLeavesEqualsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFBBed(t, time.Second, 100)
		b.add(fbB)
		b.add(fbC)
		sleep(time.Hour)
		assert.Empty(t, b.taken())
	})
}

// A connection made to an endpoint while it was down (a dial that failed
// open to it) is moved to a healthy equal once that has been healthy for
// the settle time: the drain, which moves connections off an endpoint as
// it goes down, came before it.
func TestFailbackMovesConnectionsOffADownEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const settle = 30 * time.Second
		b := newFBBed(t, settle, 100)
		b.cDown.Store(true)
		sleep(2 * time.Second)
		require.Equal(t, upstream.StateUnhealthy, b.state(fbC))
		stays := b.add(fbB)
		moved := b.add(fbC)
		sleep(settle + 2*time.Second)
		closes := b.taken()
		require.Len(t, closes, 1, "%+v", closes)
		assert.Equal(t, moved.id, closes[0].id)
		assert.NotEqual(t, stays.id, closes[0].id)
		sleep(time.Hour)
		assert.Len(t, b.taken(), 1, "the healthy equal keeps its connection")
	})
}

// Zero fields take the defaults, which turn fail-back on; a negative
// settle time or rate turns it off; a rate that is no number, or outside
// one an hour to 1000 a second, is refused.
func TestFailbackConfig(t *testing.T) {
	for _, tc := range []struct {
		settle time.Duration
		rate   float64
		on     bool
		err    string
	}{
		{on: true},
		{settle: time.Second, rate: 0.5, on: true},
		{settle: -1},
		{rate: -1},
		{rate: math.NaN(), err: "FailbackRate"},
		{rate: math.Inf(1), err: "FailbackRate"},
		{rate: 1e6, err: "FailbackRate"},
		// A gap of more than an hour: 1/rate overflowed time.Duration
		// below about 1.1e-10, and fail-back panicked once a better
		// endpoint came back.
		{settle: time.Second, rate: 1.0 / 3600, on: true},
		{rate: 1.0 / 3601, err: "FailbackRate"},
		{rate: 1e-10, err: "FailbackRate"},
		{rate: 5e-324, err: "FailbackRate"},
	} {
		t.Run(fmt.Sprintf("%v/%v", tc.settle, tc.rate), func(t *testing.T) {
			p, err := localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:1"}, FailbackSettle: tc.settle, FailbackRate: tc.rate})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.on, p.FailbackOn())
		})
	}
}

// The proxy's own wiring: a client connection that landed on B while A,
// in the proxy's zone, was down is closed once A has settled, counted by
// endpoint; the client's next connection goes to A and stays.
func TestProxyFailsBack(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	pr := newProber()
	pr.set(a.addr(), errors.New("connection refused"))
	r := start(t, localproxy.Config{
		Endpoints: []string{a.addr(), b.addr()},
		Pool: upstream.Config{Prober: pr, Interval: 50 * time.Millisecond, Timeout: 50 * time.Millisecond, Rise: 1, Fall: 1,
			Zone: "a", IsLocal: func(string) bool { return false }},
		FailbackSettle: 200 * time.Millisecond,
		FailbackRate:   100,
	})
	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: a.addr(), Zone: "a"}, {Addr: b.addr()}}))
	stateOf := func(addr string) upstream.State {
		for _, s := range r.Pool().Status() {
			if s.Addr == addr {
				return s.State
			}
		}
		return upstream.StateUnknown
	}
	require.Eventually(t, func() bool {
		return stateOf(a.addr()) == upstream.StateUnhealthy && stateOf(b.addr()) == upstream.StateHealthy
	},
		10*time.Second, 10*time.Millisecond)
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "lands on B"))
	require.Equal(t, int64(1), b.open.Load())

	pr.set(a.addr(), nil)
	require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 10*time.Millisecond, "not moved back")
	// The client may see the close before the counter moves.
	require.Eventually(t, func() bool {
		v, err := metricValue(r.reg, "apifailover_localproxy_failback_closed_total", "endpoint", b.addr())
		return err == nil && v == 1
	}, 10*time.Second, 10*time.Millisecond, "closed by fail-back, counted by endpoint")
	assert.Equal(t, upstream.StateHealthy, stateOf(a.addr()))

	c2 := dial(t, r.addr())
	require.NoError(t, roundTrip(c2, "goes to A"))
	require.Eventually(t, func() bool { return a.open.Load() == 1 && b.open.Load() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, roundTrip(c2, "and stays"))
}
