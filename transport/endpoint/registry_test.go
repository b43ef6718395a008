package endpoint_test

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// fakeConn is a connection with a running request (busy) or none.
type fakeConn struct {
	r       *endpoint.Registry[*fakeConn]
	addr    string
	busy    bool
	retired atomic.Bool
	closed  atomic.Bool
}

func (c *fakeConn) Retire() {
	c.retired.Store(true)
	if !c.busy {
		c.closed.Store(true)
		c.r.Remove(c.addr, c)
	}
}

func (c *fakeConn) Close() { c.closed.Store(true) }

type registryBed struct {
	r       *endpoint.Registry[*fakeConn]
	healthy atomic.Bool
}

func newRegistryBed(cfg endpoint.RegistryConfig) *registryBed {
	b := &registryBed{}
	b.healthy.Store(true)
	cfg.Healthy = b.healthy.Load
	b.r = endpoint.NewRegistry[*fakeConn](cfg)
	return b
}

func (b *registryBed) add(t *testing.T, addr string, busy bool) *fakeConn {
	t.Helper()
	c := &fakeConn{r: b.r, addr: addr, busy: busy}
	mark := b.r.Begin()
	defer b.r.End()
	require.True(t, b.r.Add(addr, c, mark))
	return c
}

const a, other = "10.0.0.1:6443", "10.0.0.2:6443"

var (
	hardDown     = upstream.Event{Kind: upstream.EventDown, Addr: a, Err: errors.New("connection refused")}
	gracefulDown = upstream.Event{Kind: upstream.EventDown, Addr: a, Err: &endpoint.ReadyzError{Status: 500}}
	removed      = upstream.Event{Kind: upstream.EventRemoved, Addr: a, State: upstream.StateHealthy}
	up           = upstream.Event{Kind: upstream.EventUp, Addr: a}
)

func TestRegistryClosesAtOnceWithoutDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{})
		c1, c2, keep := b.add(t, a, true), b.add(t, a, false), b.add(t, other, true)
		out := b.r.OnEvent(hardDown)
		assert.Equal(t, endpoint.Outcome{Closed: 2}, out)
		assert.True(t, c1.closed.Load())
		assert.True(t, c2.closed.Load())
		assert.False(t, c1.retired.Load(), "closed, not retired")
		assert.False(t, keep.closed.Load())
		assert.Equal(t, map[string]int{other: 1}, b.r.Counts())
	})
}

func TestRegistryDrainsGracefulDownUntilDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{GracefulDrain: 10 * time.Second})
		busy, idle := b.add(t, a, true), b.add(t, a, false)
		start := time.Now()
		out := b.r.OnEvent(gracefulDown)
		assert.Equal(t, 2, out.Drained)
		assert.Equal(t, start.Add(10*time.Second), out.Deadline)
		assert.True(t, busy.retired.Load())
		assert.True(t, idle.closed.Load(), "an idle retired connection closes at once")
		assert.Equal(t, 1, b.r.Len(a))

		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		assert.False(t, busy.closed.Load(), "cut before the deadline")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.True(t, busy.closed.Load(), "not cut at the deadline")
		assert.Zero(t, b.r.Len(a))
	})
}

func TestRegistryDrainTimeoutAppliesToHardFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{DrainTimeout: 3 * time.Second})
		c := b.add(t, a, true)
		out := b.r.OnEvent(hardDown)
		assert.Equal(t, 1, out.Drained)
		time.Sleep(3*time.Second - time.Nanosecond)
		synctest.Wait()
		assert.False(t, c.closed.Load())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.True(t, c.closed.Load())

		// A graceful failure drains for the longer of the two.
		c = b.add(t, a, true)
		b.r.OnEvent(gracefulDown)
		time.Sleep(endpoint.DefaultGracefulDrain - time.Nanosecond)
		synctest.Wait()
		assert.False(t, c.closed.Load())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.True(t, c.closed.Load())
	})
}

func TestRegistryKeepsDrainedConnsWhileNoEndpointIsHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{GracefulDrain: 2 * time.Second})
		c := b.add(t, a, true)
		b.healthy.Store(false)
		b.r.OnEvent(gracefulDown)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.False(t, c.closed.Load(), "cut while no endpoint is healthy")

		b.healthy.Store(true)
		time.Sleep(endpoint.DefaultDrainRecheck)
		synctest.Wait()
		assert.True(t, c.closed.Load(), "not cut within a recheck of another endpoint being healthy")
	})
}

