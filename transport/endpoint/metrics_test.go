package endpoint_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// A SeriesCache hands out an endpoint's series while it is in the pool,
// and new ones once it left and came back: an update after that lands in
// an exported series, not in one deleted with the endpoint. An update for
// an endpoint not in the pool leaves no series. With Gets racing the
// endpoint's comings and goings, the cache ends holding no deleted series.
func TestSeriesCacheFollowsThePool(t *testing.T) {
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	p, err := upstream.New(upstream.Config{IsLocal: func(string) bool { return false }})
	require.NoError(t, err)
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dials_total", Help: "Dials."}, []string{"endpoint", "result"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(vec)
	s := endpoint.NewEndpointSeries(p, vec.MetricVec)
	t.Cleanup(s.Close)
	var made atomic.Int32
	var during func() // run by mk once its series are made
	c := endpoint.NewSeriesCache(s, func(addr, result string) prometheus.Counter {
		made.Add(1)
		ctr := vec.WithLabelValues(addr, result)
		if during != nil {
			during()
			during = nil
		}
		return ctr
	})
	set := func(addrs ...string) {
		var specs []upstream.Spec
		for _, x := range addrs {
			specs = append(specs, upstream.Spec{Addr: x})
		}
		require.NoError(t, p.Set(upstream.SourceDiscovery, specs))
	}
	// series is the exported series: value by endpoint and result.
	series := func() map[[2]string]float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		out := map[[2]string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var k [2]string
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" {
						k[0] = l.GetValue()
					} else {
						k[1] = l.GetValue()
					}
				}
				out[k] = m.GetCounter().GetValue()
			}
		}
		return out
	}

	set(a)
	c.Get(a, "ok").Inc()
	c.Get(a, "ok").Inc()
	assert.Equal(t, int32(1), made.Load(), "the series were looked up again")
	assert.Equal(t, map[[2]string]float64{{a, "ok"}: 2}, series())

	set()
	require.Empty(t, series(), "the removed endpoint's series stay")
	set(a)
	c.Get(a, "ok").Inc()
	assert.Equal(t, map[[2]string]float64{{a, "ok"}: 1}, series(), "the endpoint back: its update went to a deleted series")

	c.Get(b, "ok").Inc()
	assert.Equal(t, map[[2]string]float64{{a, "ok"}: 1}, series(), "a series of an endpoint not in the pool")

	// Removed and back while a Get made its series: that Get's update
	// may be lost with the series deleted, the next ones are not.
	during = func() { set(); set(a) }
	c.Get(a, "slow").Inc()
	for range 4 {
		c.Get(a, "slow").Inc()
	}
	assert.Equal(t, 4.0, series()[[2]string{a, "slow"}], "the cache kept the series deleted while it was made")

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 500 {
				c.Get(a, "error").Inc()
			}
		})
	}
	for i := range 200 {
		if i%2 == 0 {
			set()
		} else {
			set(a)
		}
	}
	wg.Wait()
	set(a)
	before := series()[[2]string{a, "error"}]
	c.Get(a, "error").Inc()
	assert.Equal(t, before+1, series()[[2]string{a, "error"}], "the cache kept a deleted series")
}
