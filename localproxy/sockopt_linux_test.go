//go:build linux

package localproxy_test

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/localproxy"
)

// tcpOpts are the socket options the proxy sets on both sides of a
// connection, as the kernel reports them.
type tcpOpts struct {
	KeepAlive   bool
	Idle        int // TCP_KEEPIDLE, seconds
	Interval    int // TCP_KEEPINTVL, seconds
	Count       int // TCP_KEEPCNT, read where TCP_USER_TIMEOUT is not set (the kernel ignores it where it is)
	UserTimeout int // TCP_USER_TIMEOUT, milliseconds; 0 is the system default
	NoDelay     bool
	CC          string // TCP_CONGESTION
}

// readTCPOpts reads tcpOpts back from nc's socket with getsockopt. The
// keepalive timers are left out (zero) when keepalive is off: the kernel
// keeps its defaults there.
func readTCPOpts(nc net.Conn) (tcpOpts, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return tcpOpts{}, &net.OpError{Op: "getsockopt", Err: syscall.ENOTSOCK}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return tcpOpts{}, err
	}
	var o tcpOpts
	var gerr error
	if err := rc.Control(func(fd uintptr) { o, gerr = readTCPOptsFD(int(fd)) }); err != nil {
		return tcpOpts{}, err
	}
	return o, gerr
}

// readTCPOptsFD is readTCPOpts of the socket fd.
func readTCPOptsFD(fd int) (tcpOpts, error) {
	var o tcpOpts
	var gerr error
	get := func(fd, level, opt int) int {
		v, err := unix.GetsockoptInt(fd, level, opt)
		if err != nil && gerr == nil {
			gerr = err
		}
		return v
	}
	o.KeepAlive = get(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE) != 0
	o.UserTimeout = get(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	if o.KeepAlive {
		o.Idle = get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		o.Interval = get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		if o.UserTimeout == 0 {
			o.Count = get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		}
	}
	o.NoDelay = get(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY) != 0
	cc, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil && gerr == nil {
		gerr = err
	}
	o.CC = cc
	return o, gerr
}

// readEndOpts reads tcpOpts back from side (0: the client's, 1: the
// upstream's) of a proxied connection: from the loop's descriptor, or
// from the net.Conn.
func readEndOpts(e localproxy.CopyEnds, side int) (tcpOpts, error) {
	if e.OnLoop {
		return readTCPOptsFD(e.FDs[side])
	}
	return readTCPOpts([]net.Conn{e.Client, e.Upstream}[side])
}

// plainListen is a Config.Listen with Go's defaults (keepalive on every
// accepted connection), but plain TCP, not Multipath TCP: the proxy's
// listeners are plain TCP.
func plainListen(ctx context.Context, network, address string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, network, address)
}

// systemCC returns the system's default congestion control
// (net.ipv4.tcp_congestion_control) and another that this process may
// set.
func systemCC(t *testing.T) (sys, other string) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	require.NoError(t, err)
	sys = strings.TrimSpace(string(b))
	for _, cc := range []string{"reno", "cubic"} {
		if cc != sys && localproxy.CheckCongestionControl(cc) == nil {
			return sys, cc
		}
	}
	t.Skipf("no congestion control but %s to set", sys)
	return "", ""
}

