package transport_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// A preferred endpoint that accepts TCP but never completes the TLS
// handshake (a SIGSTOPped apiserver behind TCP-only probes, which keep
// passing) loses every staggered dial race. The request must be served by
// the connection that won the race, and the endpoint, losing race after
// race, must be demoted so that later requests stop dialing it first.
func TestRequestServedByDialRaceWinner(t *testing.T) {
	c := newCluster(t, 3)
	f := wrap(t, c, transport.Options{Probe: endpoint.ProbeTCP})
	first := f.Pool().Candidates()[0]
	var slow *server
	for _, s := range c.servers {
		if s.addr == first {
			slow = s
		}
	}
	require.NotNil(t, slow, "preferred endpoint %s is not a test server", first)
	slow.ln.freeze()

	for i := range 5 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		name, err := getCtx(ctx, t, f, "/api")
		cancel()
		require.NoError(t, err, "GET %d", i)
		assert.NotEqual(t, slow.name, name)
	}
	assert.NotEqual(t, first, f.Pool().Candidates()[0], "the endpoint that lost every race is still preferred: %+v", f.Pool().Status())
	// One connection serves every request over HTTP/2; a dial loop opens
	// a new one every stagger delay.
	var handshakes int64
	for _, s := range c.servers {
		if s != slow {
			handshakes += s.hellos.Load()
		}
	}
	assert.LessOrEqual(t, handshakes, int64(3), "TLS handshakes on the other servers for 5 GETs")
}

// A connection whose dial completes after its endpoint was removed is not
// used: the pool drained the endpoint's connections when it left and would
// never drain this one.
func TestDialCompletingAfterEndpointRemovedIsDiscarded(t *testing.T) {
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{Probe: endpoint.ProbeTCP, StaggerDelay: time.Minute})
	first := f.Pool().Candidates()[0]
	var slow *server
	for _, s := range c.servers {
		if s.addr == first {
			slow = s
		}
	}
	require.NotNil(t, slow)
	slow.ln.freeze()

	type result struct {
		name string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		name, err := getCtx(ctx, t, f, "/api")
		done <- result{name, err}
	}()
	// The request's connection to the frozen endpoint is open, its TLS
	// handshake waiting.
	require.Eventually(t, func() bool { return conns(f, first) > 0 }, 10*time.Second, 5*time.Millisecond)
	// Removed while healthy, as an apiserver leaves the EndpointSlice when
	// its graceful shutdown begins: its connections are drained, not cut.
	var rest []upstream.Spec
	for _, s := range c.servers {
		if s != slow {
			rest = append(rest, upstream.Spec{Addr: s.addr})
		}
	}
	require.NoError(t, f.Pool().Set(upstream.SourceStatic, rest))
	require.False(t, f.Pool().Has(first))
	slow.ln.unfreeze()

	r := <-done
	require.NoError(t, r.err)
	assert.NotEqual(t, slow.name, r.name, "the request was served by the endpoint removed while it was dialed")
	assert.Zero(t, f.OpenConns()[first], "a connection to the removed endpoint is open: %v", f.OpenConns())
}

// conns returns the pool's count of open connections to addr.
func conns(f *transport.Failover, addr string) int {
	for _, s := range f.Pool().Status() {
		if s.Addr == addr {
			return s.Conns
		}
	}
	return 0
}

// The staggered race hedges a slow first candidate with its equals only:
// an endpoint that fails /readyz but handshakes quickly (its etcd cut
// off, or starting before its caches are filled) must not win the race
// against the only healthy one, slow to handshake, and serve the
// request; nor every request after it, each on a handshake of its own.
func TestStaggerDoesNotRaceALessHealthyEndpoint(t *testing.T) {
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{ProbeReadyzInterval: 100 * time.Millisecond})
	healthy, notReady := c.servers[0], c.servers[1]
	notReady.notReady.Store(true)
	require.Eventually(t, func() bool { return !f.Pool().Usable(notReady.addr) && f.Pool().Usable(healthy.addr) },
		5*time.Second, 5*time.Millisecond, "%+v", f.Pool().Status())
	healthy.helloDelay.Store(int64(400 * time.Millisecond)) // past the 250ms stagger
	hellos := notReady.hellos.Load()
	for i := range 3 {
		assert.Equal(t, healthy.name, mustGet(t, f, "/api/v1/namespaces"), "GET %d", i)
	}
	assert.Zero(t, notReady.count("GET /api/v1/namespaces"))
	assert.Equal(t, hellos, notReady.hellos.Load(), "handshakes with the endpoint that is not ready")
}