func TestRegistryRemovedIsCutAtDeadlineWhateverIsHealthy(t *testing.T) {
	for name, events := range map[string][]upstream.Event{
		"removed":                {removed},
		"down, then removed":     {gracefulDown, removed},
		"down, removed 1s later": {gracefulDown, {}, removed},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newRegistryBed(endpoint.RegistryConfig{GracefulDrain: 2 * time.Second})
				c := b.add(t, a, true)
				b.healthy.Store(false)
				start := time.Now()
				for _, ev := range events {
					if ev.Kind == 0 && ev.Addr == "" {
						time.Sleep(time.Second)
						continue
					}
					b.r.OnEvent(ev)
				}
				// The first drain's deadline stands.
				time.Sleep(time.Until(start.Add(2*time.Second)) - time.Nanosecond)
				synctest.Wait()
				assert.False(t, c.closed.Load())
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				assert.True(t, c.closed.Load(), "a removed endpoint's connections are cut at the deadline")
			})
		})
	}
}

func TestRegistryRecoveryLiftsTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{GracefulDrain: 2 * time.Second})
		c := b.add(t, a, true)
		b.r.OnEvent(gracefulDown)
		time.Sleep(time.Second)
		out := b.r.OnEvent(up)
		assert.Equal(t, 1, out.Undrained)
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.False(t, c.closed.Load(), "cut although its endpoint recovered")
		assert.True(t, c.retired.Load(), "still retired")
		assert.Equal(t, []endpoint.EndpointConns{{Addr: a, Conns: 1}}, b.r.Endpoints(func(string) bool { return true }))

		// Drained again: a new deadline.
		out = b.r.OnEvent(gracefulDown)
		assert.Equal(t, []endpoint.EndpointConns{{Addr: a, Conns: 1, DrainBy: out.Deadline}}, b.r.Endpoints(func(string) bool { return true }))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.True(t, c.closed.Load())
	})
}

func TestRegistryHardDownCutsADrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{})
		c := b.add(t, a, true)
		b.r.OnEvent(gracefulDown)
		assert.False(t, c.closed.Load())
		hard := upstream.Event{Kind: upstream.EventRemoved, Addr: a, State: upstream.StateUnhealthy}
		assert.Equal(t, endpoint.Outcome{Closed: 1}, b.r.OnEvent(hard))
		assert.True(t, c.closed.Load())
	})
}

func TestRegistryRefusesConnDialedBeforeItsEndpointWentAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{})
		mark := b.r.Begin()
		b.r.OnEvent(hardDown)
		late := b.r.Begin()
		assert.False(t, b.r.Add(a, &fakeConn{}, mark), "dialed before the endpoint went down")
		assert.True(t, b.r.Add(other, &fakeConn{}, mark), "another endpoint")
		assert.True(t, b.r.Add(a, &fakeConn{}, late), "dialed after")
		b.r.End()
		b.r.End()
		// No dial runs: the next mark starts clean.
		mark = b.r.Begin()
		defer b.r.End()
		assert.True(t, b.r.Add(a, &fakeConn{}, mark))
	})
}

func TestRegistryStopDrainsAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newRegistryBed(endpoint.RegistryConfig{GracefulDrain: time.Second})
		c := b.add(t, a, true)
		o := b.add(t, other, true)
		b.r.OnEvent(gracefulDown)
		b.r.StopDrains()
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.False(t, c.closed.Load(), "a stopped drain closed a connection")

		b.r.Close()
		assert.True(t, c.closed.Load())
		assert.True(t, o.closed.Load())
		assert.Empty(t, b.r.Counts())
		mark := b.r.Begin()
		defer b.r.End()
		assert.False(t, b.r.Add(a, &fakeConn{}, mark), "added after Close")
	})
}

// A registry's Prober follows it: an endpoint with connections is in use,
// and one that gets a connection while it had none is woken, not for its
// later ones, and again once it had none for a while.
func TestRegistryProber(t *testing.T) {
	p, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	b := newRegistryBed(endpoint.RegistryConfig{Prober: p})
	for _, addr := range []string{a, other} {
		assert.False(t, endpoint.Woken(p, addr)) // makes the channel
		assert.False(t, p.InUse(addr))
	}
	c1 := b.add(t, a, false)
	assert.True(t, endpoint.Woken(p, a))
	assert.True(t, p.InUse(a))
	b.add(t, a, false)
	assert.False(t, endpoint.Woken(p, a), "not for a second connection")
	assert.False(t, p.InUse(other))

	b.r.Remove(a, c1)
	assert.True(t, p.InUse(a))
	b.r.Remove(a, b.r.Conns(a)[0])
	assert.False(t, p.InUse(a))
	b.add(t, a, false)
	assert.True(t, endpoint.Woken(p, a), "again after it had none")
}

