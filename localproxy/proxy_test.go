package localproxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestForwardsAndCounts(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "hello"))
	require.Eventually(t, func() bool { return r.Status().Upstreams[0].Conns == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(1), r.Status().ActiveConnections)
	c.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 && r.Status().Upstreams[0].Conns == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_accepted_total"))
	assert.Equal(t, 5.0, metric(t, r.reg, "apifailover_localproxy_bytes_total", "direction", "in"))
	assert.Equal(t, 5.0, metric(t, r.reg, "apifailover_localproxy_bytes_total", "direction", "out"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "result", "ok"))
}

func TestHalfClose(t *testing.T) {
	t.Run("client to server", func(t *testing.T) {
		// The client half-closes; the server sees EOF and still answers.
		got := make(chan string, 1)
		srv := newServer(t, func(c *net.TCPConn) {
			b, _ := io.ReadAll(c)
			got <- string(b)
			io.WriteString(c, "reply to "+string(b))
			c.CloseWrite()
		})
		r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
		c := dial(t, r.addr())
		_, err := io.WriteString(c, "request")
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		assert.Equal(t, "request", <-got)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Equal(t, "reply to request", string(b))
	})
	t.Run("server to client", func(t *testing.T) {
		// The server half-closes after a banner; the client sees EOF and
		// can still send.
		got := make(chan string, 1)
		srv := newServer(t, func(c *net.TCPConn) {
			io.WriteString(c, "banner")
			c.CloseWrite()
			b, _ := io.ReadAll(c)
			got <- string(b)
		})
		r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
		c := dial(t, r.addr())
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Equal(t, "banner", string(b))
		_, err = io.WriteString(c, "still sending")
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		assert.Equal(t, "still sending", <-got)
	})
}

func TestHalfOpenTimeout(t *testing.T) {
	// The server half-closes and then never finishes: the proxy closes
	// the connection after HalfOpenTimeout.
	srv := newServer(t, func(c *net.TCPConn) {
		c.CloseWrite()
		io.Copy(io.Discard, c)
	})
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, HalfOpenTimeout: 100 * time.Millisecond})
	c := dial(t, r.addr())
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 10*time.Millisecond)
	_, err := io.WriteString(c, "x")
	if err == nil {
		require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 10*time.Millisecond)
	}
}

func TestIdleTimeout(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("idle timeout needs TCP_INFO")
	}
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, IdleTimeout: 200 * time.Millisecond})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "x"))
	require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_closed_by_proxy_total", "reason", "idle"))
}

// TestLargeTransferPausedReader sends 50 MiB to a client that stops
// reading after 1 MiB: the proxy must hold back (bounded memory, kernel
// buffers only) and then deliver every byte in order.
func TestLargeTransferPausedReader(t *testing.T) {
	const total = 50 << 20
	block := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range block {
		block[i] = byte(rng.Uint32())
	}
	want := sha256.New()
	for range total / len(block) {
		want.Write(block)
	}
	var written atomic.Int64
	srv := newServer(t, func(c *net.TCPConn) {
		for range total / len(block) {
			for off := 0; off < len(block); off += 64 << 10 {
				n, err := c.Write(block[off : off+64<<10])
				written.Add(int64(n))
				if err != nil {
					return
				}
			}
		}
		c.CloseWrite()
	})
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	c := dial(t, r.addr())
	got := sha256.New()
	_, err := io.CopyN(got, c, 1<<20)
	require.NoError(t, err)

	// Paused: the sender must stall well short of the total.
	var prev int64 = -1
	require.Eventually(t, func() bool {
		cur := written.Load()
		stalled := cur == prev
		prev = cur
		return stalled
	}, 20*time.Second, 50*time.Millisecond)
	assert.Less(t, written.Load(), int64(total/2), "the proxy must not buffer the stream")
	runtime.GC()
	var paused runtime.MemStats
	runtime.ReadMemStats(&paused)
	growth := int64(paused.HeapAlloc) - int64(before.HeapAlloc)
	assert.Less(t, growth, int64(16<<20), "heap grew by %d bytes while paused", growth)

	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := io.Copy(got, c)
	require.NoError(t, err)
	assert.Equal(t, int64(total-1<<20), n)
	assert.True(t, bytes.Equal(want.Sum(nil), got.Sum(nil)), "data differs")
}

