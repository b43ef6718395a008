package endpoint_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// h2Server is an API server stand-in speaking HTTP/2 over TLS that counts
// its TLS handshakes and closed connections, answers /readyz with status,
// and can freeze: its connections then swallow what the client sends and
// answer nothing (a hung process, a blackhole).
type h2Server struct {
	*httptest.Server
	addr       string
	handshakes atomic.Int32
	closed     atomic.Int32
	requests   atomic.Int32
	h1         atomic.Int32 // requests over HTTP/1.1
	status     atomic.Int32
	frozen     atomic.Bool
	// stall, if set, blocks /readyz until it is closed.
	stall atomic.Pointer[chan struct{}]
	// closeAnonymous closes the connection after a request without an
	// Authorization header, as kube-apiserver does
	// (UnauthenticatedHTTP2DOSMitigation): GOAWAY after the answer.
	closeAnonymous atomic.Bool
}

func newH2Server(t testing.TB, cert tls.Certificate) *h2Server {
	s := &h2Server{}
	s.status.Store(http.StatusOK)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if r.ProtoMajor != 2 {
			s.h1.Add(1)
		}
		if stall := s.stall.Load(); stall != nil {
			select {
			case <-*stall:
			case <-r.Context().Done():
			}
		}
		if s.closeAnonymous.Load() && r.Header.Get("Authorization") == "" {
			w.Header().Set("Connection", "close")
		}
		w.WriteHeader(int(s.status.Load()))
		w.Write([]byte("ok\n"))
	}))
	ts.Listener = &freezeListener{Listener: ts.Listener, frozen: &s.frozen}
	ts.EnableHTTP2 = true
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, VerifyConnection: func(tls.ConnectionState) error {
		s.handshakes.Add(1)
		return nil
	}}
	ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			s.closed.Add(1)
		}
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	s.Server, s.addr = ts, ts.Listener.Addr().String()
	return s
}

// freezeListener's connections discard what they read while frozen.
type freezeListener struct {
	net.Listener
	frozen *atomic.Bool
}

func (l *freezeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &freezeConn{Conn: c, frozen: l.frozen}, nil
}

type freezeConn struct {
	net.Conn
	frozen *atomic.Bool
}

func (c *freezeConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.frozen.Load() {
			return n, err
		}
	}
}

// reporter records the failures a Prober reports between probes.
type reporter struct {
	mu   sync.Mutex
	got  []report
	seen chan struct{}
}

type report struct {
	addr string
	f    upstream.Failure
	err  error
	at   time.Time
	// answered: a late PING was answered (ReportAnswered), not a failure.
	answered bool
}

func newReporter() *reporter { return &reporter{seen: make(chan struct{}, 100)} }

func (r *reporter) ReportFailure(addr string, f upstream.Failure, err error) {
	r.mu.Lock()
	r.got = append(r.got, report{addr: addr, f: f, err: err, at: time.Now()})
	r.mu.Unlock()
	r.seen <- struct{}{}
}

func (r *reporter) ReportAnswered(addr string) {
	r.mu.Lock()
	r.got = append(r.got, report{addr: addr, at: time.Now(), answered: true})
	r.mu.Unlock()
	r.seen <- struct{}{}
}

func (r *reporter) reports() []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]report(nil), r.got...)
}

// wait returns the next report, failing the test after d.
func (r *reporter) wait(t *testing.T, d time.Duration) report {
	t.Helper()
	select {
	case <-r.seen:
	case <-time.After(d):
		t.Fatalf("no failure reported within %v", d)
	}
	got := r.reports()
	return got[len(got)-1]
}

// heldProber returns a ProbeHeld prober for pki's servers, closed when the
// test ends.
func heldProber(t testing.TB, pki *testPKI, rep endpoint.Reporter) *endpoint.Prober {
	return heldProberWith(t, pki, rep, nil)
}

