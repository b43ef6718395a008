package localproxy_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// A burst of new connections left idle: once it has passed (no new
// connection for the quiet time), the proxy collects and returns its
// memory, once. Fewer connections do not trim; connections that keep
// coming put the trim off; the connections carry on across it.
func TestTrimAfterBurst(t *testing.T) {
	const burst, quiet = 20, 300 * time.Millisecond
	up := newEcho(t)
	cfg := localproxy.Config{Endpoints: []string{up.addr()}}
	localproxy.SetTrim(&cfg, burst, quiet)
	r := start(t, cfg)
	var cs []net.Conn
	open := func() {
		c := dial(t, r.addr())
		require.NoError(t, roundTrip(c, fmt.Sprint("conn ", len(cs))))
		cs = append(cs, c)
	}
	for range burst - 1 {
		open()
	}
	time.Sleep(2 * quiet)
	require.Zero(t, r.Trims(), "%d connections are not a burst", burst-1)

	// The burst's last connection, then a trickle faster than quiet.
	open()
	for range 10 {
		time.Sleep(quiet / 3)
		open()
		require.Zero(t, r.Trims(), "trimmed while connections kept coming")
	}
	require.Eventually(t, func() bool { return r.Trims() == 1 }, 10*time.Second, 10*time.Millisecond)
	// The workers that set them up are gone, and their stacks with the
	// trim's collection.
	require.Zero(t, r.TrimIdleWorkers(), "workers still waiting at the trim")
	for i, c := range cs {
		require.NoError(t, roundTrip(c, fmt.Sprint("after the trim ", i)))
	}
	time.Sleep(2 * quiet)
	require.Equal(t, int64(1), r.Trims(), "trimmed again without a new burst")
}
