//go:build linux

package localproxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/internal/testnet"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// loopOwnsSockets: r's loop accepts and dials itself. One that waits
// through Go's network poller (one P: go test -cpu 1) does neither: Go's
// accept and dialer do, and the loop takes their connections over once
// they are connected (TestLoopWithOneP).
func loopOwnsSockets(r *running) bool { return r.LoopMode() != "poller" }

// needLoopSockets skips t unless r's loop accepts and dials itself.
func needLoopSockets(t *testing.T, r *running) {
	t.Helper()
	if !loopOwnsSockets(r) {
		t.Skip("one P: the loop leaves accepting and dialing to Go")
	}
}

// hungListener is testnet.HungListener.
var hungListener = testnet.HungListener

// Connections to the proxy's own listeners are accepted and dialed on the
// loop: no net.Conn on either side.
func TestOwnListenersAcceptOnTheLoop(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	needLoopSockets(t, r)
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "on the loop"))
	ends := r.CopyEnds()
	require.Len(t, ends, 1)
	assert.True(t, ends[0].OnLoop, "not copied on the loop")
	assert.Nil(t, ends[0].Client, "the client connection went through Go's accept")
	assert.Nil(t, ends[0].Upstream, "the upstream connection went through Go's dialer")
	assert.Equal(t, c.LocalAddr().String(), ends[0].ClientAddr.String())
	assert.Equal(t, c.RemoteAddr().String(), ends[0].ClientLocal.String())
	assert.Equal(t, echo.addr(), ends[0].UpstreamAddr.String())
	c.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, r.LoopKeys(), "ids left with the poller")
}

// The first candidate hangs (its SYNs are dropped): after the stagger
// delay the next one is tried beside it and wins; the hung attempt is
// closed, counted as a lost dial, and nothing of it stays on the loop.
func TestLoopDialStaggersPastAHungEndpoint(t *testing.T) {
	hung := hungListener(t)
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, StaggerDelay: 100 * time.Millisecond, AttemptTimeout: time.Minute, DialTimeout: time.Minute})
	needLoopSockets(t, r)
	// Discovered endpoints rank before static-only ones: the hung one is
	// tried first, until its probe fails.
	require.NoError(t, r.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: hung}}))
	require.Equal(t, hung, r.Pool().Candidates()[0])

	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "past the hung one"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_failovers_total", "reason", "dial"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", hung, "result", "error"), "the lost attempt")
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", echo.addr(), "result", "ok"))
	assert.Zero(t, r.LoopDialing(), "an attempt still in flight")
	assert.Equal(t, 2, r.LoopKeys(), "the connection's id and its winning attempt's")
	c.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, r.LoopKeys(), "ids left with the poller")
}

// The loop's dial, like DialAny, starts beside an attempt in flight only
// a candidate as healthy as the first was: with two healthy candidates,
// one refusing at once (and marked unhealthy by it, Fall 1) and one
// whose SYNs are dropped, and a third that fails its probes but accepts
// at once, the third is connected only after the hung attempt timed out,
// in whichever order the pool's tie puts the healthy two. It would win
// every race against a slow healthy server otherwise.
func TestLoopDialHedgesOnlyWithAsHealthy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := ln.Addr().String()
	ln.Close()
	hung := hungListener(t)
	notReady := newEcho(t)
	pr := newProber()
	pr.set(notReady.addr(), errors.New("GET /readyz: 500"))
	r := start(t, localproxy.Config{
		Endpoints:    []string{refused, hung, notReady.addr()},
		Pool:         upstream.Config{Prober: pr, Rise: 1, Fall: 1, Interval: time.Hour},
		StaggerDelay: 20 * time.Millisecond, AttemptTimeout: time.Second, DialTimeout: time.Minute,
	})
	needLoopSockets(t, r)
	require.Eventually(t, statesAre(r, map[string]upstream.State{refused: upstream.StateHealthy, hung: upstream.StateHealthy, notReady.addr(): upstream.StateUnhealthy}),
		10*time.Second, 5*time.Millisecond, "%+v", r.Pool().Status())
	require.Equal(t, notReady.addr(), r.Pool().Candidates()[2])

	c := dial(t, r.addr())
	require.Eventually(t, func() bool { return r.LoopDialing() == 1 }, 10*time.Second, time.Millisecond)
	time.Sleep(500 * time.Millisecond) // 25 staggers, half the hung attempt's timeout
	assert.Zero(t, notReady.open.Load(), "the endpoint that is not ready was dialed beside the healthy attempt in flight")
	require.NoError(t, roundTrip(c, "once the healthy attempts failed"))
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", hung, "result", "error"), "the hung attempt")
	c.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, r.LoopKeys(), "ids left with the poller")
}