// heldProberWith is heldProber with its configuration changed by edit.
func heldProberWith(t testing.TB, pki *testPKI, rep endpoint.Reporter, edit func(*endpoint.ProbeConfig)) *endpoint.Prober {
	roots := x509.NewCertPool()
	roots.AddCert(pki.CA)
	c := endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName, RootCAs: roots, PingInterval: 100 * time.Millisecond}
	if edit != nil {
		edit(&c)
	}
	p, err := endpoint.NewProber(c)
	require.NoError(t, err)
	p.Reporter = rep
	t.Cleanup(p.Close)
	return p
}

func probeCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestParseProbeModeHeld(t *testing.T) {
	m, err := endpoint.ParseProbeMode("Held")
	require.NoError(t, err)
	assert.Equal(t, endpoint.ProbeHeld, m)
	_, err = endpoint.ParseProbeMode("ping")
	assert.ErrorContains(t, err, "readyz, held, tls, tcp")
	m, err = endpoint.ParseProbeMode("")
	require.NoError(t, err)
	assert.Equal(t, endpoint.ProbeHeld, m, "held is the default")
}

// Probes of a held channel share one TLS handshake, and GET /readyz goes
// over it only every ReadyzInterval: the probes between take the word of
// the answered PINGs and send nothing.
func TestHeldProbeOneHandshake(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProberWith(t, pki, newReporter(), func(c *endpoint.ProbeConfig) { c.ReadyzInterval = 400 * time.Millisecond })
	for range 5 {
		require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	}
	assert.Equal(t, int32(1), s.handshakes.Load())
	assert.Equal(t, int32(1), s.requests.Load(), "one GET /readyz per ReadyzInterval")
	time.Sleep(450 * time.Millisecond)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(2), s.requests.Load())
	assert.Equal(t, int32(1), s.handshakes.Load())
	assert.Zero(t, s.h1.Load())
}

// An endpoint not in use is asked /readyz every IdleReadyzInterval, one in
// use every ReadyzInterval: one that comes into use is asked at its next
// probe once its last answer is older than that.
func TestHeldProbeIdleReadyzInterval(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	var inUse atomic.Bool
	p := heldProberWith(t, pki, newReporter(), func(c *endpoint.ProbeConfig) {
		c.ReadyzInterval, c.IdleReadyzInterval = 300*time.Millisecond, time.Hour
	})
	p.InUse = func(string) bool { return inUse.Load() }
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	time.Sleep(400 * time.Millisecond)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(1), s.requests.Load(), "not in use: the answer holds for IdleReadyzInterval")
	inUse.Store(true)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(2), s.requests.Load(), "in use: asked again, the answer is older than ReadyzInterval")
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(2), s.requests.Load())
}

// IdleReadyzInterval left zero is 3 × ReadyzInterval, and never shorter
// than it.
func TestHeldProbeIdleReadyzDefault(t *testing.T) {
	for _, tc := range []struct {
		name        string
		every, idle time.Duration
		wait        time.Duration
		want        int32
	}{
		{"zero: 3 × ReadyzInterval, still fresh", 200 * time.Millisecond, 0, 400 * time.Millisecond, 1},
		{"zero: 3 × ReadyzInterval, stale", 200 * time.Millisecond, 0, 700 * time.Millisecond, 2},
		{"shorter than ReadyzInterval: ReadyzInterval", 400 * time.Millisecond, time.Millisecond, 200 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pki := newPKI(t)
			s := newH2Server(t, pki.Cert)
			p := heldProberWith(t, pki, newReporter(), func(c *endpoint.ProbeConfig) {
				c.ReadyzInterval, c.IdleReadyzInterval = tc.every, tc.idle
			})
			p.InUse = func(string) bool { return false }
			require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
			time.Sleep(tc.wait)
			require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
			assert.Equal(t, tc.want, s.requests.Load())
		})
	}
}

// Only a 200 is taken on trust: after any other answer every probe asks
// /readyz again, and so does the first probe over a new connection.
func TestHeldProbeTrustsOnlyReady(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProber(t, pki, newReporter())
	s.status.Store(http.StatusInternalServerError)
	for range 3 {
		require.Error(t, p.Probe(probeCtx(t, time.Second), s.addr))
	}
	assert.Equal(t, int32(3), s.requests.Load())
	s.status.Store(http.StatusOK)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(4), s.requests.Load())

	s.CloseClientConnections()
	assert.Eventually(t, func() bool { return s.closed.Load() == 1 }, time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(5), s.requests.Load(), "a new connection asks /readyz")
	assert.Equal(t, int32(2), s.handshakes.Load())
}

