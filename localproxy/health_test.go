package localproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/internal/testpki"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestHealthServer(t *testing.T) {
	echo := newEcho(t)
	pr := newProber()
	pr.set(echo.addr(), errors.New("not yet"))
	r := start(t, localproxy.Config{
		Endpoints:     []string{echo.addr()},
		Origin:        "api.test:6443",
		HealthAddress: "127.0.0.1:0",
		Pool:          upstream.Config{Prober: pr, Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1},
	})
	base := "http://" + r.HealthAddr().String()

	resp, body := httpGet(t, http.MethodGet, base+"/healthz")
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)

	require.Eventually(t, func() bool { return !r.Pool().Usable(echo.addr()) }, 10*time.Second, 5*time.Millisecond)
	resp, body = httpGet(t, http.MethodGet, base+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, body, "no healthy endpoint")
	resp, body = httpGet(t, http.MethodOptions, base+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "OPTIONS has GET's status")
	assert.Empty(t, body)

	pr.set(echo.addr(), nil)
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	resp, _ = httpGet(t, http.MethodGet, base+"/readyz")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, body = httpGet(t, http.MethodHead, base+"/readyz")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, body)

	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "x"))

	resp, body = httpGet(t, http.MethodGet, base+"/metrics")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	for _, name := range []string{
		"apifailover_localproxy_connections_accepted_total 1",
		"apifailover_localproxy_connections_active 1",
		"apifailover_localproxy_dial_duration_seconds_bucket",
		`apifailover_endpoint_state{endpoint="` + echo.addr() + `",state="healthy"} 1`,
	} {
		assert.Contains(t, body, name)
	}

	resp, body = httpGet(t, http.MethodGet, base+"/status")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var st localproxy.Status
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.Equal(t, "api.test:6443", st.Origin)
	assert.Equal(t, os.Getpid(), st.PID, "the process that answered")
	assert.True(t, st.Ready)
	require.Len(t, st.Upstreams, 1)
	assert.Equal(t, echo.addr(), st.Upstreams[0].Addr)
	assert.Equal(t, "healthy", st.Upstreams[0].State)
	assert.Equal(t, "static", st.Upstreams[0].Sources)
	assert.Equal(t, 1, st.Upstreams[0].Conns)
	assert.Contains(t, body, `"sources": "static"`)
	assert.Contains(t, body, `"state": "healthy"`)

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/healthz", "/readyz", "/metrics", "/status"} {
			resp, _ := httpGet(t, m, base+path)
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", m, path)
			assert.Equal(t, "GET, HEAD, OPTIONS", resp.Header.Get("Allow"))
		}
	}
	// OPTIONS (HAProxy's httpchk default, and what extractedprism
	// answered) gets GET's status, no body.
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/status"} {
		resp, body := httpGet(t, http.MethodOptions, base+path)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "OPTIONS %s", path)
		assert.Equal(t, "GET, HEAD, OPTIONS", resp.Header.Get("Allow"))
		assert.Empty(t, body, "OPTIONS %s", path)
	}
	resp, _ = httpGet(t, http.MethodGet, base+"/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = httpGet(t, http.MethodOptions, base+"/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	echo := newEcho(t)
	saved := newEcho(t)
	ca, otherCA := testpki.New(t).CAPEM, testpki.New(t).CAPEM
	fingerprints := localproxy.CAFingerprints(ca)
	require.Len(t, fingerprints, 1)
	write := func(origin string, cas []string, eps ...string) {
		b, err := json.Marshal(localproxy.StateFileData{Origin: origin, CAFingerprints: cas, Endpoints: eps})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	cfg := func() localproxy.Config {
		return localproxy.Config{Endpoints: []string{echo.addr()}, Origin: "api.test", StateFile: path, StateFileCA: ca}
	}

	t.Run("a state file needs a CA", func(t *testing.T) {
		c := cfg()
		c.StateFileCA = []byte("not PEM")
		_, err := localproxy.New(c)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "StateFileCA")
	})
	t.Run("other origin is ignored", func(t *testing.T) {
		write("other.test", fingerprints, saved.addr())
		r := start(t, cfg())
		assert.False(t, r.Pool().Has(saved.addr()))
	})
	// Every cluster's origin may be kubernetes.default.svc: the CA tells
	// them apart.
	t.Run("same origin, other cluster CA, is ignored", func(t *testing.T) {
		write("api.test", localproxy.CAFingerprints(otherCA), saved.addr())
		r := start(t, cfg())
		assert.False(t, r.Pool().Has(saved.addr()))
	})
	t.Run("a file bound to no CA is ignored", func(t *testing.T) {
		write("api.test", nil, saved.addr())
		r := start(t, cfg())
		assert.False(t, r.Pool().Has(saved.addr()))
	})
	t.Run("a CA bundle with the cluster CA among others is accepted", func(t *testing.T) {
		write("api.test", append(localproxy.CAFingerprints(otherCA), fingerprints...), saved.addr())
		r := start(t, cfg())
		assert.True(t, r.Pool().Has(saved.addr()))
	})
	t.Run("same origin and CA is loaded and rewritten", func(t *testing.T) {
		write("api.test", fingerprints, saved.addr())
		pr := newProber()
		pr.set(saved.addr(), errors.New("gone"))
		c := cfg()
		c.Pool = upstream.Config{Prober: pr, Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1}
		r := start(t, c)
		require.True(t, r.Pool().Has(saved.addr()))
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(path)
			if err != nil {
				return false
			}
			var d localproxy.StateFileData
			return json.Unmarshal(b, &d) == nil && d.Origin == "api.test" && slices.Equal(d.CAFingerprints, fingerprints) &&
				len(d.Endpoints) == 1 && d.Endpoints[0] == echo.addr()
		}, 10*time.Second, 10*time.Millisecond)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			assert.False(t, strings.HasPrefix(e.Name(), ".localproxy-state"), "temporary file left: %s", e.Name())
		}
	})
}