func TestThousandConcurrentConnections(t *testing.T) {
	const n = 1000
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	release := make(chan struct{})
	errs := make(chan error, n)
	var exchanged, wg sync.WaitGroup
	exchanged.Add(n)
	for i := range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", r.addr(), 30*time.Second)
			if err != nil {
				errs <- err
				exchanged.Done()
				return
			}
			defer c.Close()
			err = roundTrip(c, fmt.Sprintf("connection %d says hello", i))
			exchanged.Done()
			if err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
				return
			}
			<-release
			if err := roundTrip(c, "bye"); err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
			}
		})
	}
	exchanged.Wait()
	assert.Equal(t, int64(n), r.Status().ActiveConnections)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, float64(n), metric(t, r.reg, "apifailover_localproxy_connections_accepted_total"))
}

// emfileListener fails its first fails Accepts with EMFILE, as a process
// out of file descriptors does.
type emfileListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

func TestAcceptRecoversAfterEMFILE(t *testing.T) {
	echo := newEcho(t)
	var lc net.ListenConfig
	r := start(t, localproxy.Config{
		Endpoints: []string{echo.addr()},
		Listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			ln, err := lc.Listen(ctx, network, address)
			if err != nil {
				return nil, err
			}
			l := &emfileListener{Listener: ln}
			l.fails.Store(5)
			return l, nil
		},
	})
	// The connection waits in the backlog while accept backs off.
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "after EMFILE"))
	assert.Equal(t, 5.0, metric(t, r.reg, "apifailover_localproxy_accept_errors_total"))
}

func TestMaxConnections(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, MaxConnections: 2})
	c1, c2 := dial(t, r.addr()), dial(t, r.addr())
	require.NoError(t, roundTrip(c1, "1"))
	require.NoError(t, roundTrip(c2, "2"))
	c3 := dial(t, r.addr())
	require.Error(t, roundTrip(c3, "3"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", "max_connections"))
	c1.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, roundTrip(dial(t, r.addr()), "4"))
}

func TestRemovedUpstreamClosesConnections(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{a.addr()}})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "to a"))
	require.Equal(t, int64(1), a.open.Load())

	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: b.addr()}}))
	require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return a.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_failovers_total", "reason", "endpoint_removed"))

	c2 := dial(t, r.addr())
	require.NoError(t, roundTrip(c2, "to b"))
	assert.Equal(t, int64(1), b.open.Load())
}

// Connections to an endpoint removed with a drain timeout stay open until
// the deadline, and /status keeps listing them under removed meanwhile.
func TestRemovedUpstreamDrainsAndIsListed(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	const drain = 300 * time.Millisecond
	r := start(t, localproxy.Config{Endpoints: []string{a.addr()}, DrainTimeout: drain})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "to a"))

	removedAt := time.Now()
	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: b.addr()}}))
	st := r.Status()
	require.Len(t, st.Removed, 1, "status: %+v", st)
	assert.Equal(t, a.addr(), st.Removed[0].Addr)
	assert.Equal(t, 1, st.Removed[0].Conns)
	assert.WithinDuration(t, removedAt.Add(drain), st.Removed[0].CloseBy, drain)
	require.NoError(t, roundTrip(c, "still to a while draining"))

	require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(removedAt), drain)
	require.Eventually(t, func() bool { return len(r.Status().Removed) == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return a.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "the upstream side is closed too")
}