// Once the healthier attempts failed, the loop's race goes on among the
// less healthy candidates with their own bar: an unhealthy candidate
// starts beside an unhealthy attempt in flight (one whose SYNs are
// dropped) at the stagger, instead of after the attempt's timeout, here
// a minute.
func TestLoopDialHedgeBarFollowsTheAttemptsInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := ln.Addr().String()
	ln.Close()
	hung := hungListener(t)
	reachable := newEcho(t)
	pr := newProber()
	pr.set(hung, errors.New("i/o timeout"))
	pr.set(reachable.addr(), errors.New("GET /readyz: 500"))
	// The unhealthy two in this order: the hung one in this proxy's zone.
	r := start(t, localproxy.Config{
		Endpoints: []string{refused + "@a", hung + "@a", reachable.addr() + "@b"},
		// Loopback counts as local, which ranks before zones: not here.
		Pool:         upstream.Config{Zone: "a", IsLocal: func(string) bool { return false }, Prober: pr, Rise: 1, Fall: 1, Interval: time.Hour},
		StaggerDelay: 20 * time.Millisecond, AttemptTimeout: time.Minute, DialTimeout: time.Minute,
	})
	require.Eventually(t, statesAre(r, map[string]upstream.State{refused: upstream.StateHealthy, hung: upstream.StateUnhealthy, reachable.addr(): upstream.StateUnhealthy}),
		10*time.Second, 5*time.Millisecond, "%+v", r.Pool().Status())
	require.Equal(t, []string{refused, hung, reachable.addr()}, r.Pool().Candidates())

	c := dial(t, r.addr())
	c.SetDeadline(time.Now().Add(10 * time.Second))
	require.NoError(t, roundTrip(c, "beside the hung attempt"), "the reachable one waited for the hung attempt's timeout")
	c.Close()
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, r.LoopKeys(), "ids left with the poller")
}

// statesAre is a condition for require.Eventually: the pool of r has
// the endpoints of want in their states.
func statesAre(r *running, want map[string]upstream.State) func() bool {
	return func() bool {
		n := 0
		for _, s := range r.Pool().Status() {
			if w, ok := want[s.Addr]; ok {
				if s.State != w {
					return false
				}
				n++
			}
		}
		return n == len(want)
	}
}

// A dial whose candidates both hang ends at the attempts' timeout, or at
// the whole dial's: the client is closed, both attempts are counted
// failed, and nothing of them stays on the loop.
func TestLoopDialGivesUpOnHungEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name             string
		attempt, timeout time.Duration
	}{
		{"attempt timeout", 200 * time.Millisecond, time.Minute},
		{"dial timeout", time.Minute, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung := []string{hungListener(t), hungListener(t)}
			r := start(t, localproxy.Config{Endpoints: hung, StaggerDelay: 50 * time.Millisecond, AttemptTimeout: tc.attempt, DialTimeout: tc.timeout})
			c := dial(t, r.addr())
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err := c.Read(make([]byte, 1))
			require.Error(t, err, "the client was not closed")
			require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the client was not closed")
			assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", "no_endpoint"))
			for _, h := range hung {
				assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", h, "result", "error"), h)
			}
			require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, 5*time.Millisecond)
			assert.Zero(t, r.LoopDialing())
			assert.Zero(t, r.LoopKeys(), "ids left with the poller")
		})
	}
}

// A connection closed while it dials (here by the shutdown) ends its
// attempts at once: Run returns without waiting for them to time out.
func TestLoopDialEndsWithTheConnection(t *testing.T) {
	hung := hungListener(t)
	r := start(t, localproxy.Config{Endpoints: []string{hung}, AttemptTimeout: time.Minute, DialTimeout: time.Minute})
	needLoopSockets(t, r)
	c := dial(t, r.addr())
	require.Eventually(t, func() bool { return r.LoopDialing() == 1 }, 10*time.Second, 5*time.Millisecond)
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop() }()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run waits for the dial")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadAll(c)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the client was not closed")
	assert.Zero(t, r.LoopDialing())
	assert.Zero(t, r.LoopKeys(), "ids left with the poller")
	assert.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_dials_total", "endpoint", hung, "result", "error"), "the abandoned attempt")
}

