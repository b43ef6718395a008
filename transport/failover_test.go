package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// wrap starts a Failover over the cluster's servers with discovery off.
func wrap(t *testing.T, c *cluster, opts transport.Options) *transport.Failover {
	t.Helper()
	opts.DisableDiscovery = true
	if opts.Endpoints == nil {
		opts.Endpoints = c.addrs()
	}
	f, err := transport.Wrap(t.Context(), c.config(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	waitHealthy(t, f, len(c.servers))
	return f
}

// waitHealthy waits until n endpoints are healthy.
func waitHealthy(t *testing.T, f *transport.Failover, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		healthy := 0
		for _, s := range f.Pool().Status() {
			if s.State == upstream.StateHealthy {
				healthy++
			}
		}
		return healthy >= n
	}, 10*time.Second, 10*time.Millisecond, "endpoints never became healthy: %+v", f.Pool().Status())
}

// get sends GET path and returns the name of the server that answered.
func get(t *testing.T, f *transport.Failover, path string) (string, error) {
	t.Helper()
	return getCtx(t.Context(), t, f, path)
}

// getCtx is get with a context of the caller's.
func getCtx(ctx context.Context, t *testing.T, f *transport.Failover, path string) (string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+f.Origin()+path, nil)
	require.NoError(t, err)
	resp, err := f.HTTPClient().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", &statusError{resp.StatusCode, string(b)}
	}
	return string(b), err
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return http.StatusText(e.code) + ": " + e.body }

func mustGet(t *testing.T, f *transport.Failover, path string) string {
	t.Helper()
	name, err := get(t, f, path)
	require.NoError(t, err)
	return name
}

// serving returns the server that answers requests now.
func serving(t *testing.T, c *cluster, f *transport.Failover) *server {
	t.Helper()
	name := mustGet(t, f, "/api")
	for _, s := range c.servers {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("unknown server %q", name)
	return nil
}

// hourTimers makes every timer a request could wait on an hour long: the
// probe round (after the first), the stagger before the next candidate, a
// connection attempt, a whole dial. A request that still succeeds within the
// test's deadline did not wait on any of them: it moved on a connection
// error or a lost HTTP/2 ping.
func hourTimers(o transport.Options) transport.Options {
	o.ProbeInterval = time.Hour
	o.ProbeTimeout = 10 * time.Second // the first round must still finish
	o.StaggerDelay = time.Hour
	o.AttemptTimeout = time.Hour
	o.DialTimeout = time.Hour
	return o
}

// Failover after a closed server is immediate: driven by the refused
// connection, not by probes or timers (see hourTimers). How fast it is on
// real apiservers is measured by make bench and the e2e suite.
func TestFailoverWhenServingServerCloses(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, hourTimers(transport.Options{}))
	victim := serving(t, c, f)
	victim.kill()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	name, err := getCtx(ctx, t, f, "/api")
	require.NoError(t, err)
	assert.NotEqual(t, victim.name, name)
	t.Logf("request after the serving server closed answered by %s in %v", name, time.Since(start))
	// Later requests stay on the survivor.
	for range 5 {
		assert.Equal(t, name, mustGet(t, f, "/api"))
	}
}

// A request sent as its server hangs moves on when the connection's HTTP/2
// ping goes unanswered (1s + 1s), not when a probe notices (probes and
// every other timer are an hour away, see hourTimers).
func TestFailoverWhenServingServerHangs(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, hourTimers(transport.Options{PingInterval: time.Second, PingTimeout: time.Second}))
	victim := serving(t, c, f)
	victim.ln.freeze()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	name, err := getCtx(ctx, t, f, "/api")
	require.NoError(t, err)
	assert.NotEqual(t, victim.name, name)
	t.Logf("request sent as the serving server hung answered by %s in %v", name, time.Since(start))

	// New requests do not wait for the hung server.
	start = time.Now()
	for range 5 {
		assert.NotEqual(t, victim.name, mustGet(t, f, "/api"))
	}
	t.Logf("5 more requests in %v", time.Since(start))
	// The lost connection ranked it out at once, no probe needed (probes
	// failing on a hung server: TestProbeTimeoutAfterHandshakeIsReadyzError;
	// failed probes making it unhealthy: upstream TestRunStateMachine).
	assert.NotEqual(t, victim.addr, f.Pool().Candidates()[0])
	for _, s := range f.Pool().Status() {
		if s.Addr == victim.addr {
			assert.True(t, s.Suspect || s.State == upstream.StateUnhealthy, "hung server: %+v", s)
		}
	}
}