// ProbeRTT tells the PINGs' smoothed round trip, with or without a
// request: on loopback well under the time a GET /readyz takes.
func TestHeldProbeRTT(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProber(t, pki, newReporter())
	rtt, err := p.ProbeRTT(probeCtx(t, time.Second), s.addr)
	require.NoError(t, err)
	assert.Positive(t, rtt)
	time.Sleep(300 * time.Millisecond) // PINGs answered
	rtt, err = p.ProbeRTT(probeCtx(t, time.Second), s.addr)
	require.NoError(t, err)
	assert.Positive(t, rtt)
	assert.Less(t, rtt, 50*time.Millisecond)
	assert.Equal(t, int32(1), s.requests.Load())
}

// A server that does not speak HTTP/2 is probed as ProbeReadyz does: one
// connection per probe.
func TestHeldProbeHTTP1Server(t *testing.T) {
	pki := newPKI(t)
	addr, resumed, _ := readyzServer(t, "127.0.0.1:0", pki.Cert)
	p := heldProber(t, pki, newReporter())
	for range 2 {
		require.NoError(t, p.Probe(probeCtx(t, time.Second), addr))
	}
	assert.Len(t, *resumed, 2)
}

// /readyz answers other than 200 are ReadyzErrors, as with ProbeReadyz; so
// is no answer in time from a server that still answers PINGs (up, waiting
// for etcd). The connection answered: it stays held.
func TestHeldProbeReadyzError(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProber(t, pki, newReporter())
	s.status.Store(http.StatusInternalServerError)
	err := p.Probe(probeCtx(t, time.Second), s.addr)
	var re *endpoint.ReadyzError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, http.StatusInternalServerError, re.Status)
	assert.False(t, re.TimedOut)

	s.status.Store(http.StatusOK)
	stall := make(chan struct{})
	s.stall.Store(&stall)
	err = p.Probe(probeCtx(t, 500*time.Millisecond), s.addr)
	require.ErrorAs(t, err, &re)
	assert.True(t, re.TimedOut, "%v", err)
	assert.True(t, endpoint.Graceful(upstream.Event{Kind: upstream.EventDown, Err: err}))
	close(stall)
	s.stall.Store(nil)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.LessOrEqual(t, s.handshakes.Load(), int32(2), "a timed-out probe closes the connection; a 500 does not")
}

// A /readyz that timed out with no PING answered since is a ReadyzError
// (up, not ready: drained, not cut) when the server sent data on a
// client connection meanwhile: the busy PINGs wait while it does, as it
// says as much (kube-apiserver waiting for etcd serves its cache).
func TestHeldReadyzTimeoutHeard(t *testing.T) {
	start := time.Now().Add(-time.Second)
	err := endpoint.RequestFailed(context.DeadlineExceeded, start, false)
	var re *endpoint.ReadyzError
	assert.False(t, errors.As(err, &re), "neither PING nor data: %v", err)
	err = endpoint.RequestFailed(context.DeadlineExceeded, start, true)
	require.ErrorAs(t, err, &re)
	assert.True(t, re.TimedOut)
}