// TestSocketOptionsBothSides reads keepalive, TCP_USER_TIMEOUT and the
// congestion control back from the accepted client socket and the
// upstream socket of a proxied connection. The client is on the host's
// address here (one in a pod), not on loopback: it takes Config.KeepAlive
// and UserTimeout, and keeps the system's congestion control, as the
// upstream side does (TestClientOptionsByAddress: on loopback, the
// opposite).
func TestSocketOptionsBothSides(t *testing.T) {
	sys, other := systemCC(t)
	ip := hostIPv4(t)
	for _, tc := range []struct {
		name             string
		cfg              localproxy.Config
		client, upstream tcpOpts
		// onLoop: the loop accepted the connection (no net.Conn).
		onLoop bool
	}{{
		name: "configured",
		cfg: localproxy.Config{
			KeepAlive: 7 * time.Second, UserTimeout: 1500 * time.Millisecond,
			UpstreamKeepAlive: 9 * time.Second, UpstreamUserTimeout: 2500 * time.Millisecond,
			LoopbackCongestionControl: other,
		},
		client:   tcpOpts{KeepAlive: true, Idle: 7, Interval: 7, UserTimeout: 1500, NoDelay: true, CC: sys},
		upstream: tcpOpts{KeepAlive: true, Idle: 9, Interval: 9, UserTimeout: 2500, NoDelay: true, CC: sys},
	}, {
		// Go's accept turns keepalive on with 15s by itself: the client
		// side must be retuned to the proxy's defaults.
		name:     "defaults",
		client:   tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
		upstream: tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
	}, {
		// The proxy's own listeners hand their options to the sockets
		// they accept; on a listener of the caller's, Go's accept sets
		// keepalive (15s) itself, so each connection is tuned after it.
		name:     "caller's listener",
		cfg:      localproxy.Config{Listen: plainListen, LoopbackCongestionControl: other},
		client:   tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
		upstream: tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
	}, {
		// Given to the proxy (as systemd's sockets are): the loop
		// accepts on it, and tunes each connection itself.
		name:     "caller's listener, owned",
		cfg:      localproxy.Config{Listen: plainListen, ListenersOwned: true, LoopbackCongestionControl: other},
		client:   tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
		upstream: tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys},
		onLoop:   true,
	}, {
		// Without TCP_USER_TIMEOUT, the probes' count ends a connection.
		name:     "keepalive alone",
		cfg:      localproxy.Config{UserTimeout: -1, UpstreamUserTimeout: -1},
		client:   tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, Count: 3, NoDelay: true, CC: sys},
		upstream: tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, Count: 3, NoDelay: true, CC: sys},
	}, {
		name:     "disabled",
		cfg:      localproxy.Config{KeepAlive: -1, UserTimeout: -1, UpstreamKeepAlive: -1, UpstreamUserTimeout: -1, LoopbackCongestionControl: localproxy.SystemCongestionControl},
		client:   tcpOpts{NoDelay: true, CC: sys},
		upstream: tcpOpts{NoDelay: true, CC: sys},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			echo := newEcho(t)
			cfg := tc.cfg
			cfg.Endpoints = []string{echo.addr()}
			cfg.ListenAddresses = []string{net.JoinHostPort(ip, "0")}
			r := start(t, cfg)
			c := dial(t, r.addr())
			// The upstream is attached before any byte is copied, and the
			// client socket was tuned before the dial.
			require.NoError(t, roundTrip(c, "tuned"))
			ends := r.CopyEnds()
			require.Len(t, ends, 1)
			require.Equal(t, c.LocalAddr().String(), ends[0].ClientAddr.String(), "not this test's client socket")
			require.Equal(t, echo.addr(), ends[0].UpstreamAddr.String(), "not the upstream socket")
			// With one P (go test -cpu 1), Go accepts (needLoopSockets):
			// the options are the same.
			onLoop := (tc.onLoop || tc.cfg.Listen == nil) && loopOwnsSockets(r)
			assert.Equal(t, onLoop, ends[0].Client == nil, "accepted by the loop")

			got, err := readEndOpts(ends[0], 0)
			require.NoError(t, err)
			assert.Equal(t, tc.client, got, "client side")
			got, err = readEndOpts(ends[0], 1)
			require.NoError(t, err)
			assert.Equal(t, tc.upstream, got, "upstream side")
		})
	}
}

