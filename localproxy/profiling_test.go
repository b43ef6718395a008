package localproxy_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// With Profiling the health server serves Go's pprof handlers under
// /debug/pprof/, and a CPU profile may run longer than the health
// server's write timeout (10s); without it they are not found.
func TestProfiling(t *testing.T) {
	echo := newEcho(t)
	cfg := func(profiling bool) localproxy.Config {
		return localproxy.Config{
			Endpoints:     []string{echo.addr()},
			HealthAddress: "127.0.0.1:0",
			Profiling:     profiling,
			Pool:          upstream.Config{Prober: newProber(), Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1},
		}
	}
	off := start(t, cfg(false))
	resp, _ := httpGet(t, http.MethodGet, "http://"+off.HealthAddr().String()+"/debug/pprof/")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "pprof without Profiling")

	on := start(t, cfg(true))
	base := "http://" + on.HealthAddr().String()
	resp, body := httpGet(t, http.MethodGet, base+"/debug/pprof/")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "goroutine")
	resp, body = httpGet(t, http.MethodGet, base+"/debug/pprof/heap?debug=1")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "heap profile")
	resp, body = httpGet(t, http.MethodGet, base+"/debug/pprof/goroutine?debug=1")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	if testing.Short() {
		t.Skip("a CPU profile longer than the write timeout takes 11s")
	}
	c := &http.Client{Timeout: 30 * time.Second}
	r, err := c.Get(base + "/debug/pprof/profile?seconds=11")
	require.NoError(t, err)
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.StatusCode, "%s", b)
	assert.Greater(t, len(b), 50, "a gzipped profile")
	assert.Equal(t, []byte{0x1f, 0x8b}, b[:2], "gzip")
}