func TestPOSTNotReplayedWhenServerDiesAfterReceivingIt(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	victim := serving(t, c, f)
	received := make(chan struct{})
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		close(received)
		<-r.Context().Done() // dies before answering
	})
	go func() {
		<-received
		victim.kill()
	}()

	body := []byte(`{"metadata":{"generateName":"x-"}}`)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader(body))
	require.NoError(t, err)
	require.NotNil(t, req.GetBody, "the body is replayable, so only the method keeps it from being retried")
	resp, err := f.HTTPClient().Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err, "the caller must see the failure")
	t.Logf("POST error: %v", err)

	const key = "POST /api/v1/namespaces/default/configmaps"
	assert.Equal(t, 1, victim.count(key))
	total := 0
	for _, s := range c.servers {
		total += s.count(key)
	}
	assert.Equal(t, 1, total, "the POST was sent again to another server")
}

func TestIdempotentGETRetriedWhenServerDiesMidRequest(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	victim := serving(t, c, f)
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		go victim.kill()
		<-r.Context().Done()
	})
	name := mustGet(t, f, "/api/v1/pods")
	assert.NotEqual(t, victim.name, name)
	assert.Equal(t, 1, victim.count("GET /api/v1/pods"))
}

func TestEndpointGoingDownClosesItsStreams(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	victim := serving(t, c, f)
	started := make(chan struct{})
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done() // a watch that never ends by itself
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+f.Origin()+"/api/v1/pods?watch=1", nil)
	require.NoError(t, err)
	resp, err := f.HTTPClient().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	<-started

	// The endpoint stops answering connections (Fall failures in a row).
	for range 2 {
		f.Pool().ReportFailure(victim.addr, upstream.FailureDial, errors.New("connection refused"))
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err, "the stream must be cut, not end cleanly")
	case <-time.After(10 * time.Second):
		t.Fatal("the watch on the endpoint that went down was not closed")
	}
	assert.Zero(t, f.OpenConns()[victim.addr])
	assert.NotEqual(t, victim.name, mustGet(t, f, "/api"))
}

func TestNotReadyEndpointDrains(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{ProbeReadyzInterval: 100 * time.Millisecond})
	victim := serving(t, c, f)
	release := make(chan struct{})
	started := make(chan struct{})
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		close(started)
		<-release // a create the server is still working on
		io.WriteString(w, "created")
	})
	body := []byte(`{"metadata":{"generateName":"x-"}}`)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader(body))
	require.NoError(t, err)
	type result struct {
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := f.HTTPClient().Do(req)
		if err != nil {
			res <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		res <- result{string(b), err}
	}()
	<-started

	victim.notReady.Store(true) // /readyz fails: a graceful shutdown begins
	require.Eventually(t, func() bool {
		for _, s := range f.Pool().Status() {
			if s.Addr == victim.addr {
				return s.State == upstream.StateUnhealthy
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	assert.NotEqual(t, victim.name, mustGet(t, f, "/api"), "new requests go elsewhere")
	close(release)
	r := <-res
	require.NoError(t, r.err, "the running create must finish, not be cut")
	assert.Equal(t, "created", r.body)
	require.Eventually(t, func() bool { return f.OpenConns()[victim.addr] == 0 }, 5*time.Second, 10*time.Millisecond,
		"the drained connection closes once idle")
}

// A stream (a watch) on a connection drained because its server failed
// /readyz is cut at the drain deadline, unless the server is healthy again
// by then: a moment of failing /readyz on every server (an etcd hiccup) must
// not cost every client its watches. A stream kept that way gets a deadline
// again when its server is drained again, or leaves the pool while healthy
// (a graceful removal).
func TestDrainedStreamCutUnlessServerRecovers(t *testing.T) {
	const drain = 2 * time.Second
	for _, tc := range []struct {
		name     string
		recovers bool
		// then, if set, happens after the recovery and starts a new drain.
		then func(t *testing.T, c *cluster, f *transport.Failover, victim *server)
	}{
		{name: "no recovery"},
		{name: "recovers", recovers: true},
		{name: "recovers, then fails again", recovers: true, then: func(t *testing.T, c *cluster, f *transport.Failover, victim *server) {
			victim.notReady.Store(true)
			require.Eventually(t, func() bool { return !f.Pool().Usable(victim.addr) }, 5*time.Second, 5*time.Millisecond)
		}},
		{name: "recovers, then is removed", recovers: true, then: func(t *testing.T, c *cluster, f *transport.Failover, victim *server) {
			var keep []upstream.Spec
			for _, s := range c.servers {
				if s != victim {
					keep = append(keep, upstream.Spec{Addr: s.addr})
				}
			}
			require.NoError(t, f.Pool().Set(upstream.SourceStatic, keep))
			require.False(t, f.Pool().Has(victim.addr), "still in the pool: %v", f.Pool().Sources(victim.addr))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2)
			// Probe timeouts long enough that a slow handshake on a busy
			// machine does not count as a hung server (which is cut).
			f := wrap(t, c, transport.Options{ProbeInterval: 300 * time.Millisecond, Rise: 1, Fall: 1, GracefulDrainTimeout: drain, ProbeReadyzInterval: 100 * time.Millisecond})
			victim := serving(t, c, f)
			release := make(chan struct{})
			victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-release:
						io.WriteString(w, "end\n")
						return
					case <-r.Context().Done():
						return
					case <-tick.C:
						io.WriteString(w, "event\n")
						w.(http.Flusher).Flush()
					}
				}
			})
			resp, err := f.HTTPClient().Get("https://" + f.Origin() + "/api/v1/configmaps?watch=1")
			require.NoError(t, err)
			defer resp.Body.Close()
			lines := make(chan string, 10000)
			done := make(chan error, 1)
			go func() {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					lines <- sc.Text()
				}
				done <- sc.Err()
			}()
			<-lines

			victim.notReady.Store(true)
			require.Eventually(t, func() bool { return !f.Pool().Usable(victim.addr) }, 5*time.Second, 5*time.Millisecond)
			drainedAt := time.Now()
			if tc.recovers {
				victim.notReady.Store(false)
				require.Eventually(t, func() bool { return f.Pool().Usable(victim.addr) }, 5*time.Second, 5*time.Millisecond)
				require.Less(t, time.Since(drainedAt), drain, "recovered after the drain deadline: nothing is tested")
			}
			cut := !tc.recovers
			if tc.then != nil {
				select {
				case err := <-done:
					t.Fatalf("the stream was cut before its server was drained again: %v", err)
				case <-time.After(drain):
				}
				tc.then(t, c, f, victim)
				drainedAt, cut = time.Now(), true
			}
			select {
			case err := <-done:
				if !cut {
					t.Fatalf("the stream was cut although its server recovered: %v", err)
				}
				require.Error(t, err, "the stream must be cut, not end cleanly")
				assert.GreaterOrEqual(t, time.Since(drainedAt), drain-100*time.Millisecond, "cut before the drain deadline")
				assert.Zero(t, f.OpenConns()[victim.addr])
			case <-time.After(drain + time.Second):
				if cut {
					t.Fatalf("the stream on the drained connection was not cut at the deadline; open connections %v", f.OpenConns())
				}
				close(release)
				require.NoError(t, <-done, "the stream ends as the server ends it")
			}
		})
	}
}