// A server that stops answering is reported as soon as a PING goes
// unanswered past its timeout (late), and again when it stays unanswered
// past the confirmation, with no probe in between; the next probe fails
// as a plain timeout (not ReadyzError: the server does not answer at
// all).
func TestHeldReportsFrozenServer(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	rep := newReporter()
	p := heldProber(t, pki, rep)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	time.Sleep(300 * time.Millisecond) // some PINGs answered
	assert.Empty(t, rep.reports())

	frozen := time.Now()
	s.frozen.Store(true)
	late := rep.wait(t, 2*time.Second)
	lost := rep.wait(t, 2*time.Second)
	// PING interval (100ms, +10% jitter) + the timeout's floor (200ms),
	// then the confirmation (100ms more).
	assert.Less(t, late.at.Sub(frozen), 600*time.Millisecond)
	assert.Less(t, lost.at.Sub(frozen), 700*time.Millisecond)
	assert.GreaterOrEqual(t, lost.at.Sub(late.at), 90*time.Millisecond)
	for _, r := range []report{late, lost} {
		assert.Equal(t, s.addr, r.addr)
		assert.Equal(t, upstream.FailureConnLost, r.f)
	}
	assert.ErrorContains(t, late.err, "PING unanswered within 200ms")
	assert.ErrorContains(t, lost.err, "PING unanswered within 300ms")

	err := p.Probe(probeCtx(t, 300*time.Millisecond), s.addr)
	require.Error(t, err)
	assert.False(t, endpoint.IsReadyzError(err), "%v", err)
	assert.Len(t, rep.reports(), 2, "a failed probe is the pool's result, not reported")
}

// A connection lost (the server closed it) is reported at once; the next
// probe opens a new one.
func TestHeldReconnectsAfterLoss(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	rep := newReporter()
	p := heldProber(t, pki, rep)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	lost := time.Now()
	s.CloseClientConnections()
	r := rep.wait(t, time.Second)
	assert.Less(t, r.at.Sub(lost), 300*time.Millisecond)
	assert.Equal(t, upstream.FailureConnLost, r.f)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(2), s.handshakes.Load())
}

// A server with a certificate that does not verify fails as ProbeReadyz
// does, so the pool quarantines it.
func TestHeldProbeCertificate(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Wrong)
	p := heldProber(t, pki, newReporter())
	err := p.Probe(probeCtx(t, time.Second), s.addr)
	require.ErrorIs(t, err, upstream.ErrCertificate)
}

// Forget closes the channel of an endpoint removed from the pool, without
// reporting it; Close closes them all, and later probes fail.
func TestHeldForgetAndClose(t *testing.T) {
	pki := newPKI(t)
	a, b := newH2Server(t, pki.Cert), newH2Server(t, pki.Cert)
	rep := newReporter()
	p := heldProber(t, pki, rep)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), a.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), b.addr))
	p.Forget(a.addr)
	assert.Eventually(t, func() bool { return a.closed.Load() == 1 }, time.Second, 10*time.Millisecond)
	assert.Equal(t, int32(0), b.closed.Load())
	require.NoError(t, p.Probe(probeCtx(t, time.Second), a.addr), "a forgotten endpoint may come back")
	assert.Equal(t, int32(2), a.handshakes.Load())

	p.Close()
	assert.Eventually(t, func() bool { return a.closed.Load() == 2 && b.closed.Load() == 1 }, time.Second, 10*time.Millisecond)
	err := p.Probe(probeCtx(t, time.Second), a.addr)
	assert.ErrorIs(t, err, endpoint.ErrProberClosed)
	assert.Empty(t, rep.reports())
	p.Close() // again: no-op
}

// A probe whose context ends before its answer closes the connection.
func TestHeldProbeDeadlineClosesConnection(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProberWith(t, pki, newReporter(), func(c *endpoint.ProbeConfig) { c.ReadyzInterval = time.Nanosecond })
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := p.Probe(ctx, s.addr)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
	assert.Eventually(t, func() bool { return s.closed.Load() == 1 }, time.Second, 10*time.Millisecond)
}