// clockConn is a Conn that tells when it last sent and received data.
type clockConn struct {
	fakeConn
	sent, recv time.Duration
	ok         bool
	// unheard: nothing received yet (recv runs from the handshake).
	unheard bool
}

func (c *clockConn) SinceData() (time.Duration, time.Duration, bool) { return c.sent, c.recv, c.ok }
func (c *clockConn) SinceHeard() (time.Duration, bool)               { return c.recv, c.ok && !c.unheard }

// clockRegistry is a registry of clockConns with a held Prober, and add,
// which adds a connection to a.
func clockRegistry(t *testing.T) (*endpoint.Prober, *endpoint.Registry[*clockConn], func(*clockConn)) {
	p, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	r := endpoint.NewRegistry[*clockConn](endpoint.RegistryConfig{Prober: p})
	return p, r, func(c *clockConn) {
		mark := r.Begin()
		defer r.End()
		require.True(t, r.Add(a, c, mark))
	}
}

// An endpoint is busy while one of its connections sent data less than
// BusyWindow ago and received none since; a connection that cannot tell
// counts as waiting. Registry.Wake wakes the Prober's held connection.
func TestRegistryBusy(t *testing.T) {
	p, r, add := clockRegistry(t)
	assert.False(t, p.Busy(a), "no connection")
	idle := &clockConn{sent: time.Minute, recv: time.Minute, ok: true}
	add(idle)
	assert.False(t, p.Busy(a), "idle")
	answered := &clockConn{sent: 100 * time.Millisecond, recv: 50 * time.Millisecond, ok: true}
	add(answered)
	assert.False(t, p.Busy(a), "answered after it sent")
	sameMs := &clockConn{sent: 0, recv: 0, ok: true}
	add(sameMs)
	assert.False(t, p.Busy(a), "answered in the same millisecond")
	waitedLong := &clockConn{sent: endpoint.BusyWindow, recv: time.Minute, ok: true}
	add(waitedLong)
	assert.False(t, p.Busy(a), "waiting for BusyWindow: not any more")

	waiting := &clockConn{sent: 100 * time.Millisecond, recv: time.Minute, ok: true}
	add(waiting)
	assert.True(t, p.Busy(a), "sent, nothing received since")
	assert.False(t, p.Busy(other))
	r.Remove(a, waiting)
	assert.False(t, p.Busy(a))
	add(&clockConn{ok: false})
	assert.True(t, p.Busy(a), "cannot tell: waiting")

	assert.False(t, endpoint.Woken(p, other)) // makes the channel
	r.Wake(other)
	assert.True(t, endpoint.Woken(p, other))
}

// Heard finds a connection that received data within the given time,
// skipping those that cannot tell.
func TestRegistryHeard(t *testing.T) {
	p, _, add := clockRegistry(t)
	_, ok := p.Heard(a, time.Second)
	assert.False(t, ok, "no connection")
	add(&clockConn{ok: false})
	add(&clockConn{sent: 0, recv: time.Minute, ok: true})
	add(&clockConn{sent: 0, recv: 10 * time.Millisecond, ok: true, unheard: true})
	_, ok = p.Heard(a, time.Second)
	assert.False(t, ok, "one cannot tell, one heard a minute ago, one connected 10ms ago and never heard")
	add(&clockConn{sent: 0, recv: 40 * time.Millisecond, ok: true})
	ago, ok := p.Heard(a, time.Second)
	assert.True(t, ok)
	assert.Equal(t, 40*time.Millisecond, ago)
	_, ok = p.Heard(a, 40*time.Millisecond)
	assert.False(t, ok, "40ms ago is not within 40ms")
	_, ok = p.Heard(other, time.Hour)
	assert.False(t, ok, "another endpoint")
}