// When every server fails /readyz (etcd unavailable) a drained stream is
// not cut at the deadline: there is nowhere better to go. Once another
// server is healthy again, it is.
func TestDrainedStreamKeptWhileNoServerIsHealthy(t *testing.T) {
	const drain = 1 * time.Second
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{ProbeInterval: 300 * time.Millisecond, Rise: 1, Fall: 1, GracefulDrainTimeout: drain, ProbeReadyzInterval: 100 * time.Millisecond})
	victim := serving(t, c, f)
	var other *server
	for _, s := range c.servers {
		if s != victim {
			other = s
		}
	}
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				io.WriteString(w, "event\n")
				w.(http.Flusher).Flush()
			}
		}
	})
	resp, err := f.HTTPClient().Get("https://" + f.Origin() + "/api/v1/configmaps?watch=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
		done <- sc.Err()
	}()

	for _, s := range c.servers {
		s.notReady.Store(true)
	}
	require.Eventually(t, func() bool { return !f.Pool().Healthy() }, 5*time.Second, 5*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the stream was cut although no server was healthy: %v", err)
	case <-time.After(drain + 2*time.Second):
	}

	other.notReady.Store(false)
	require.Eventually(t, func() bool { return f.Pool().Usable(other.addr) }, 5*time.Second, 5*time.Millisecond)
	select {
	case err := <-done:
		require.Error(t, err, "the stream must be cut, not end cleanly")
	case <-time.After(5 * time.Second):
		t.Fatal("the drained stream was not cut once another server was healthy")
	}
}

func TestAPFTooManyRequestsIsNotFailover(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	victim := serving(t, c, f)
	victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("X-Kubernetes-PF-FlowSchema-UID", "fs")
		w.Header().Set("X-Kubernetes-PF-PriorityLevel-UID", "pl")
		http.Error(w, "Too many requests", http.StatusTooManyRequests)
	})
	_, err := get(t, f, "/api/v1/pods")
	var se *statusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusTooManyRequests, se.code)
	assert.Equal(t, 1, victim.count("GET /api/v1/pods"))
}

