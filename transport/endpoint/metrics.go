package endpoint

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/transport/upstream"
)

// DialBuckets are the histogram buckets of dial durations (TCP connect and
// TLS handshake), in seconds, for both front ends.
var DialBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// EndpointSeries keeps per-endpoint series (those with a label "endpoint")
// only while their endpoint is in the pool: when an endpoint is removed
// (upstream.EventRemoved) its series are deleted, so that discovery churn
// does not grow the metrics without bound and a dashboard does not show
// endpoints that are gone.
type EndpointSeries struct {
	pool        *upstream.Pool
	vecs        []*prometheus.MetricVec
	unsubscribe func()
	// caches are the SeriesCaches' forget, told first.
	mu     sync.Mutex
	caches []func(addr string)
}

// NewEndpointSeries watches pool's events and deletes an endpoint's series
// from vecs when it is removed, until Close. Call Observed after each
// update of a series.
func NewEndpointSeries(pool *upstream.Pool, vecs ...*prometheus.MetricVec) *EndpointSeries {
	s := &EndpointSeries{pool: pool, vecs: vecs}
	s.unsubscribe = pool.Subscribe(s.onEvent)
	return s
}

func (s *EndpointSeries) onEvent(ev upstream.Event) {
	if ev.Kind == upstream.EventRemoved {
		s.forget(ev.Addr)
	}
}

// Observed is called after a series of addr was updated. If addr has left
// the pool meanwhile (a dial that ends as its endpoint is removed), the
// series the update recreated is deleted again.
func (s *EndpointSeries) Observed(addr string) {
	if !s.pool.Has(addr) {
		s.forget(addr)
	}
}

func (s *EndpointSeries) forget(addr string) {
	for _, v := range s.vecs {
		v.DeletePartialMatch(prometheus.Labels{"endpoint": addr})
	}
	// After the series are deleted: a cache that takes a series after
	// this has a new one (SeriesCache.Get).
	s.mu.Lock()
	caches := s.caches
	s.mu.Unlock()
	for _, f := range caches {
		f(addr)
	}
}

// Close stops watching the pool.
func (s *EndpointSeries) Close() { s.unsubscribe() }

// SeriesCache keeps the series of the endpoints in an EndpointSeries'
// pool that updates asked for, by endpoint and one more label value: what
// mk made of them (the vectors' WithLabelValues). Looked up by label
// values, a series costs a hash of them and the vector's lock at each
// update; localproxy updates two per connection (its dial's count and
// duration). An endpoint's entries go with its series, so that one that
// comes back gets new ones.
type SeriesCache[T any] struct {
	s  *EndpointSeries
	mk func(addr, value string) T
	mu sync.Mutex
	m  map[[2]string]T
	// forgot counts the forgets: a Get that made its series across one
	// may hold deleted ones, and keeps them out of m.
	forgot uint64
}

// NewSeriesCache returns a cache of s's series, made by mk. The vectors
// mk takes series of must be s's.
func NewSeriesCache[T any](s *EndpointSeries, mk func(addr, value string) T) *SeriesCache[T] {
	c := &SeriesCache[T]{s: s, mk: mk, m: make(map[[2]string]T)}
	s.mu.Lock()
	s.caches = append(s.caches, c.forget)
	s.mu.Unlock()
	return c
}

// Get returns the series of addr and value. For an endpoint that is not
// in the pool (a dial that ends as its endpoint is removed), the series
// mk made are deleted again at once: the caller's update goes to series
// no longer exported.
func (c *SeriesCache[T]) Get(addr, value string) T {
	k := [2]string{addr, value}
	c.mu.Lock()
	v, ok := c.m[k]
	forgot := c.forgot
	c.mu.Unlock()
	if ok {
		return v
	}
	v = c.mk(addr, value)
	// Kept only if no forget came since mk (the endpoint removed, and
	// perhaps back: mk's series may be deleted), and addr is in the
	// pool, checked under c.mu: a removal, which the pool makes before
	// it tells EndpointSeries, is then either seen here, or followed by
	// a forget that waits for c.mu.
	c.mu.Lock()
	in := c.s.pool.Has(addr)
	if in && c.forgot == forgot {
		c.m[k] = v
	}
	c.mu.Unlock()
	if !in {
		c.s.forget(addr)
	}
	return v
}

func (c *SeriesCache[T]) forget(addr string) {
	c.mu.Lock()
	c.forgot++
	for k := range c.m {
		if k[0] == addr {
			delete(c.m, k)
		}
	}
	c.mu.Unlock()
}

// PoolCollector exports the state of every endpoint of a pool, read at
// scrape time.
type PoolCollector struct {
	pool      *upstream.Pool
	state     *prometheus.Desc
	preferred *prometheus.Desc
	conns     *prometheus.Desc
	rtt       *prometheus.Desc
}

// NewPoolCollector returns a collector for pool's endpoints:
// apifailover_endpoint_state{endpoint,state} (1 for the current state),
// apifailover_endpoint_preferred{endpoint}, apifailover_endpoint_open_connections{endpoint}
// and apifailover_endpoint_rtt_seconds{endpoint}.
func NewPoolCollector(pool *upstream.Pool) *PoolCollector {
	return &PoolCollector{
		pool:      pool,
		state:     prometheus.NewDesc("apifailover_endpoint_state", "Health state of each API server endpoint: 1 for its current state, 0 for the others.", []string{"endpoint", "state"}, nil),
		preferred: prometheus.NewDesc("apifailover_endpoint_preferred", "1 for the endpoint new connections go to first.", []string{"endpoint"}, nil),
		conns:     prometheus.NewDesc("apifailover_endpoint_open_connections", "Open connections to each endpoint.", []string{"endpoint"}, nil),
		rtt:       prometheus.NewDesc("apifailover_endpoint_rtt_seconds", "Moving average of successful probe durations per endpoint.", []string{"endpoint"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.state
	ch <- c.preferred
	ch <- c.conns
	ch <- c.rtt
}

var allStates = []upstream.State{upstream.StateUnknown, upstream.StateHealthy, upstream.StateUnhealthy, upstream.StateQuarantined}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.pool.Status() {
		for _, st := range allStates {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, b2f(s.State == st), s.Addr, st.String())
		}
		ch <- prometheus.MustNewConstMetric(c.preferred, prometheus.GaugeValue, b2f(s.Preferred), s.Addr)
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.Conns), s.Addr)
		ch <- prometheus.MustNewConstMetric(c.rtt, prometheus.GaugeValue, s.RTT.Seconds(), s.Addr)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
