package localproxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

const (
	healthActive   = "apifailover_localproxy_health_connections_active"
	healthRejected = "apifailover_localproxy_health_connections_rejected_total"
	healthEvicted  = "apifailover_localproxy_health_connections_evicted_total"
)

// metricIs is a condition for require.Eventually: the metric name has the
// value want.
func metricIs(r *running, name string, want float64) func() bool {
	return func() bool {
		v, err := metricValue(r.reg, name)
		return err == nil && v == want
	}
}

// startWithHealth runs a proxy with a health server, to one echo
// upstream, its health server waiting readHeaderTimeout for request
// headers (0: the default).
func startWithHealth(t *testing.T, readHeaderTimeout time.Duration) *running {
	cfg := localproxy.Config{
		Endpoints:     []string{newEcho(t).addr()},
		HealthAddress: "127.0.0.1:0",
		Pool:          upstream.Config{Prober: newProber()},
	}
	localproxy.SetHealthReadHeaderTimeout(&cfg, readHeaderTimeout)
	return start(t, cfg)
}

// A local process that opens many more connections to the health port
// than it holds, and keeps them open without a request, holds at most
// HealthMaxConnections of them: each new connection beyond the cap closes
// the oldest that has no request in progress, so the proxy's descriptors
// stay bounded and a new health client (kubelet's probe) is served at
// once. Only connections whose requests are in progress keep their slot
// (see TestHealthServerRejectsWhenEveryConnectionIsBusy). Once the
// holders go, their slots are given back.
func TestHealthServerCapsConnections(t *testing.T) {
	// Connections that send nothing stay until the test closes them.
	r := startWithHealth(t, time.Hour)
	haddr := r.HealthAddr().String()
	const max = localproxy.HealthMaxConnections
	const clients = 4 * max
	fds0, _ := os.ReadDir("/proc/self/fd")

	holders := make([]net.Conn, 0, clients)
	closeHolders := func() {
		for _, c := range holders {
			c.Close()
		}
	}
	t.Cleanup(closeHolders)
	for range clients {
		c, err := net.DialTimeout("tcp", haddr, 10*time.Second)
		require.NoError(t, err)
		holders = append(holders, c)
	}
	require.Eventually(t, metricIs(r, healthEvicted, clients-max), 10*time.Second, 5*time.Millisecond,
		"connections evicted to make room; evicted %v, active %v", metric(t, r.reg, healthEvicted), metric(t, r.reg, healthActive))
	assert.Equal(t, float64(max), metric(t, r.reg, healthActive))
	assert.Zero(t, metric(t, r.reg, healthRejected), "no new connection turned away: each took an idle one's slot")
	if n, ok := connsOnPort(t, r.HealthAddr().(*net.TCPAddr).Port); ok {
		assert.Equal(t, max, n, "connections the proxy holds open on the health port")
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil && fds0 != nil {
		// The test's own sockets (clients) are in the count.
		t.Logf("%d connections to the health port held: %d more descriptors in the process, %d of them the test's", clients, len(fds)-len(fds0), clients)
		assert.LessOrEqual(t, len(fds)-len(fds0), clients+max+8)
	}
	// The oldest went: the first clients-max holders, the newest stay.
	for i, c := range holders {
		assert.Equal(t, i < clients-max, closedByPeer(c), "holder %d of %d (oldest first) closed by the proxy", i, clients)
	}

	// A probe while the port is full of idle holders is served.
	hz := newHealthz(r)
	require.Eventually(t, hz.is(http.StatusOK, "ok"), 10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	require.NoError(t, roundTrip(dial(t, r.addr()), "the data path serves while the health port is full"))

	closeHolders()
	// The poll's kept-alive connection may hold one.
	require.Eventually(t, func() bool { v, err := metricValue(r.reg, healthActive); return err == nil && v <= 1 },
		10*time.Second, 5*time.Millisecond, "the holders' connections are given back")
}

// A local process that pipelines requests on every slot of the health
// server, reading none of the answers, keeps every slot serving a
// request; it cannot keep kubelet's probe out: at the cap, the connection
// with the longest run of requests back to back (or, once the answers
// fill its buffers, the one whose write has been blocked longest) gives
// its slot to the new one.
func TestHealthServerEvictsPipeliningClients(t *testing.T) {
	r := startWithHealth(t, 0)
	haddr := r.HealthAddr().String()
	pipelined := []byte(strings.Repeat("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 2000))
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range localproxy.HealthMaxConnections {
		c, err := net.DialTimeout("tcp", haddr, 10*time.Second)
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).SetReadBuffer(4096)) // full sooner
		conns = append(conns, c)
		go c.Write(pipelined) // blocks once the server stops reading; ends at the close
	}
	require.Eventually(t, metricIs(r, healthActive, localproxy.HealthMaxConnections), 10*time.Second, 5*time.Millisecond)
	time.Sleep(time.Second) // the answers fill the sockets' buffers, and the server's writes block

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + haddr + "/healthz")
	require.NoError(t, err, "a probe while every slot serves pipelined requests")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Positive(t, metric(t, r.reg, healthEvicted))
	assert.Zero(t, metric(t, r.reg, healthRejected))
}

// A client that sends its request headers a byte at a time, each in good
// time for any per-read timeout (slowloris), is disconnected once the
// health server's ReadHeaderTimeout has passed since it connected, before
// its headers are complete.
func TestHealthServerCutsSlowHeaders(t *testing.T) {
	const timeout = 300 * time.Millisecond
	r := startWithHealth(t, timeout)
	c := dial(t, r.HealthAddr().String())
	req := "GET /healthz HTTP/1.1\r\nHost: localproxy\r\nX-Slow: " + strings.Repeat("x", 200) + "\r\n\r\n"

	type answer struct {
		data string
		err  error
	}
	answers := make(chan answer, 1)
	go func() {
		b, err := io.ReadAll(c) // until the server closes the connection
		answers <- answer{string(b), err}
	}()
	const every = 100 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	sent := 0
	var got answer
send:
	for sent < len(req) {
		select {
		case got = <-answers:
			break send
		case <-tick.C:
			if _, err := c.Write([]byte{req[sent]}); err != nil {
				got = <-answers
				break send
			}
			sent++
		}
	}
	require.Less(t, sent, len(req), "the server waited for all the headers, a byte every %v", every)
	t.Logf("disconnected after %d of %d bytes, one every %v (ReadHeaderTimeout %v): %q, %v", sent, len(req), every, timeout, got.data, got.err)
	assert.NotContains(t, got.data, "200 OK")
	require.Eventually(t, metricIs(r, healthActive, 0), 10*time.Second, 5*time.Millisecond, "the connection is given back")
}

// What the health server reads of a request is bounded: headers up to 8
// KiB (and net/http's 4 KiB of slack), and no body: a request with one
// is answered without reading it, and its connection closed. "OPTIONS *"
// gets the methods allowed, without net/http's reading of a body.
func TestHealthServerRequestLimits(t *testing.T) {
	r := startWithHealth(t, 0)
	for _, tc := range []struct {
		name      string
		req       string
		code      int
		close     bool
		allowHead bool
	}{
		{
			name: "bearer token sized headers",
			req:  "GET /healthz HTTP/1.1\r\nHost: localproxy\r\nAuthorization: Bearer " + strings.Repeat("t", 2048) + "\r\n\r\n",
			code: http.StatusOK,
		},
		{
			name:  "headers beyond the limit",
			req:   "GET /healthz HTTP/1.1\r\nHost: localproxy\r\nX-Big: " + strings.Repeat("x", 16<<10) + "\r\n\r\n",
			code:  http.StatusRequestHeaderFieldsTooLarge,
			close: true,
		},
		{
			name:  "GET with a body not sent",
			req:   "GET /healthz HTTP/1.1\r\nHost: localproxy\r\nContent-Length: 100000\r\n\r\n",
			code:  http.StatusOK,
			close: true,
		},
		{
			name:  "POST with a chunked body, unfinished",
			req:   "POST /healthz HTTP/1.1\r\nHost: localproxy\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n" + strings.Repeat("b", 100),
			code:  http.StatusMethodNotAllowed,
			close: true, allowHead: true,
		},
		{
			name:      "OPTIONS *",
			req:       "OPTIONS * HTTP/1.1\r\nHost: localproxy\r\n\r\n",
			code:      http.StatusOK,
			allowHead: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, r.HealthAddr().String())
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			_, err := io.WriteString(c, tc.req)
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tc.code, resp.StatusCode)
			assert.Equal(t, tc.close, resp.Close, "Connection: close")
			if tc.allowHead {
				assert.Equal(t, "GET, HEAD, OPTIONS", resp.Header.Get("Allow"))
			}
		})
	}
}
