package transport

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// metrics holds the transport's collectors. A nil *metrics records nothing.
type metrics struct {
	dialDuration *prometheus.HistogramVec
	failovers    *prometheus.CounterVec
	endpoints    *endpoint.EndpointSeries // of dialDuration
	// dials are dialDuration's series, by endpoint and result.
	dials *endpoint.SeriesCache[prometheus.Observer]
}

// newMetrics registers the transport's collectors and the pool's endpoint
// gauges on reg. A nil reg disables metrics.
func newMetrics(reg prometheus.Registerer, pool *upstream.Pool) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		dialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "apifailover",
			Name:      "dial_duration_seconds",
			Help:      "Duration of connection attempts to API server endpoints (TCP connect and TLS handshake), by endpoint and result.",
			Buckets:   endpoint.DialBuckets,
		}, []string{"endpoint", "result"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "apifailover",
			Name:      "failovers_total",
			Help:      "Times traffic moved away from an endpoint, by reason: dial (the first candidate did not connect), retry (a request was sent again to another endpoint), endpoint_down and endpoint_removed (connections closed).",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.dialDuration, m.failovers, endpoint.NewPoolCollector(pool)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The subscription lives as long as the pool: both belong to one
	// Failover.
	m.endpoints = endpoint.NewEndpointSeries(pool, m.dialDuration.MetricVec)
	m.dials = endpoint.NewSeriesCache(m.endpoints, func(addr, result string) prometheus.Observer {
		return m.dialDuration.WithLabelValues(addr, result)
	})
	return m, nil
}

func (m *metrics) observeDial(addr string, d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.dials.Get(addr, result).Observe(d.Seconds())
}

func (m *metrics) failover(reason string) {
	if m == nil {
		return
	}
	m.failovers.WithLabelValues(reason).Inc()
}
