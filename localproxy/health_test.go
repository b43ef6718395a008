package localproxy_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	assert.True(t, st.Ready)
	require.Len(t, st.Upstreams, 1)
	assert.Equal(t, echo.addr(), st.Upstreams[0].Addr)
	assert.Equal(t, "healthy", st.Upstreams[0].State)
	assert.Equal(t, "static", st.Upstreams[0].Sources)
	assert.Equal(t, 1, st.Upstreams[0].Conns)
	assert.Contains(t, body, `"sources": "static"`)
	assert.Contains(t, body, `"state": "healthy"`)

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		for _, path := range []string{"/healthz", "/readyz", "/metrics", "/status"} {
			resp, _ := httpGet(t, m, base+path)
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", m, path)
			assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
		}
	}
	resp, _ = httpGet(t, http.MethodGet, base+"/nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	echo := newEcho(t)
	saved := newEcho(t)
	write := func(origin string, eps ...string) {
		b, err := json.Marshal(localproxy.StateFileData{Origin: origin, Endpoints: eps})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}

	t.Run("other origin is ignored", func(t *testing.T) {
		write("other.test", saved.addr())
		r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, Origin: "api.test", StateFile: path})
		assert.False(t, r.Pool().Has(saved.addr()))
	})
	t.Run("same origin is loaded and rewritten", func(t *testing.T) {
		write("api.test", saved.addr())
		pr := newProber()
		pr.set(saved.addr(), errors.New("gone"))
		r := start(t, localproxy.Config{
			Endpoints: []string{echo.addr()}, Origin: "api.test", StateFile: path,
			Pool: upstream.Config{Prober: pr, Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1},
		})
		require.True(t, r.Pool().Has(saved.addr()))
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(path)
			if err != nil {
				return false
			}
			var d localproxy.StateFileData
			return json.Unmarshal(b, &d) == nil && d.Origin == "api.test" &&
				len(d.Endpoints) == 1 && d.Endpoints[0] == echo.addr()
		}, 10*time.Second, 10*time.Millisecond)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			assert.False(t, strings.HasPrefix(e.Name(), ".localproxy-state"), "temporary file left: %s", e.Name())
		}
	})
}