// With the pool as its Reporter, a server that hangs is avoided by new
// connections (suspect) as soon as a PING goes unanswered past its
// timeout, and is down when it stays unanswered past the confirmation,
// without waiting for a probe; the other endpoint stays healthy.
func TestHeldWithPool(t *testing.T) {
	pki := newPKI(t)
	a, b := newH2Server(t, pki.Cert), newH2Server(t, pki.Cert)
	roots := x509.NewCertPool()
	roots.AddCert(pki.CA)
	pr, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName, RootCAs: roots})
	require.NoError(t, err)
	pool, err := upstream.New(upstream.Config{Prober: pr, IsLocal: func(string) bool { return false }})
	require.NoError(t, err)
	pr.Reporter = pool
	down := make(chan time.Time, 10)
	defer pool.Subscribe(func(ev upstream.Event) {
		switch ev.Kind {
		case upstream.EventDown:
			down <- time.Now()
		case upstream.EventRemoved:
			pr.Forget(ev.Addr)
		}
	})()
	require.NoError(t, pool.Set(upstream.SourceStatic, []upstream.Spec{{Addr: a.addr}, {Addr: b.addr}}))
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { pool.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
		pr.Close()
	}()
	require.Eventually(t, pool.Healthy, 2*time.Second, 10*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // a few rounds: one handshake each
	assert.Equal(t, int32(1), a.handshakes.Load())

	frozen := time.Now()
	a.frozen.Store(true)
	require.Eventually(t, func() bool {
		for _, st := range pool.Status() {
			if st.Addr == a.addr {
				return st.Suspect || st.State == upstream.StateUnhealthy
			}
		}
		return false
	}, time.Second, 5*time.Millisecond)
	suspect := time.Since(frozen)
	var downAt time.Time
	select {
	case downAt = <-down:
	case <-time.After(3 * time.Second):
		t.Fatal("not down")
	}
	t.Logf("hung server suspect after %v, down after %v", suspect.Round(time.Millisecond), downAt.Sub(frozen).Round(time.Millisecond))
	assert.Less(t, suspect, 700*time.Millisecond)
	// PING interval 250ms (+10%), timeout 200ms, confirmation 100ms: a
	// probe after the first report (a new connection's handshake, 1s
	// timeout) would take longer.
	assert.Less(t, downAt.Sub(frozen), 900*time.Millisecond)
	got, err := pool.Pick()
	require.NoError(t, err)
	assert.Equal(t, b.addr, got)
}

// A server that shuts down gracefully (GOAWAY, then close) is reported, to
// a prober with credentials, as going away (FailureGoAway: ranked lower, not counted towards Fall; a
// GOAWAY sent to rebalance connections, --goaway-chance, is lifted by the
// next probe). That probe tells: here the server is gone.
func TestHeldGoAwayReported(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	rep := newReporter()
	p := heldProberWith(t, pki, rep, func(c *endpoint.ProbeConfig) { c.BearerToken = "t" })
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, s.Config.Shutdown(probeCtx(t, time.Second)))
	r := rep.wait(t, time.Second)
	assert.Equal(t, upstream.FailureGoAway, r.f)
	assert.ErrorContains(t, r.err, "GOAWAY")
	assert.Eventually(t, func() bool { return s.closed.Load() == 1 }, time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.Len(t, rep.reports(), 1)
	assert.Error(t, p.Probe(probeCtx(t, time.Second), s.addr))
}

// Reconnects to an endpoint that keeps failing back off: the first one at
// once, then with waits that double; a probe due before the wait is over
// fails with the last failure, without dialing.
func TestHeldReconnectBackoff(t *testing.T) {
	pki := newPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // connections refused
	var dials atomic.Int32
	roots := x509.NewCertPool()
	roots.AddCert(pki.CA)
	p, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName, RootCAs: roots,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	require.Error(t, p.Probe(probeCtx(t, time.Second), addr))
	require.Error(t, p.Probe(probeCtx(t, time.Second), addr))
	assert.Equal(t, int32(2), dials.Load(), "the first reconnect at once")
	err = p.Probe(probeCtx(t, 60*time.Millisecond), addr)
	assert.ErrorContains(t, err, "reconnecting in")
	assert.ErrorContains(t, err, "refused", "the last failure")
	assert.Equal(t, int32(2), dials.Load())
	start := time.Now()
	require.Error(t, p.Probe(probeCtx(t, time.Second), addr))
	assert.Equal(t, int32(3), dials.Load(), "a probe with time to wait waits, then dials")
	assert.Greater(t, time.Since(start), 20*time.Millisecond)
}