// getBody is httpGet for polling conditions: it reports errors instead of
// failing the test, as require.Eventually runs its condition on another
// goroutine.
func getBody(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// healthz polls /healthz for require.Eventually and keeps the last answer
// for the failure message (it is a fmt.Stringer, read when formatted).
type healthz struct {
	url  string
	mu   sync.Mutex // guards last
	last string
}

func newHealthz(r *running) *healthz {
	return &healthz{url: "http://" + r.HealthAddr().String() + "/healthz"}
}

// is returns a condition: /healthz answers code with a body containing
// substr.
func (h *healthz) is(code int, substr string) func() bool {
	return func() bool {
		got, body, err := getBody(h.url)
		last := fmt.Sprintf("%d %q", got, body)
		if err != nil {
			last = err.Error()
		}
		h.mu.Lock()
		h.last = last
		h.mu.Unlock()
		return err == nil && got == code && strings.Contains(body, substr)
	}
}

func (h *healthz) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// A listener closed under the proxy (its descriptor closed by someone
// else) ends its accept loop for good: /healthz fails and says so, while
// the other listener still serves.
func TestHealthzFailsWhenAnAcceptLoopDies(t *testing.T) {
	echo := newEcho(t)
	var lc net.ListenConfig
	var mu sync.Mutex // guards lns
	var lns []net.Listener
	r := start(t, localproxy.Config{
		Endpoints:       []string{echo.addr()},
		ListenAddresses: []string{"127.0.0.1:0", "127.0.0.1:0"},
		HealthAddress:   "127.0.0.1:0",
		Listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			ln, err := lc.Listen(ctx, network, address)
			if err == nil {
				mu.Lock()
				lns = append(lns, ln)
				mu.Unlock()
			}
			return ln, err
		},
	})
	hz := newHealthz(r)
	resp, body := httpGet(t, http.MethodGet, hz.url)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	mu.Lock()
	require.Len(t, lns, 2)
	require.NoError(t, lns[0].Close())
	mu.Unlock()
	require.Eventually(t, hz.is(http.StatusServiceUnavailable, "unhealthy: 1 of 2 accept loops running"),
		10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	require.NoError(t, roundTrip(dial(t, r.Addrs()[1].String()), "the other listener still serves"))
}

// stallingProber answers at once until stall is called; from then on its
// probes hang, ignoring their context, until release: a probe loop that
// is stuck.
type stallingProber struct {
	mu    sync.Mutex    // guards hang
	hang  chan struct{} // nil: answer at once
	calls atomic.Int64
}

func (s *stallingProber) Probe(ctx context.Context, addr string) error {
	s.calls.Add(1)
	s.mu.Lock()
	hang := s.hang
	s.mu.Unlock()
	if hang != nil {
		<-hang
	}
	return nil
}

func (s *stallingProber) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang == nil {
		s.hang = make(chan struct{})
	}
}

