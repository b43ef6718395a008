package transport_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// With held probes, Wrap hands the pool to the prober: a server that stops
// answering its held connection's PINGs is reported at once, long before
// the next scheduled probe (an hour away here). A request sent to it
// wakes its held connection: the PING goes at once and, unanswered, is
// reported within its timeout. Probes reuse one handshake per server.
func TestHeldProbesReportAFrozenServerBetweenProbes(t *testing.T) {
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{Probe: endpoint.ProbeHeld, ProbeInterval: time.Hour})
	// The server requests go to first.
	res, err := f.HTTPClient().Get(c.config().Host + "/version")
	require.NoError(t, err)
	res.Body.Close()
	var victim *server
	for _, s := range c.servers {
		if f.OpenConns()[s.addr] > 0 {
			victim = s
		}
	}
	require.NotNil(t, victim, "no request connection open: %v", f.OpenConns())
	status := func() upstream.Status {
		for _, s := range f.Pool().Status() {
			if s.Addr == victim.addr {
				return s
			}
		}
		t.Fatalf("%s not in the pool", victim.addr)
		return upstream.Status{}
	}
	require.Equal(t, upstream.StateHealthy, status().State)
	assert.EqualValues(t, 2, victim.hellos.Load(), "one handshake for the held connection, one for the request connection")

	victim.ln.freeze()
	defer victim.ln.unfreeze()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.config().Host+"/version", nil)
		if res, err := f.HTTPClient().Do(req); err == nil {
			res.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { s := status(); return s.Suspect || s.State != upstream.StateHealthy }, 3*time.Second, 10*time.Millisecond,
		"a frozen server with a request waiting was not reported between probes")
}
