package localproxy_test

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// parkWait bounds how long a test waits for idle copies to park (they
// park within twice their linger, at most 640ms).
const parkWait = 10 * time.Second

// waitParked waits until the proxy has n copies parked.
func waitParked(t *testing.T, r *running, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return r.ParkedDirections() == n }, parkWait, 5*time.Millisecond,
		"parked copies: want %d, have %d", n, r.ParkedDirections())
}

// TestIdleConnectionsHoldNoGoroutines: idle proxied connections park both
// copies in the poller, so that 1,000 of them leave the process's
// goroutines where they were; then every one carries data both ways
// again. The test is the upstream itself, from its own goroutine, so that
// the only goroutines per connection would be the proxy's.
func TestIdleConnectionsHoldNoGoroutines(t *testing.T) {
	const n = 1000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r := start(t, localproxy.Config{Endpoints: []string{ln.Addr().String()}})
	before := runtime.NumGoroutine()

	clients, ups := make([]net.Conn, n), make([]net.Conn, n)
	defer func() {
		for i := range n {
			for _, c := range []net.Conn{clients[i], ups[i]} {
				if c != nil {
					c.Close()
				}
			}
		}
	}()
	// exchange sends msg from one end of connection i to the other.
	exchange := func(from, to net.Conn, msg string) error {
		to.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(from, msg); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(to, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return fmt.Errorf("got %q, want %q", buf, msg)
		}
		return nil
	}
	for i := range n {
		c, err := net.DialTimeout("tcp", r.addr(), 10*time.Second)
		require.NoError(t, err)
		clients[i] = c
		// The proxy dials the upstream as it accepts: one at a time.
		up, err := ln.Accept()
		require.NoError(t, err)
		ups[i] = up
		require.NoError(t, exchange(c, up, fmt.Sprintf("request %d", i)))
		require.NoError(t, exchange(up, c, fmt.Sprintf("response %d", i)))
	}
	waitParked(t, r, 2*n)
	// A few for the poller and the runtime; none per connection.
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+5 }, parkWait, 10*time.Millisecond)
	t.Logf("goroutines: %d before, %d holding %d idle connections", before, runtime.NumGoroutine(), n)
	assert.Equal(t, int64(n), r.Status().ActiveConnections)

	for i := range n {
		require.NoError(t, exchange(ups[i], clients[i], fmt.Sprintf("event %d", i)), "connection %d", i)
		require.NoError(t, exchange(clients[i], ups[i], fmt.Sprintf("request %d again", i)), "connection %d", i)
	}
	for i := range n {
		clients[i].Close()
		ups[i].Close()
	}
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 30*time.Second, 10*time.Millisecond)
}

// A parked connection passes either side's EOF on as one that is copying
// does (TestHalfClose).
func TestParkedHalfClose(t *testing.T) {
	t.Run("client to server", func(t *testing.T) {
		got := make(chan string, 1)
		srv := newServer(t, func(c *net.TCPConn) {
			io.WriteString(c, "hello")
			b, _ := io.ReadAll(c)
			got <- string(b)
			io.WriteString(c, "reply to "+string(b))
			c.CloseWrite()
		})
		r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
		c := dial(t, r.addr())
		_, err := io.WriteString(c, "request")
		require.NoError(t, err)
		hello := make([]byte, 5)
		_, err = io.ReadFull(c, hello)
		require.NoError(t, err)
		waitParked(t, r, 2)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		assert.Equal(t, "request", <-got)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Equal(t, "reply to request", string(b))
	})
	t.Run("server to client", func(t *testing.T) {
		got := make(chan string, 1)
		held := make(chan struct{})
		srv := newServer(t, func(c *net.TCPConn) {
			io.WriteString(c, "banner")
			<-held
			c.CloseWrite()
			b, _ := io.ReadAll(c)
			got <- string(b)
		})
		release := sync.OnceFunc(func() { close(held) })
		t.Cleanup(release) // before the server's, which waits for it
		r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
		c := dial(t, r.addr())
		banner := make([]byte, 6)
		_, err := io.ReadFull(c, banner)
		require.NoError(t, err)
		waitParked(t, r, 2)
		release()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Empty(t, string(b))
		_, err = io.WriteString(c, "still sending")
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		assert.Equal(t, "still sending", <-got)
	})
}

// The deadlines that close a connection close a parked one on time: the
// half-open timeout, the idle timeout and the shutdown deadline.
func TestParkedConnectionDeadlines(t *testing.T) {
	const timeout = time.Second
	t.Run("half-open", func(t *testing.T) {
		// The server half-closes once the connection is parked and then
		// never finishes; the client stays silent.
		held := make(chan struct{})
		srv := newServer(t, func(c *net.TCPConn) {
			io.WriteString(c, "x")
			<-held
			c.CloseWrite()
			io.Copy(io.Discard, c)
		})
		release := sync.OnceFunc(func() { close(held) })
		t.Cleanup(release) // before the server's, which waits for it
		r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, HalfOpenTimeout: timeout})
		c := dial(t, r.addr())
		_, err := io.ReadFull(c, make([]byte, 1))
		require.NoError(t, err)
		waitParked(t, r, 2)
		closedAt := time.Now()
		release()
		// The upstream's EOF ends its copy; the client's stays parked.
		waitParked(t, r, 1)
		require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
		assert.GreaterOrEqual(t, time.Since(closedAt), timeout)
		require.Eventually(t, func() bool { return srv.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "the upstream side is closed too")
	})
	t.Run("idle", func(t *testing.T) {
		echo := newEcho(t)
		r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, IdleTimeout: timeout})
		c := dial(t, r.addr())
		require.NoError(t, roundTrip(c, "x"))
		lastData := time.Now()
		waitParked(t, r, 2)
		require.Eventually(t, func() bool { return closedByPeer(c) }, 10*time.Second, 10*time.Millisecond)
		assert.GreaterOrEqual(t, time.Since(lastData), timeout)
		assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_closed_by_proxy_total", "reason", "idle"))
	})
	t.Run("shutdown", func(t *testing.T) {
		echo := newEcho(t)
		r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, ShutdownTimeout: timeout})
		busy, idle := dial(t, r.addr()), dial(t, r.addr())
		require.NoError(t, roundTrip(busy, "x"))
		require.NoError(t, roundTrip(idle, "x"))
		waitParked(t, r, 4)
		cancelAt := time.Now()
		r.cancel()
		// A parked connection is served during the drain.
		require.NoError(t, roundTrip(busy, "during the drain"))
		select {
		case <-r.done:
			require.NoError(t, r.err)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after the shutdown deadline")
		}
		assert.GreaterOrEqual(t, time.Since(cancelAt), timeout)
		assert.True(t, closedByPeer(busy))
		assert.True(t, closedByPeer(idle))
		require.Eventually(t, func() bool { return echo.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "the upstream side is closed too")
	})
}
