package localproxy

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// metrics holds the proxy's collectors.
type metrics struct {
	accepted     prometheus.Counter
	active       prometheus.Gauge
	rejected     *prometheus.CounterVec
	acceptErrors prometheus.Counter
	dials        *prometheus.CounterVec
	dialDuration *prometheus.HistogramVec
	failovers    *prometheus.CounterVec
	closed       *prometheus.CounterVec
	bytes        *prometheus.CounterVec
	silent       prometheus.Counter
	failback     *prometheus.CounterVec
	// healthActive and healthRejected count the health server's
	// connections.
	healthActive   prometheus.Gauge
	healthRejected prometheus.Counter
	healthEvicted  prometheus.Counter
	// zone has one series: the proxy's own zone and where it came from.
	zone      *prometheus.GaugeVec
	endpoints *endpoint.EndpointSeries // of dials and dialDuration
	// dialSeries are each endpoint's dials and dialDuration series, by
	// result.
	dialSeries *endpoint.SeriesCache[dialSeries]
}

// dialSeries are the series of dials to one endpoint with one result.
type dialSeries struct {
	n prometheus.Counter
	d prometheus.Observer
}

// newMetrics registers the proxy's collectors and the pool's endpoint
// gauges (endpoint.NewPoolCollector) on reg.
func newMetrics(reg prometheus.Registerer, pool *upstream.Pool) (*metrics, error) {
	const ns, sub = "apifailover", "localproxy"
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connections_accepted_total",
			Help: "Client connections accepted.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "connections_active",
			Help: "Client connections open now.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connections_rejected_total",
			Help: "Client connections closed without being proxied, by reason: max_connections (the limit was reached), no_endpoint (no endpoint accepted the connection), holdoff (every endpoint refused within the last 250ms, so no dial was tried), local_resources (this host had no descriptor or memory for the connection to an API server; accepting backs off).",
		}, []string{"reason"}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "accept_errors_total",
			Help: "Failed accepts (e.g. out of file descriptors); each is followed by a backoff.",
		}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "dials_total",
			Help: "Connection attempts to API server endpoints, by endpoint and result (ok, error).",
		}, []string{"endpoint", "result"}),
		dialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "dial_duration_seconds",
			Help:    "Duration of connection attempts to API server endpoints, by endpoint and result.",
			Buckets: endpoint.DialBuckets,
		}, []string{"endpoint", "result"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "failovers_total",
			Help: "Client connections moved away from an endpoint, by reason: dial (the first candidate did not connect, another did), endpoint_down and endpoint_removed (connections closed or drained).",
		}, []string{"reason"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connections_closed_by_proxy_total",
			Help: "Client connections the proxy closed on its own, by reason: idle.",
		}, []string{"reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bytes_total",
			Help: "Bytes proxied, by direction: in (client to API server), out (API server to client). Counted every 256 KiB and at the end of a connection.",
		}, []string{"direction"}),
		silent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "silent_upstream_connections_total",
			Help: "Upstream connections that sent no byte within their first-byte deadline after the client's first bytes, or were reset before their first byte. Two within 2s make the endpoint suspect.",
		}),
		failback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "failback_closed_total",
			Help: "Client connections closed by fail-back, by the endpoint they were on: a better endpoint had been healthy for the settle time, and the client reconnects to it.",
		}, []string{"endpoint"}),
		healthActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "health_connections_active",
			Help: "Connections to the health, metrics and status server open now.",
		}),
		healthRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "health_connections_rejected_total",
			Help: fmt.Sprintf("Connections to the health, metrics and status server closed as soon as they were accepted, because as many as it holds (%d) were open, each serving a request, or not read from yet by the server after a wait for it.", HealthMaxConnections),
		}),
		healthEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "health_connections_evicted_total",
			Help: fmt.Sprintf("Connections to the health, metrics and status server closed to make room for a new one, because as many as it holds (%d) were open: each time the one longest without a request in progress (not through its request headers yet, or idle) among those the server waits on for the client's bytes.", HealthMaxConnections),
		}),
		zone: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "zone_info",
			Help: "Always 1: the proxy's own topology zone (empty: none; API servers in it are preferred after local ones) and where it came from: config (--zone), node (the Node's topology.kubernetes.io/zone label, --node-name) or none.",
		}, []string{"zone", "source"}),
	}
	for _, c := range []prometheus.Collector{m.zone, m.silent, m.accepted, m.active, m.rejected, m.acceptErrors, m.dials, m.dialDuration, m.failovers, m.closed, m.bytes, m.failback, m.healthActive, m.healthRejected, m.healthEvicted, endpoint.NewPoolCollector(pool)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The subscription lives as long as the pool: both belong to one Proxy.
	m.endpoints = endpoint.NewEndpointSeries(pool, m.dials.MetricVec, m.dialDuration.MetricVec, m.failback.MetricVec)
	m.dialSeries = endpoint.NewSeriesCache(m.endpoints, func(addr, result string) dialSeries {
		return dialSeries{m.dials.WithLabelValues(addr, result), m.dialDuration.WithLabelValues(addr, result)}
	})
	return m, nil
}

// observeDial is the endpoint.Dialer OnDial hook.
func (m *metrics) observeDial(addr string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	s := m.dialSeries.Get(addr, result)
	s.n.Inc()
	s.d.Observe(d.Seconds())
}

// failedBack counts a client connection to addr closed by fail-back.
func (m *metrics) failedBack(addr string) {
	m.failback.WithLabelValues(addr).Inc()
	m.endpoints.Observed(addr)
}

// setZone makes zone, from source, the one series of zone_info.
func (m *metrics) setZone(zone, source string) {
	m.zone.Reset()
	m.zone.WithLabelValues(zone, source).Set(1)
}
