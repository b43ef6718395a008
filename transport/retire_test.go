package transport_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
)

// When another endpoint becomes preferred, every idle connection to the old
// one is closed, however many there are (HTTP/1.1 keeps one per concurrent
// request).
func TestRetireClosesEveryIdleConnection(t *testing.T) {
	c := &cluster{pki: newPKI(t)}
	for _, name := range []string{"s0", "s1"} {
		c.servers = append(c.servers, newServerProto(t, name, c.pki.Cert, false))
	}
	f := wrap(t, c, transport.Options{})
	s := serving(t, c, f)

	// Three requests at once need three HTTP/1.1 connections.
	const n = 3
	release := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(n)
	s.setHandler(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		<-release
	})
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := get(t, f, "/slow")
			errs <- err
		}()
	}
	arrived.Wait()
	close(release)
	for range n {
		require.NoError(t, <-errs)
	}
	require.GreaterOrEqual(t, f.OpenConns()[s.addr], n, "open connections: %v", f.OpenConns())

	// Losing dial races demotes the endpoint: one preferred change, which
	// retires its connections (it stays usable, so nothing else does).
	for range 2 {
		f.Pool().ReportDialRace(s.addr, false)
	}
	require.NotEqual(t, s.addr, f.Pool().Candidates()[0])
	require.Eventually(t, func() bool {
		return f.OpenConns()[s.addr] == 0
	}, 10*time.Second, 10*time.Millisecond, "idle connections to the endpoint that is no longer preferred stayed open")
	assert.NotEqual(t, s.name, mustGet(t, f, "/api"))
	assert.Zero(t, f.OpenConns()[s.addr], "a retired connection was handed out")
}
