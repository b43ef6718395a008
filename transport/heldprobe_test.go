package transport_test

import (
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
// the next scheduled probe (an hour away here). Probes reuse one
// handshake per server.
func TestHeldProbesReportAFrozenServerBetweenProbes(t *testing.T) {
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{Probe: endpoint.ProbeHeld, ProbeInterval: time.Hour})
	victim := c.servers[1]
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
	assert.EqualValues(t, 1, victim.hellos.Load(), "one handshake for the held connection")

	victim.ln.freeze()
	defer victim.ln.unfreeze()
	require.Eventually(t, func() bool { s := status(); return s.Suspect || s.State != upstream.StateHealthy }, 10*time.Second, 10*time.Millisecond,
		"a frozen server was not reported between probes")
}