// A candidate given by name needs resolving, which the loop does not do:
// its connections are served on goroutines, as without the loop.
func TestLoopHandsHostNamesToTheDialer(t *testing.T) {
	echo := newEcho(t)
	_, port, err := net.SplitHostPort(echo.addr())
	require.NoError(t, err)
	named := net.JoinHostPort("localhost", port)
	if addrs, err := net.LookupHost("localhost"); err != nil || len(addrs) == 0 {
		t.Skip("localhost does not resolve here")
	}
	r := start(t, localproxy.Config{Endpoints: []string{named}})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "by name"))
	ends := r.CopyEnds()
	require.Len(t, ends, 1)
	assert.NotNil(t, ends[0].Client, "accepted on the loop, served on goroutines")
	assert.Equal(t, c.LocalAddr().String(), ends[0].ClientAddr.String())
}

// An IPv6 upstream is dialed on the loop too.
func TestLoopDialsIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	srv := serveOn(t, ln, echo)
	r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}})
	needLoopSockets(t, r)
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "v6"))
	ends := r.CopyEnds()
	require.Len(t, ends, 1)
	assert.Nil(t, ends[0].Upstream, "dialed by Go")
	assert.Equal(t, srv.addr(), ends[0].UpstreamAddr.String())
}

// The loop accepts a few connections per event (here one) and goes on
// with the rest after its other events: connections queued together are
// all served, though their listener's edge came once.
func TestLoopAcceptsTheRestAfterABatch(t *testing.T) {
	// Restored after the proxy stops (cleanups run last first).
	t.Cleanup(localproxy.SetAcceptBatch(1))
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	const n = 40
	conns := make(chan net.Conn, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := net.DialTimeout("tcp", r.addr(), 10*time.Second)
			if err != nil {
				errs <- err
				return
			}
			conns <- c
			errs <- roundTrip(c, "queued together")
		}()
	}
	for range n {
		assert.NoError(t, <-errs)
	}
	close(conns)
	for c := range conns {
		c.Close()
	}
}

// The proxy's own listening socket is watched by the loop's epoll alone:
// Go's network poller, which watches every socket Go made, woke a thread
// of its at each accept's edge for nothing. The socket is closed when Run
// returns.
func TestLoopListenerIsOutOfGosPoller(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	addr := r.addr()
	ino := listeningInode(t, addr)
	require.NotZero(t, ino, "no listening socket on %s", addr)
	assert.Equal(t, 1, epollsWatching(t, ino), "epoll instances watching the listening socket")
	c := dial(t, addr)
	require.NoError(t, roundTrip(c, "accepted on the loop"))
	c.Close()
	require.NoError(t, r.stop())
	assert.Zero(t, listeningInode(t, addr), "the listening socket outlived Run")
	assert.Zero(t, epollsWatching(t, ino))
}

// listeningInode is the inode of this process's listening TCP socket
// bound to addr, 0 if it has none.
func listeningInode(t *testing.T, addr string) uint64 {
	t.Helper()
	want, err := net.ResolveTCPAddr("tcp", addr)
	require.NoError(t, err)
	return socketInode(t, func(fd int) bool {
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on == 0 {
			return false
		}
		sa, err := unix.Getsockname(fd)
		return err == nil && isAddr(sa, want)
	})
}

// peerSocketInode is the inode of this process's TCP socket whose peer is
// addr, 0 if it has none.
func peerSocketInode(t *testing.T, addr net.Addr) uint64 {
	t.Helper()
	return socketInode(t, func(fd int) bool {
		sa, err := unix.Getpeername(fd)
		return err == nil && isAddr(sa, addr.(*net.TCPAddr))
	})
}

// socketInode is the inode of this process's first socket that match
// takes, 0 if none.
func socketInode(t *testing.T, match func(fd int) bool) uint64 {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, _ := os.Readlink("/proc/self/fd/" + e.Name()); !strings.HasPrefix(link, "socket:") || !match(fd) {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			return st.Ino
		}
	}
	return 0
}

// isAddr: sa is the IPv4 address a.
func isAddr(sa unix.Sockaddr, a *net.TCPAddr) bool {
	s4, ok := sa.(*unix.SockaddrInet4)
	return ok && s4.Port == a.Port && net.IP(s4.Addr[:]).Equal(a.IP)
}

// epollsWatching counts this process's epoll instances that watch the
// file of inode ino.
func epollsWatching(t *testing.T, ino uint64) int { return len(epollWatches(t, ino)) }

// epollEvents is the events an epoll instance of this process watches
// the file of inode ino for, 0 if none watches it.
func epollEvents(t *testing.T, ino uint64) uint32 {
	if w := epollWatches(t, ino); len(w) > 0 {
		return w[0]
	}
	return 0
}