// A client connection's options follow the address it reached, on the
// proxy's own listener and on a caller's alike, and on a wildcard
// listener, which takes both kinds: on loopback, the loopback congestion
// control and no keepalive or TCP_USER_TIMEOUT of the proxy's (a
// caller's listener keeps Go's keepalive, 15s); on another address of
// this host (a client in a pod, on the node's address), Config.KeepAlive
// and UserTimeout, and the system's congestion control.
func TestClientOptionsByAddress(t *testing.T) {
	sys, other := systemCC(t)
	ip := hostIPv4(t)
	remote := tcpOpts{KeepAlive: true, Idle: 5, Interval: 5, UserTimeout: 10000, NoDelay: true, CC: sys}
	for _, tc := range []struct {
		name     string
		cfg      localproxy.Config
		loopback tcpOpts
	}{
		{"own listeners", localproxy.Config{}, tcpOpts{NoDelay: true, CC: other}},
		{"caller's listeners", localproxy.Config{Listen: plainListen}, tcpOpts{KeepAlive: true, Idle: 15, Interval: 15, Count: 9, NoDelay: true, CC: other}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			echo := newEcho(t)
			cfg := tc.cfg
			cfg.Endpoints = []string{echo.addr()}
			cfg.ListenAddresses = []string{"127.0.0.1:0", net.JoinHostPort(ip, "0"), "0.0.0.0:0"}
			cfg.LoopbackCongestionControl = other
			r := start(t, cfg)
			addrs := r.Addrs()
			require.Len(t, addrs, 3)
			wildPort := strconv.Itoa(addrs[2].(*net.TCPAddr).Port)
			want := map[string]tcpOpts{}
			for i, a := range []string{addrs[0].String(), addrs[1].String(), net.JoinHostPort("127.0.0.1", wildPort), net.JoinHostPort(ip, wildPort)} {
				c := dial(t, a)
				require.NoError(t, roundTrip(c, "options"))
				want[c.LocalAddr().String()] = []tcpOpts{tc.loopback, remote}[i%2]
			}
			ends := r.CopyEnds()
			require.Len(t, ends, 4)
			for _, e := range ends {
				got, err := readEndOpts(e, 0)
				require.NoError(t, err)
				assert.Equal(t, want[e.ClientAddr.String()], got, "client %s on %s", e.ClientAddr, e.ClientLocal)
			}
		})
	}
}

// hostIPv4 returns an IPv4 address of this host other than loopback's: a
// client on it is one in a pod, or on another host; skips t without one.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no IPv4 address on this host but loopback")
	return ""
}

// A client on loopback that stops reading while its answer streams in
// keeps its connection for as long as it stops, as a direct connection
// would: a kubelet stalled under pressure, or kubectl -w piped into a
// pager, is not cut off after UserTimeout (since Linux 5.11 a window kept
// shut counts against TCP_USER_TIMEOUT). A loopback peer cannot vanish
// unseen, its kernel being this one. A client on another address of the
// host (one in a pod) is cut off after it, as a dead peer is: the stall
// is long enough to tell.
func TestStalledReaderKeptOnLoopbackOnly(t *testing.T) {
	ip := hostIPv4(t)
	for _, tc := range []struct {
		name, host string
		kept       bool
	}{
		{"loopback", "127.0.0.1", true},
		{"host address", ip, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const size = 64 << 20
			sent := make(chan error, 1)
			srv := newServer(t, func(c *net.TCPConn) {
				chunk := make([]byte, 64<<10)
				var err error
				for n := 0; n < size && err == nil; n += len(chunk) {
					_, err = c.Write(chunk)
				}
				sent <- err
				c.CloseWrite()
				io.Copy(io.Discard, c)
			})
			r := start(t, localproxy.Config{Endpoints: []string{srv.addr()}, ListenAddresses: []string{net.JoinHostPort(tc.host, "0")}, UserTimeout: time.Second})
			d := net.Dialer{Control: smallRcvBuf}
			c, err := d.Dial("tcp", r.addr())
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			// The stall: five times the user timeout, with the answer's
			// bytes queued in front of the client.
			time.Sleep(5 * time.Second)
			c.SetReadDeadline(time.Now().Add(time.Minute))
			n, err := io.Copy(io.Discard, c)
			if !tc.kept {
				assert.True(t, err != nil || n < size, "a stalled client on %s kept its connection: %d bytes, %v", tc.host, n, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(size), n, "bytes read after the stall")
			assert.NoError(t, <-sent, "the server's writes")
		})
	}
}
