package transport_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
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
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == addr {
					n++
				}
			}
		}
	}
	return n
}

// The per-endpoint series of an endpoint go with it: discovery churn must
// not grow the metrics without bound.
func TestMetricsForgetRemovedEndpoints(t *testing.T) {
	c := newCluster(t, 2)
	reg := prometheus.NewPedanticRegistry()
	f, err := transport.Wrap(t.Context(), c.config(), transport.Options{DisableDiscovery: true, Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })

	gone := c.servers[1].addr
	require.NoError(t, f.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: gone}}))
	// A request dials one of the two; once that one is gone, the next
	// request dials the other.
	get := func() error {
		resp, err := f.HTTPClient().Get("https://" + f.Origin() + "/version")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, get())
	first, second := c.servers[0], c.servers[1]
	if seriesOf(t, reg, "apifailover_dial_duration_seconds", first.addr) == 0 {
		first, second = second, first
	}
	require.Equal(t, 1, seriesOf(t, reg, "apifailover_dial_duration_seconds", first.addr))
	first.kill()
	require.Eventually(t, func() bool {
		return get() == nil && seriesOf(t, reg, "apifailover_dial_duration_seconds", second.addr) == 1
	}, 10*time.Second, 10*time.Millisecond, "no dial to the other endpoint")

	require.NoError(t, f.Pool().Set(upstream.SourceDiscovery, nil))
	require.False(t, f.Pool().Has(gone))
	assert.Eventually(t, func() bool {
		return seriesOf(t, reg, "apifailover_dial_duration_seconds", gone) == 0
	}, 10*time.Second, 10*time.Millisecond, "the removed endpoint's series stay")
	assert.Equal(t, 1, seriesOf(t, reg, "apifailover_dial_duration_seconds", f.Origin()), "the others stay")
}