func (s *stallingProber) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang != nil {
		close(s.hang)
		s.hang = nil
	}
}

// /healthz fails once the pool's probes stop starting (a probe hangs, and
// with it the round), and recovers when they resume.
func TestHealthzFailsWhenProbesStop(t *testing.T) {
	echo := newEcho(t)
	pr := &stallingProber{}
	const interval = 50 * time.Millisecond
	r := start(t, localproxy.Config{
		Endpoints:     []string{echo.addr()},
		HealthAddress: "127.0.0.1:0",
		Pool:          upstream.Config{Prober: pr, Interval: interval, Timeout: 20 * time.Millisecond, Rise: 1, Fall: 1},
	})
	t.Cleanup(pr.release) // before the proxy stops: Run waits for the probe
	hz := newHealthz(r)
	require.Eventually(t, func() bool { return pr.calls.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, hz.is(http.StatusOK, "ok"), 10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)

	// Live, what systemd's watchdog is fed by, says the same.
	assert.NoError(t, r.Live())

	pr.stall()
	require.Eventually(t, hz.is(http.StatusServiceUnavailable, "unhealthy: no health probe for"),
		10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	assert.Contains(t, hz.String(), "(expected every "+interval.String()+"; liveness threshold 170ms)")
	if err := r.Live(); assert.Error(t, err) {
		assert.Contains(t, err.Error(), "no health probe for")
	}

	pr.release()
	require.Eventually(t, hz.is(http.StatusOK, "ok"), 10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	assert.NoError(t, r.Live())
}

// Live fails until Run has bound the listeners.
func TestLiveBeforeRun(t *testing.T) {
	p, err := localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:1"}, ListenAddresses: []string{"127.0.0.1:0"}})
	require.NoError(t, err)
	assert.EqualError(t, p.Live(), "not running yet: the listeners are not bound")
}

// A pool whose endpoints are all healthy and quiet probes every
// QuietInterval, not every Interval (the held prober's 5s against the
// 1s default): /healthz's default limit follows the longer one, or it
// fails for part of every quiet round and the node's liveness probe
// restarts a proxy that is fine.
func TestHealthzOKBetweenQuietRounds(t *testing.T) {
	echo := newEcho(t)
	pr := &stallingProber{}
	const (
		interval = 50 * time.Millisecond
		quiet    = 400 * time.Millisecond
	)
	r := start(t, localproxy.Config{
		Endpoints:     []string{echo.addr()},
		HealthAddress: "127.0.0.1:0",
		Pool:          upstream.Config{Prober: pr, Interval: interval, QuietInterval: quiet, Timeout: 20 * time.Millisecond, Rise: 1, Fall: 1},
	})
	hz := newHealthz(r)
	require.Eventually(t, hz.is(http.StatusOK, "ok"), 10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	// Three quiet rounds at least, sampled far more often than they come.
	for end := time.Now().Add(4 * quiet); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		require.NoError(t, r.Liveness(), "between quiet probe rounds")
	}
	require.Positive(t, pr.calls.Load())
}

// New refuses a LivenessThreshold that the probe loop's own pace passes:
// its longest wait between rounds, jitter included, and a probe's
// timeout.
func TestNewRefusesALivenessThresholdWithinARound(t *testing.T) {
	pool := upstream.Config{Prober: &stallingProber{}, Interval: 50 * time.Millisecond, QuietInterval: 400 * time.Millisecond, Timeout: 20 * time.Millisecond, Jitter: 0.1}
	for _, tc := range []struct {
		threshold time.Duration
		ok        bool
	}{{460 * time.Millisecond, false}, {461 * time.Millisecond, true}, {-1, true}} {
		_, err := localproxy.New(localproxy.Config{Endpoints: []string{"127.0.0.1:1"}, LivenessThreshold: tc.threshold, Pool: pool})
		if tc.ok {
			assert.NoError(t, err, "LivenessThreshold %v", tc.threshold)
			continue
		}
		var lt *localproxy.LivenessThresholdError
		require.ErrorAs(t, err, &lt, "LivenessThreshold %v", tc.threshold)
		assert.Equal(t, 460*time.Millisecond, lt.Least)
		assert.EqualError(t, err, "localproxy: LivenessThreshold 460ms: want more than 460ms (the health-check loop starts a round every 400ms ±10% while every API server is healthy, every 50ms otherwise, and a probe may take 20ms)")
	}
}

// LivenessThreshold (extractedprism's --liveness-threshold) sets how long
// the probe loop may be silent.
func TestHealthzLivenessThreshold(t *testing.T) {
	echo := newEcho(t)
	pr := &stallingProber{}
	r := start(t, localproxy.Config{
		Endpoints:         []string{echo.addr()},
		HealthAddress:     "127.0.0.1:0",
		LivenessThreshold: 300 * time.Millisecond,
		Pool:              upstream.Config{Prober: pr, Interval: 50 * time.Millisecond, Timeout: 20 * time.Millisecond, Rise: 1, Fall: 1},
	})
	t.Cleanup(pr.release)
	hz := newHealthz(r)
	require.Eventually(t, func() bool { return pr.calls.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	pr.stall()
	require.Eventually(t, hz.is(http.StatusServiceUnavailable, "unhealthy: no health probe for"),
		10*time.Second, 5*time.Millisecond, "last /healthz: %v", hz)
	assert.Contains(t, hz.String(), "liveness threshold 300ms)")
}

// While every endpoint is quarantined the probe loop waits for their
// re-probes (QuarantineBackoff) and starts no probe for longer than
// /healthz's limit; the loop still runs, so /healthz stays ok (only
// /readyz fails).
func TestHealthzOKWhileEveryEndpointIsQuarantined(t *testing.T) {
	echo := newEcho(t)
	var calls atomic.Int64
	pr := upstream.ProberFunc(func(ctx context.Context, addr string) error {
		calls.Add(1)
		return fmt.Errorf("tls: %w", upstream.ErrCertificate)
	})
	const interval = 300 * time.Millisecond
	r := start(t, localproxy.Config{
		Endpoints:     []string{echo.addr()},
		HealthAddress: "127.0.0.1:0",
		Pool: upstream.Config{Prober: pr, Interval: interval, Timeout: 100 * time.Millisecond,
			QuarantineBackoff: time.Minute},
	})
	require.Eventually(t, func() bool { return calls.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	hz := newHealthz(r)
	rz := &healthz{url: "http://" + r.HealthAddr().String() + "/readyz"}
	require.Eventually(t, rz.is(http.StatusServiceUnavailable, "no healthy endpoint"), 10*time.Second, 5*time.Millisecond, "last /readyz: %v", rz)
	// /healthz fails 3 intervals + the timeout (1s) after the last probe
	// round; watch it for three times that.
	assert.Never(t, func() bool { return !hz.is(http.StatusOK, "ok")() }, 3*time.Second, 20*time.Millisecond, "last /healthz: %v", hz)
	assert.Equal(t, int64(1), calls.Load(), "the quarantined endpoint waits for its re-probe")
}