func TestDownUpstreamDrainsThenCloses(t *testing.T) {
	for _, drain := range []time.Duration{0, 500 * time.Millisecond} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			a, b := newEcho(t), newEcho(t)
			pr := newProber()
			r := start(t, localproxy.Config{
				Endpoints:    []string{a.addr(), b.addr()},
				Pool:         upstream.Config{Prober: pr, Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Fall: 1, Rise: 1},
				DrainTimeout: drain,
			})
			require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
			c := dial(t, r.addr())
			require.NoError(t, roundTrip(c, "hello"))
			var first string
			require.Eventually(t, func() bool {
				for _, s := range r.Status().Upstreams {
					if s.Conns == 1 {
						first = s.Addr
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond)

			pr.set(first, errors.New("readyz: 500"))
			require.Eventually(t, func() bool { return !r.Pool().Usable(first) }, 10*time.Second, 5*time.Millisecond)
			if drain > 0 {
				// Still usable while draining.
				require.NoError(t, roundTrip(c, "draining"))
			}
			require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 5*time.Millisecond)
			assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_failovers_total", "reason", "endpoint_down"))
			// New connections go to the other endpoint.
			require.NoError(t, roundTrip(dial(t, r.addr()), "again"))
			require.Eventually(t, func() bool {
				for _, s := range r.Status().Upstreams {
					if s.Addr != first && s.Conns == 1 {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond)
		})
	}
}

// A connection drained because its endpoint went down stays open if the
// endpoint recovers before the drain deadline.
func TestDrainLiftedWhenEndpointRecovers(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	pr := newProber()
	const drain = 300 * time.Millisecond
	r := start(t, localproxy.Config{
		Endpoints:    []string{a.addr(), b.addr()},
		Pool:         upstream.Config{Prober: pr, Interval: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, Fall: 1, Rise: 1},
		DrainTimeout: drain,
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	first := r.Pool().Candidates()[0]
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "hello"))

	pr.set(first, errors.New("readyz: 500"))
	require.Eventually(t, func() bool { return !r.Pool().Usable(first) }, 10*time.Second, time.Millisecond)
	downAt := time.Now()
	pr.set(first, nil)
	require.Eventually(t, func() bool { return r.Pool().Usable(first) }, 10*time.Second, time.Millisecond)
	require.Less(t, time.Since(downAt), drain, "recovered after the drain deadline: nothing is tested")

	time.Sleep(2 * drain)
	require.NoError(t, roundTrip(c, "still open after the drain deadline"))
	assert.False(t, closedByPeer(c))
}

// When every endpoint fails /readyz at once (etcd unavailable) the drained
// connections are not closed at the deadline: there is nowhere better to
// go. Once another endpoint is healthy they are.
func TestDrainKeptWhileNoEndpointIsHealthy(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	pr := newProber()
	const drain = 300 * time.Millisecond
	r := start(t, localproxy.Config{
		Endpoints:    []string{a.addr(), b.addr()},
		Pool:         upstream.Config{Prober: pr, Interval: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, Fall: 1, Rise: 1},
		DrainTimeout: drain,
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "hello"))
	var first, other string
	require.Eventually(t, func() bool {
		for _, s := range r.Status().Upstreams {
			if s.Conns == 1 {
				first = s.Addr
			}
		}
		return first != ""
	}, 10*time.Second, 5*time.Millisecond)
	for _, e := range []string{a.addr(), b.addr()} {
		if e != first {
			other = e
		}
	}

	// Not a ReadyzError: those drain for GracefulDrainTimeout (10 s)
	// whatever DrainTimeout says.
	down := errors.New("probe failed")
	pr.set(first, down)
	pr.set(other, down)
	require.Eventually(t, func() bool { return !r.Pool().Healthy() }, 10*time.Second, time.Millisecond)
	time.Sleep(3 * drain)
	require.NoError(t, roundTrip(c, "kept past the deadline: nowhere better to go"))

	pr.set(other, nil)
	require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 5*time.Millisecond,
		"the drained connection closes once another endpoint is healthy")
}

func TestDialFailureGoesToNextEndpoint(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := dead.Addr().String()
	dead.Close() // connections are refused
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	// Discovered endpoints rank before static-only ones: the dead one is
	// tried first.
	require.NoError(t, r.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: deadAddr}}))
	require.Equal(t, deadAddr, r.Pool().Candidates()[0])

	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "the client does not notice"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_failovers_total", "reason", "dial"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", deadAddr, "result", "error"))
}

func TestNoEndpointAcceptsClosesClient(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead.Close()
	r := start(t, localproxy.Config{Endpoints: []string{dead.Addr().String()}})
	c := dial(t, r.addr())
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", "no_endpoint"))
}

// While every endpoint refuses, clients that reconnect in a loop (kubelet,
// kubectl retries) do not each make a round of dials: for a holdoff after a
// failed round the proxy closes them without dialing. The assertions count,
// whatever the machine's speed: how many rounds a holdoff allows per client
// rate is TestHoldoffBoundsRoundsWhateverTheRequestRate (transport/endpoint),
// on a simulated clock.
func TestDialsHeldOffWhileEveryEndpointRefuses(t *testing.T) {
	var dead []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead = append(dead, ln.Addr().String())
		ln.Close()
	}
	r := start(t, localproxy.Config{Endpoints: dead})
	dials := func() float64 {
		n := 0.0
		for _, a := range dead {
			n += metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", a, "result", "error")
		}
		return n
	}
	rejected := func(reason string) float64 {
		return metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", reason)
	}
	begin := time.Now()
	clients := 0
	for time.Since(begin) < 3*endpoint.DefaultHoldoff || clients < 30 {
		c := dial(t, r.addr())
		require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, time.Millisecond, "a client with no endpoint to go to is closed")
		clients++
	}
	rounds, held := rejected("no_endpoint"), rejected("holdoff")
	t.Logf("%d clients in %v: %.0f rounds of dials, %.0f closed without dialing", clients, time.Since(begin), rounds, held)
	assert.Equal(t, float64(clients), held+rounds, "every client is closed, held off or after a round of dials")
	assert.Equal(t, rounds*float64(len(dead)), dials(), "only clients outside a holdoff dial, each endpoint once")
	assert.Positive(t, held, "dials must not follow the client connection rate: no client was held off")
	assert.Less(t, rounds, float64(clients), "dials must not follow the client connection rate")
}