// A held connection was verified with the CA of its handshake: once the
// CA file changes, the next probe verifies the server again, over a new
// connection, as ProbeReadyz would.
func TestHeldProbeReverifiesAfterCAChange(t *testing.T) {
	pki, other := newPKI(t), newPKI(t)
	s := newH2Server(t, pki.Cert)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, pki.CAPEM, 0o600))
	p, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: originName, CAFile: caFile, TLSReloadInterval: time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	assert.Equal(t, int32(1), s.handshakes.Load())

	require.NoError(t, os.WriteFile(caFile, other.CAPEM, 0o600))
	time.Sleep(5 * time.Millisecond)
	err = p.Probe(probeCtx(t, time.Second), s.addr)
	require.ErrorIs(t, err, upstream.ErrCertificate)
}

// A server that closes the connection after each anonymous request (as
// kube-apiserver does) is not reported going away: every anonymous probe
// reconnects, without a failure. With credentials the connection is held.
func TestHeldAnonymousGoAwayNotReported(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	s.closeAnonymous.Store(true)
	rep := newReporter()
	p := heldProber(t, pki, rep)
	for range 3 {
		require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
		assert.Eventually(t, func() bool { return s.closed.Load() >= s.handshakes.Load() }, time.Second, 5*time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	assert.Empty(t, rep.reports())
	assert.Equal(t, int32(3), s.handshakes.Load(), "a new connection per anonymous probe")

	authed := heldProberWith(t, pki, rep, func(c *endpoint.ProbeConfig) { c.BearerToken = "t" })
	for range 3 {
		require.NoError(t, authed.Probe(probeCtx(t, time.Second), s.addr))
	}
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, int32(4), s.handshakes.Load(), "one connection held with credentials")
	assert.Empty(t, rep.reports())
}

// A held connection the server closed (here after an anonymous request,
// with GOAWAY) is not taken for fresh by a probe that comes before its
// watch has seen the end: the probe connects again and asks the server.
// The watch is held up here between the end of its PING loop and the
// connection's close, as a loaded machine may schedule it late; before,
// such a probe answered from the closed connection, no request sent.
func TestHeldProbeDoesNotTrustAClosedConnection(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	s.closeAnonymous.Store(true)
	ended := make(chan struct{}, 1)
	release := make(chan struct{})
	defer endpoint.OnHeldEnded(func() {
		select {
		case ended <- struct{}{}:
		default:
		}
		<-release
	})()
	p := heldProber(t, pki, newReporter())
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the server's close did not end the held connection's watch")
	}
	err := p.Probe(probeCtx(t, time.Second), s.addr)
	close(release)
	require.NoError(t, err)
	assert.Equal(t, int32(2), s.handshakes.Load(), "the second probe did not connect again: answered from the closed connection")
}

// The pool's rounds may slow down to 5s with held probes, no further than
// ReadyzInterval; other modes check in every round.
func TestQuietInterval(t *testing.T) {
	assert.Zero(t, (*endpoint.Prober)(nil).QuietInterval())
	assert.Zero(t, (&endpoint.Prober{Mode: endpoint.ProbeReadyz}).QuietInterval())
	assert.Equal(t, endpoint.DefaultQuietInterval, (&endpoint.Prober{Mode: endpoint.ProbeHeld}).QuietInterval())
	assert.Equal(t, time.Second, (&endpoint.Prober{Mode: endpoint.ProbeHeld, ReadyzInterval: time.Second}).QuietInterval())
}

// The probe of a suspect endpoint (upstream.Suspected) does not take the
// held connection's word: new connections to it failed or stayed silent,
// and the held one can still answer PINGs while they do (a full accept
// queue, a listener that stopped). It checks over a new connection, and
// fails if that does; the held connection stays.
func TestHeldProbeSuspectedChecksANewConnection(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProber(t, pki, newReporter())
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	require.Equal(t, int32(1), s.handshakes.Load())

	rtt, err := p.ProbeRTT(upstream.WithSuspected(probeCtx(t, time.Second)), s.addr)
	require.NoError(t, err)
	assert.Equal(t, int32(2), s.handshakes.Load(), "the suspect endpoint's probe opened no new connection")
	assert.Equal(t, int32(2), s.requests.Load(), "no /readyz over the new connection")
	assert.Positive(t, rtt)

	// New connections are refused; the held one still answers.
	require.NoError(t, s.Listener.Close())
	err = p.Probe(upstream.WithSuspected(probeCtx(t, time.Second)), s.addr)
	require.Error(t, err, "the suspect endpoint passed on the held connection's word")
	assert.ErrorContains(t, err, "refused")
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr), "the held connection was dropped")
}