// SinceData reads the kernel's clock of a TCP connection's data, through
// the wrappers both front ends use (*tls.Conn, TrackedConn).
func TestSinceData(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_INFO: Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	server, err := ln.Accept()
	require.NoError(t, err)
	defer server.Close()

	_, _, ok := endpoint.SinceData(&net.UnixConn{})
	assert.False(t, ok, "not TCP")
	_, ok = endpoint.SinceHeard(&net.UnixConn{})
	assert.False(t, ok, "not TCP")
	time.Sleep(30 * time.Millisecond)
	sent, recv, ok := endpoint.SinceData(client)
	require.True(t, ok)
	assert.GreaterOrEqual(t, sent, 20*time.Millisecond, "no data sent yet")
	assert.GreaterOrEqual(t, recv, 20*time.Millisecond)
	_, ok = endpoint.SinceHeard(client)
	assert.False(t, ok, "nothing received: the handshake is not the server speaking")

	_, err = client.Write([]byte("GET"))
	require.NoError(t, err)
	sent, recv, ok = endpoint.SinceData(tls.Client(client, &tls.Config{}))
	require.True(t, ok, "through *tls.Conn")
	assert.Less(t, sent, recv, "sent, nothing received since")

	time.Sleep(5 * time.Millisecond)
	_, err = server.Write([]byte("200"))
	require.NoError(t, err)
	b := make([]byte, 3)
	_, err = io.ReadFull(client, b)
	require.NoError(t, err)
	sent, recv, ok = endpoint.SinceData(client)
	require.True(t, ok)
	assert.LessOrEqual(t, recv, sent, "answered")
	heard, ok := endpoint.SinceHeard(tls.Client(client, &tls.Config{}))
	require.True(t, ok, "heard, through *tls.Conn")
	assert.Less(t, heard, 20*time.Millisecond)
}

// CloseOldest closes one connection at a time, oldest first across the
// chosen endpoints, forgetting it first; it skips connections waiting for
// an answer and those a drain already owns.
func TestRegistryCloseOldest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const third = "10.0.0.3:6443"
		r := endpoint.NewRegistry[*clockConn](endpoint.RegistryConfig{GracefulDrain: time.Minute})
		add := func(addr string, waiting bool) *clockConn {
			c := &clockConn{sent: time.Minute, recv: time.Minute, ok: true}
			c.busy = true // Retire (the drain) keeps it open
			if waiting {
				c.sent = 100 * time.Millisecond
			}
			mark := r.Begin()
			defer r.End()
			require.True(t, r.Add(addr, c, mark))
			return c
		}
		// Added in this order: o1 (other), a1 (a, waiting), t1 (third),
		// a2 (a), o2 (other).
		o1, a1, t1, a2, o2 := add(other, false), add(a, true), add(third, false), add(a, false), add(other, false)
		notThird := func(addr string) bool { return addr != third }

		addr, skipped, ok := r.CloseOldest(notThird)
		assert.True(t, ok)
		assert.Equal(t, other, addr)
		assert.Zero(t, skipped)
		assert.True(t, o1.closed.Load(), "the oldest")
		assert.Equal(t, 1, r.Len(other), "forgotten")

		addr, skipped, ok = r.CloseOldest(notThird)
		assert.True(t, ok)
		assert.Equal(t, a, addr)
		assert.Equal(t, 1, skipped, "a1 waits for an answer")
		assert.False(t, a1.closed.Load())
		assert.True(t, a2.closed.Load())
		assert.False(t, o2.closed.Load(), "one at a time")

		// An answer arriving (data received since the request) or a
		// request being sent (data sent, an answer came before it): in
		// use until QuietFor without data either way.
		o2.recv = 10 * time.Millisecond
		_, skipped, ok = r.CloseOldest(func(addr string) bool { return addr == other })
		assert.False(t, ok, "an answer arrives on o2")
		assert.Equal(t, 1, skipped)
		o2.sent, o2.recv = time.Minute, endpoint.QuietFor-time.Millisecond
		_, _, ok = r.CloseOldest(func(addr string) bool { return addr == other })
		assert.False(t, ok, "o2 received data less than QuietFor ago")
		o2.sent, o2.recv = time.Minute, endpoint.QuietFor
		o2.busy = true

		// A drain owns other's connections now.
		r.OnEvent(upstream.Event{Kind: upstream.EventDown, Addr: other, Err: &endpoint.ReadyzError{Status: 500}})
		_, skipped, ok = r.CloseOldest(notThird)
		assert.False(t, ok, "nothing left but a waiting and a drained one")
		assert.Equal(t, 1, skipped)
		assert.False(t, o2.closed.Load())
		assert.False(t, t1.closed.Load())

		_, _, ok = r.CloseOldest(func(string) bool { return false })
		assert.False(t, ok)
		addr, _, ok = r.CloseOldest(func(string) bool { return true })
		assert.True(t, ok)
		assert.Equal(t, third, addr)
		r.Remove(third, t1) // the front end's own cleanup: harmless
		assert.Equal(t, map[string]int{a: 1, other: 1}, r.Counts())
		r.Close()
	})
}