// epollWatches is the events each of this process's epoll instances that
// watch the file of inode ino watches it for (their fdinfo's "tfd:" lines
// name each watched file's inode and events in hex).
func epollWatches(t *testing.T, ino uint64) []uint32 {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var out []uint32
	for _, e := range entries {
		if link, _ := os.Readlink("/proc/self/fd/" + e.Name()); link != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != "tfd:" || f[2] != "events:" || !slices.Contains(f, "ino:"+strconv.FormatUint(ino, 16)) {
				continue
			}
			v, err := strconv.ParseUint(f[3], 16, 32)
			require.NoError(t, err, "fdinfo line %q", line)
			out = append(out, uint32(v))
			break
		}
	}
	return out
}

// The loop's accept reports both addresses of each client connection as
// Go's would: the client's, and the one it reached (asked of the socket
// when the listener's IP is unspecified), over IPv4, IPv6 and IPv4 on a
// dual-stack listener.
func TestLoopAcceptReportsTheAddresses(t *testing.T) {
	for _, tc := range []struct{ listen, dial string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"0.0.0.0:0", "127.0.0.1"},
		{"[::1]:0", "::1"},
		{"[::]:0", "127.0.0.1"},
		{"[::]:0", "::1"},
	} {
		t.Run(tc.listen+" from "+tc.dial, func(t *testing.T) {
			if probe, err := net.Listen("tcp", tc.listen); err != nil {
				t.Skipf("cannot listen on %s here: %v", tc.listen, err)
			} else {
				probe.Close()
			}
			echo := newEcho(t)
			r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, ListenAddresses: []string{tc.listen}})
			_, port, err := net.SplitHostPort(r.addr())
			require.NoError(t, err)
			c, err := net.DialTimeout("tcp", net.JoinHostPort(tc.dial, port), 5*time.Second)
			if err != nil {
				t.Skipf("cannot reach %s here: %v", tc.dial, err)
			}
			t.Cleanup(func() { c.Close() })
			require.NoError(t, roundTrip(c, "addresses"))
			ends := r.CopyEnds()
			require.Len(t, ends, 1)
			assert.True(t, ends[0].OnLoop, "not accepted on the loop")
			assert.Equal(t, c.LocalAddr().String(), ends[0].ClientAddr.String(), "the client's address")
			assert.Equal(t, c.RemoteAddr().String(), ends[0].ClientLocal.String(), "the address the client reached")
		})
	}
}

// A connection dialed on the loop reads its client's first bytes as soon
// as its upstream connects, and watches the client's socket for room only
// once a write to it found it full. So a round trip whose request came
// while the upstream connected (here past a hung first candidate), and
// whose answer fits the client's buffer, brings the loop no event of the
// client's socket; before, the socket's registration, writable and
// readable at once, cost a wait of the loop for a read that could be made
// without it.
func TestLoopReadsTheFirstBytesOnceConnected(t *testing.T) {
	hung := hungListener(t)
	echo := newEcho(t)
	// The client writes at once; the stagger leaves a loaded machine
	// time for it before the upstream connects.
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, StaggerDelay: 500 * time.Millisecond, AttemptTimeout: time.Minute, DialTimeout: time.Minute})
	needLoopSockets(t, r)
	require.NoError(t, r.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: hung}}))
	require.Equal(t, hung, r.Pool().Candidates()[0])
	var mu sync.Mutex
	var client, up []uint32
	defer r.OnLoopEvent(func(sock int, events uint32) {
		mu.Lock()
		defer mu.Unlock()
		if sock == 0 {
			client = append(client, events)
		} else {
			up = append(up, events)
		}
	})()

	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "sent while the upstream connected"))
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, up, "no event of the upstream's socket seen: the test proves nothing")
	assert.Empty(t, client, "events of the client's socket (%#x)", client)
}

// A client that stops reading while its answer streams in fills its
// socket's buffer: the loop watches the socket for room from then on, and
// the client gets every byte once it reads again.
func TestLoopWatchesAFullClientForRoom(t *testing.T) {
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, UserTimeout: -1})
	needLoopSockets(t, r)
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "first"))
	ino := peerSocketInode(t, c.LocalAddr())
	require.NotZero(t, ino, "the proxy's socket of the client")
	before := epollEvents(t, ino)
	require.NotZero(t, before&unix.EPOLLIN, "the client's socket is not watched: %#x", before)
	assert.Zero(t, before&unix.EPOLLOUT, "the client's socket is watched for room before it was full: %#x", before)

	const size = 16 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		wrote <- err
	}()
	require.Eventually(t, func() bool { return epollEvents(t, ino)&unix.EPOLLOUT != 0 },
		10*time.Second, 5*time.Millisecond, "the full client's socket is not watched for room")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, size)
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.NoError(t, <-wrote)
	assert.True(t, slices.Equal(data, got), "the answer differs")
}