// A held connection stays open across the gap to the pool's next round
// when rounds slow down to the quiet interval: two probes a moment apart
// (a round, then one a Kick brought forward; or the last fast round before
// every endpoint is healthy again) are followed by up to QuietInterval
// without a probe, and a server that hangs in that gap is caught by a PING
// (within the confirmation timeout), not by the dial of the next round.
func TestHeldConnectionSpansTheQuietInterval(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	rep := newReporter()
	p := heldProber(t, pki, rep)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	// Past heldIdleMin (3s) and three times the last gap, within the
	// quiet interval (5s).
	time.Sleep(3500 * time.Millisecond)
	require.Zero(t, s.closed.Load(), "the held connection was closed as idle before the pool's next round was due")
	hang := time.Now()
	s.frozen.Store(true)
	r := rep.wait(t, 2*time.Second)
	assert.Equal(t, upstream.FailureConnLost, r.f, "%v", r.err)
	assert.Less(t, r.at.Sub(hang), time.Second)
	assert.Equal(t, int32(1), s.handshakes.Load())
}

// The held connection of an endpoint that is no longer probed (it left the
// pool without Forget) is still closed, once three quiet intervals passed.
func TestHeldIdleLimit(t *testing.T) {
	s := time.Second
	tests := []struct {
		name   string
		quiet  time.Duration
		probes []time.Duration // since the first
		now    time.Duration
		idle   bool
	}{
		{"one probe, within the floor", 0, []time.Duration{0}, 2 * s, false},
		{"one probe, past the floor", 0, []time.Duration{0}, 4 * s, true},
		{"a kick after a round: the quiet interval counts", 5 * s, []time.Duration{0, s / 10}, 10 * s, false},
		{"a kick after a round: three quiet intervals", 5 * s, []time.Duration{0, s / 10}, 16 * s, true},
		{"slower rounds than the quiet interval", 5 * s, []time.Duration{0, 20 * s}, 70 * s, false},
		{"slower rounds, three of them", 5 * s, []time.Duration{0, 20 * s}, 81 * s, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.idle, endpoint.HeldIdle(tc.quiet, tc.probes, tc.now))
		})
	}
}

// Every request Wakes its endpoint's held channel; while the endpoint is
// busy its PING loop already runs at the busy interval, so the wake is
// not sent: the loop's goroutine is not scheduled once per request.
func TestHeldWakeSkippedWhileBusy(t *testing.T) {
	pki := newPKI(t)
	s := newH2Server(t, pki.Cert)
	p := heldProber(t, pki, newReporter())
	var busy atomic.Bool
	busy.Store(true)
	p.Busy = func(string) bool { return busy.Load() }
	require.NoError(t, p.Probe(probeCtx(t, time.Second), s.addr))
	// The loop has started and found the endpoint busy.
	time.Sleep(300 * time.Millisecond)
	for i := range 200 {
		p.Wake(s.addr)
		require.False(t, endpoint.Woken(p, s.addr), "wake %d was sent to a loop that runs at the busy interval", i)
	}
	// Idle: the loop waits the idle interval (5s); a request makes the
	// endpoint busy and its wake brings the loop back to the busy
	// interval at once.
	busy.Store(false)
	time.Sleep(300 * time.Millisecond)
	require.False(t, endpoint.Awake(p, s.addr), "an idle loop must be woken")
	busy.Store(true)
	p.Wake(s.addr)
	assert.Eventually(t, func() bool { return endpoint.Awake(p, s.addr) }, time.Second, 5*time.Millisecond, "the wake did not reach the idle loop")
}