func TestCertificateForAnotherNameIsQuarantined(t *testing.T) {
	c := newCluster(t, 2)
	impostor := newServer(t, "impostor", c.pki.Wrong)
	opts := transport.Options{Endpoints: []string{impostor.addr}}
	opts.DisableDiscovery = true
	f, err := transport.Wrap(t.Context(), c.config(), opts)
	require.NoError(t, err)
	defer f.Close()
	require.Eventually(t, func() bool {
		for _, s := range f.Pool().Status() {
			if s.Addr == impostor.addr {
				return s.State == upstream.StateQuarantined
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	for range 10 {
		mustGet(t, f, "/api")
	}
	assert.Zero(t, impostor.count("GET /api"), "no request may reach a server with the wrong certificate")
}

func TestRequestsForOtherHostsPassThrough(t *testing.T) {
	c := newCluster(t, 1)
	f := wrap(t, c, transport.Options{})
	other := httptestTLS(t)
	_, err := f.HTTPClient().Get(other)
	// client-go's own transport, which does not trust the other server's
	// self-signed certificate: the request went there, not to the pool.
	require.Error(t, err)
	assert.Contains(t, err.Error(), "certificate")
	assert.Zero(t, c.servers[0].count("GET /"))
}

func TestCloseStopsEverything(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	mustGet(t, f, "/api")
	require.NoError(t, f.Close())
	_, err := get(t, f, "/api")
	require.Error(t, err)
	assert.Empty(t, f.OpenConns())
	require.NoError(t, f.Close(), "Close twice")
}

func TestWrapRejectsBadInput(t *testing.T) {
	c := newCluster(t, 1)
	for _, tc := range []struct {
		name string
		mut  func(o *transport.Options, host *string)
		want string
	}{
		{"http origin", func(o *transport.Options, h *string) { *h = "http://" + c.servers[0].addr }, "needs https"},
		{"bad endpoint", func(o *transport.Options, h *string) { o.Endpoints = []string{"10.0.0.1:99999"} }, `"10.0.0.1:99999"`},
		{"bad probe", func(o *transport.Options, h *string) { o.Probe = "icmp" }, `"icmp"`},
		{"timeout above interval", func(o *transport.Options, h *string) {
			o.ProbeInterval, o.ProbeTimeout = time.Second, 2*time.Second
		}, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := c.config()
			opts := transport.Options{DisableDiscovery: true}
			tc.mut(&opts, &cfg.Host)
			_, err := transport.Wrap(context.Background(), cfg, opts)
			require.Error(t, err)
			assert.True(t, strings.Contains(err.Error(), tc.want), "error %q does not mention %q", err, tc.want)
		})
	}
}

// With held probes (the default) the request connections are pinged after
// 5s without a frame, not every second: the held connections watch the
// servers. Other probe modes keep 1s; an explicit PingInterval wins. The
// pool's rounds slow down to 5s while everything is healthy with held
// probes only.
func TestRequestPingInterval(t *testing.T) {
	c := newCluster(t, 1)
	for _, tc := range []struct {
		opts transport.Options
		want time.Duration
	}{
		{transport.Options{}, transport.DefaultPingIntervalHeld},
		{transport.Options{Probe: endpoint.ProbeReadyz}, transport.DefaultPingInterval},
		{transport.Options{PingInterval: 3 * time.Second}, 3 * time.Second},
	} {
		f := wrap(t, c, tc.opts)
		assert.Equal(t, tc.want, transport.RequestPingInterval(f), "probe %q", tc.opts.Probe)
		if tc.opts.Probe == endpoint.ProbeReadyz {
			assert.Zero(t, f.Pool().Config().QuietInterval, "readyz probes: every round checks")
		} else {
			assert.Equal(t, endpoint.DefaultQuietInterval, f.Pool().Config().QuietInterval, "held probes report between rounds")
		}
	}
	assert.Equal(t, 5*time.Second, transport.DefaultPingIntervalHeld)
}

// A retry may join a dial another request started for the endpoint it
// ranks first; when that dial's race went to the endpoint the retry
// excludes (it failed or refused the request a moment ago), the retry
// dials again rather than go back to it.
func TestRetryDoesNotJoinADialWonByAnExcludedEndpoint(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{})
	x := serving(t, c, f) // an open connection to x
	var y *server
	for _, s := range c.servers {
		if s != x {
			y = s
			break
		}
	}
	exclude := map[string]bool{x.addr: true}
	for range 3 {
		got, err := transport.GetJoiningADial(t.Context(), f, y.addr, x.addr, exclude)
		require.NoError(t, err)
		assert.NotEqual(t, x.addr, got, "got a connection to the excluded endpoint")
	}
}