// An endpoint that comes back ends the holdoff at once: the next client is
// proxied without waiting for it to expire. That it ends at once, not when
// it runs out, is TestHoldoffEndsAtOnceWhenAnEndpointComesBack
// (transport/endpoint), on a simulated clock; this test checks that the
// proxy's holdoff hears of the endpoint coming back.
func TestHoldoffEndsWhenAnEndpointComesBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	pr := newProber()
	pr.set(addr, errors.New("down"))
	r := start(t, localproxy.Config{
		Endpoints: []string{addr},
		Pool:      upstream.Config{Prober: pr, Interval: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, Rise: 1, Fall: 1},
	})
	require.Eventually(t, func() bool { return r.Pool().Status()[0].State == upstream.StateUnhealthy }, 5*time.Second, time.Millisecond)
	var failedAt time.Time
	for range 2 {
		c := dial(t, r.addr())
		require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, time.Millisecond)
		failedAt = time.Now()
	}
	require.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", "holdoff"), "the second client was not held off: nothing is tested")

	ln, err = net.Listen("tcp", addr)
	require.NoError(t, err)
	serveOn(t, ln, echo)
	pr.set(addr, nil)
	require.Eventually(t, func() bool { return r.Pool().Status()[0].State == upstream.StateHealthy }, 5*time.Second, time.Millisecond)
	require.NoError(t, roundTrip(dial(t, r.addr()), "back"))
	if since := time.Since(failedAt); since >= endpoint.DefaultHoldoff {
		t.Skipf("the client came %v after the last failure, after the holdoff had run out: nothing was tested (the machine is slow)", since)
	}
}

func TestRestartRebindsAtOnce(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	addr := r.addr()
	c := dial(t, addr)
	require.NoError(t, roundTrip(c, "first run"))
	require.NoError(t, r.stop())
	require.True(t, closedByPeer(c))

	// The proxy closed the connection first, leaving TIME_WAIT behind on
	// its side: SO_REUSEADDR lets the next run bind anyway.
	r2 := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, ListenAddresses: []string{addr}})
	require.NoError(t, roundTrip(dial(t, r2.addr()), "second run"))
}

func TestShutdownDrainsConnections(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, ShutdownTimeout: time.Minute})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "before"))
	r.cancel()
	// Listeners close, the open connection keeps working.
	require.Eventually(t, func() bool {
		nc, err := net.Dial("tcp", r.addr())
		if err == nil {
			nc.Close()
		}
		return err != nil
	}, 10*time.Second, 5*time.Millisecond)
	require.True(t, r.Status().ShuttingDown)
	require.NoError(t, roundTrip(c, "during drain"))
	// It ends when the client is done.
	c.Close()
	select {
	case <-r.done:
		require.NoError(t, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the last connection closed")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]localproxy.Config{
		"no endpoints":       {},
		"bad endpoint":       {Endpoints: []string{"nope"}},
		"negative drain":     {Endpoints: []string{"10.0.0.1:6443"}, DrainTimeout: -1},
		"bad proxy proto":    {Endpoints: []string{"10.0.0.1:6443"}, ProxyProtocol: "v3"},
		"timeout > interval": {Endpoints: []string{"10.0.0.1:6443"}, Pool: upstream.Config{Interval: time.Second, Timeout: 2 * time.Second}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := localproxy.New(cfg)
			require.Error(t, err)
		})
	}
}

// The bytes of a connection still open are counted too, not only once it
// ends: the event loop tallies its writes, and counts the tally with a
// request, in batches while busy, and before it waits with nothing to do.
func TestCountsWhileConnected(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	c := dial(t, r.addr())
	defer c.Close()
	require.NoError(t, roundTrip(c, "hello"))
	require.NoError(t, roundTrip(c, "again"))
	require.Eventually(t, func() bool {
		return metric(t, r.reg, "apifailover_localproxy_bytes_total", "direction", "in") == 10 &&
			metric(t, r.reg, "apifailover_localproxy_bytes_total", "direction", "out") == 10
	}, 10*time.Second, 5*time.Millisecond, "bytes of an open connection not counted")
}
