package localproxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// When the proxy cuts a client connection (its API server left the
// pool, a drain ended), an HTTP/2 client must see errors client-go sends
// a GET again after: EOF or a reset, as from a server that went away.
// Go's HTTP/2 client fails every stream of a connection with "client
// connection force closed via ClientConn.Close" once one write on it
// failed, which client-go does not retry: a kubelet's or a controller's
// GETs in flight would fail instead of going to another API server.
//
// The client's goroutines share one thread here, as on a busy node: its
// writes then meet the cut before its read loop does.
func TestCutConnectionFailsStreamsRetryably(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for round := range 5 {
		forceClosed, other, total := cutWhileBusy(t)
		t.Logf("round %d: %d GETs failed, %d with force closed, %d with other errors client-go does not send again", round, total, forceClosed, other)
		require.Equal(t, cutGets, total, "every GET fails: its server is gone")
		require.Zero(t, forceClosed, "GETs failed with \"force closed\", which client-go does not send again")
		require.Zero(t, other, "GETs failed with errors client-go does not send again")
	}
}

// cutGets and cutUploads are the streams on the connection when it is
// cut: GETs waiting for their answer, and uploads whose bodies flow (the
// client's writes).
const cutGets, cutUploads = 20, 8

// cutWhileBusy sends GETs that wait for their answer and uploads whose
// bodies flow, all on one HTTP/2 connection through the proxy, cuts the
// connection by removing its API server from the pool, and counts the
// GETs that failed, and those with an error client-go would not send
// again. An upload cut midway cannot be sent again by anyone.
func cutWhileBusy(t *testing.T) (forceClosed, other, total int) {
	t.Helper()
	release := make(chan struct{})
	connected := make(chan struct{})
	var connectedOnce sync.Once
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			connectedOnce.Do(func() { close(connected) })
		}
		if r.Method == http.MethodPost {
			io.Copy(io.Discard, r.Body)
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	defer close(release)
	other2 := newEcho(t)

	r := start(t, localproxy.Config{Endpoints: []string{srv.Listener.Addr().String()}})
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "example.com"},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", r.addr())
		},
	}
	// As client-go configures its transport (HTTP/2 from x/net).
	tr = utilnet.SetTransportDefaults(tr)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// The connection, before the load: its first request answered by
	// the server's handler, so that the load's streams all go on it. A
	// connection the proxy counts may still be in its TLS handshake; the
	// load's requests would then each dial one of their own, and on a busy
	// machine some would still be handshaking at the cut: their requests,
	// not yet sent, go on new connections to the next API server (here an
	// echo server, which fails their handshakes).
	req, _ := http.NewRequest(http.MethodHead, "https://example.com/", nil)
	go client.Do(req)
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request did not reach the server through the proxy within 10s")
	}
	require.EqualValues(t, 1, r.Status().ActiveConnections, "connections through the proxy")

	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range cutGets + cutUploads {
		wg.Go(func() {
			var req *http.Request
			if i < cutGets {
				req, _ = http.NewRequest(http.MethodGet, "https://example.com/", nil)
			} else {
				pr, pw := io.Pipe()
				go func() {
					chunk := []byte(strings.Repeat("x", 4096))
					for {
						if _, err := pw.Write(chunk); err != nil {
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
				defer pr.Close()
				req, _ = http.NewRequest(http.MethodPost, "https://example.com/", pr)
			}
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				err = errors.New("answered")
			}
			if i < cutGets {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // the streams are in flight
	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: other2.addr()}}))
	wg.Wait()
	for _, err := range errs {
		total++
		switch {
		case strings.Contains(err.Error(), "force closed"):
			forceClosed++
		case !(utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) || utilnet.IsHTTP2ConnectionLost(err)):
			other++
			t.Logf("not retried by client-go: %v", err)
		}
	}
	return forceClosed, other, total
}

