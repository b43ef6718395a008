package localproxy_test

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// seriesOf counts the series of the metric family name with the label
// endpoint=addr.
func seriesOf(t *testing.T, g prometheus.Gatherer, name, addr string) int {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, "endpoint", addr) {
				n++
			}
		}
	}
	return n
}

// The per-endpoint series of an endpoint go with it: discovery churn must
// not grow the metrics without bound.
func TestMetricsForgetRemovedEndpoints(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := dead.Addr().String()
	dead.Close() // connections are refused
	echo := newEcho(t)
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}})
	require.NoError(t, r.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: gone}}))
	require.Equal(t, gone, r.Pool().Candidates()[0])
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "dials the discovered endpoint, then the static one"))
	families := []string{"apifailover_localproxy_dials_total", "apifailover_localproxy_dial_duration_seconds"}
	for _, name := range families {
		require.Equal(t, 1, seriesOf(t, r.reg, name, gone), name)
		require.Equal(t, 1, seriesOf(t, r.reg, name, echo.addr()), name)
	}

	require.NoError(t, r.Pool().Set(upstream.SourceDiscovery, nil))
	for _, name := range families {
		assert.Eventually(t, func() bool { return seriesOf(t, r.reg, name, gone) == 0 },
			10*time.Second, 10*time.Millisecond, "%s: the removed endpoint's series stay", name)
		assert.Equal(t, 1, seriesOf(t, r.reg, name, echo.addr()), "%s: the others stay", name)
	}
}