// A cut client connection is closed FIN first: the client reads an EOF,
// and its socket stays open (a write still lands) for the grace. The
// descriptor held so counts against MaxConnections: two of them as much
// as an open connection.
func TestLingeringClosesCountAgainstMaxConnections(t *testing.T) {
	a, b := newEcho(t), newEcho(t)
	const grace = 3 * time.Second
	cfg := localproxy.Config{Endpoints: []string{a.addr()}, MaxConnections: 2}
	localproxy.SetClientCloseGrace(&cfg, grace)
	r := start(t, cfg)
	c1, c2 := dial(t, r.addr()), dial(t, r.addr())
	require.NoError(t, roundTrip(c1, "1 to a"))
	require.NoError(t, roundTrip(c2, "2 to a"))

	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: b.addr()}}))
	cut := time.Now()
	for _, c := range []net.Conn{c1, c2} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "read %d bytes", n)
		_, err = c.Write([]byte("late"))
		require.NoError(t, err, "the proxy's socket is open after its FIN")
	}
	require.Eventually(t, func() bool { return r.Status().ActiveConnections == 0 }, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(2), r.Lingering())

	// Two lingering descriptors and one open connection: the bound.
	c3 := dial(t, r.addr())
	require.NoError(t, roundTrip(c3, "3 to b"))
	require.Error(t, roundTrip(dial(t, r.addr()), "4, beyond the bound"))
	require.Equal(t, 1.0, metric(t, r.reg, "apifailover_localproxy_connections_rejected_total", "reason", "max_connections"))
	require.Equal(t, int64(2), r.Lingering(), "the grace (%s) ended before the test could see its bound: %s passed", grace, time.Since(cut))

	// The grace over, the descriptors are closed and count no more.
	require.Eventually(t, func() bool { return r.Lingering() == 0 }, 10*time.Second, time.Millisecond)
	require.GreaterOrEqual(t, time.Since(cut), grace)
	_, err := c1.Write([]byte("x"))
	for i := 0; err == nil && i < 100; i++ { // the reset to the first write makes a later one fail
		time.Sleep(10 * time.Millisecond)
		_, err = c1.Write([]byte("x"))
	}
	require.Error(t, err, "the proxy's socket is closed after the grace")
	require.NoError(t, roundTrip(dial(t, r.addr()), "5 to b"))
}

// An API server counted down or removed while its answer is still
// arriving (a lossy server: its probes time out, its data comes late) has
// the connection cut once that answer stopped coming, within
// answerGrace; a connection whose server sends nothing is cut once it is
// endpoint.QuietFor old (the kernel's clock of received data starts at
// the handshake).
func TestCutWaitsForAnArrivingAnswer(t *testing.T) {
	const chunks, every = 8, 100 * time.Millisecond
	// The answer: a chunk every 100ms once the request is read, then
	// nothing.
	slow := newServer(t, func(c *net.TCPConn) {
		if _, err := c.Read(make([]byte, 64)); err != nil {
			return
		}
		for range chunks {
			if _, err := c.Write([]byte("chunk\n")); err != nil {
				return
			}
			time.Sleep(every)
		}
		io.Copy(io.Discard, c)
	})
	silent := newServer(t, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	other := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{slow.addr()}})
	// onlyTo makes addr the pool's only endpoint and returns a connection
	// to it with a request sent.
	onlyTo := func(addr string) net.Conn {
		t.Helper()
		require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: addr}}))
		c := dial(t, r.addr())
		_, err := c.Write([]byte("request"))
		require.NoError(t, err)
		return c
	}

	c := onlyTo(slow.addr())
	buf := make([]byte, 6)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadFull(c, buf)
	require.NoError(t, err, "the answer starts")
	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: other.addr()}}))
	got := 1
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			require.ErrorIs(t, err, io.EOF, "the cut comes as an EOF")
			break
		}
		got++
	}
	require.Equal(t, chunks, got, "the whole answer arrived before the cut")

	c2 := onlyTo(silent.addr())
	require.Eventually(t, func() bool {
		return r.Status().ActiveConnections == 1 && len(r.Status().Upstreams) == 1 && r.Status().Upstreams[0].Conns == 1
	}, 10*time.Second, time.Millisecond)
	cut := time.Now()
	require.NoError(t, r.Pool().Set(upstream.SourceStatic, []upstream.Spec{{Addr: other.addr()}}))
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c2.Read(buf)
	require.ErrorIs(t, err, io.EOF)
	t.Logf("a connection whose server sent nothing was cut %v after its removal", time.Since(cut))
}
