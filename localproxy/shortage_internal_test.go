package localproxy

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShortageBacksOffAndFailsLiveness: each dial that fails for want of
// a descriptor pauses accepting, doubling from minAcceptBackoff up to
// maxAcceptBackoff; a shortage that goes on for acceptStuckAfter fails
// /healthz, saying why, and one that stopped does not; a dial that
// connects ends it, and so does one that failed for the endpoints' own
// reasons (its sockets could be opened).
func TestShortageBacksOffAndFailsLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := New(Config{Endpoints: []string{"127.0.0.1:1"}})
		require.NoError(t, err)
		c := &conn{p: p, raddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}}
		emfile := errors.Join(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)})
		refused := errors.Join(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
		require.True(t, p.acceptPaused().IsZero(), "paused before any shortage")

		start := time.Now()
		want := minAcceptBackoff
		for range 10 {
			p.shortOf(c, emfile)
			assert.Equal(t, want, time.Until(p.acceptPaused()), "the pause after a failed dial")
			want = min(2*want, maxAcceptBackoff)
		}
		time.Sleep(maxAcceptBackoff)
		assert.True(t, p.acceptPaused().IsZero(), "still paused after the backoff")

		// A shortage that goes on: a failed dial every second.
		for time.Since(start) < acceptStuckAfter-time.Second {
			require.NoError(t, p.stuckAccepting(time.Now()))
			time.Sleep(time.Second)
			p.shortOf(c, emfile)
		}
		require.NoError(t, p.stuckAccepting(time.Now()), "stuck before acceptStuckAfter")
		time.Sleep(time.Second)
		err = p.stuckAccepting(time.Now())
		require.Error(t, err, "a shortage as long as acceptStuckAfter")
		for _, s := range []string{"for want of local resources", "too many open files"} {
			assert.True(t, strings.Contains(err.Error(), s), "%q does not say %q", err, s)
		}
		// One that stopped: no failed dial for shortageOngoing. The next
		// failure begins a new run, with the least pause.
		time.Sleep(shortageOngoing)
		assert.NoError(t, p.stuckAccepting(time.Now()), "a shortage that stopped")
		time.Sleep(10 * time.Minute)
		p.shortOf(c, emfile)
		assert.NoError(t, p.stuckAccepting(time.Now()), "a failure after a quiet while continued the old run")
		assert.Equal(t, minAcceptBackoff, time.Until(p.acceptPaused()), "a failure after a quiet while paused as long as the old run's")

		p.dialed()
		p.shortOf(c, emfile)
		assert.Equal(t, minAcceptBackoff, time.Until(p.acceptPaused()), "a new shortage starts its backoff over")
		for _, end := range []func(){p.dialed, func() { p.notDialed(c, refused) }} {
			p.shortOf(c, emfile)
			end()
			assert.True(t, p.acceptPaused().IsZero(), "paused after the shortage ended")
			time.Sleep(acceptStuckAfter)
			p.shortOf(c, emfile)
			assert.NoError(t, p.stuckAccepting(time.Now()), "the run did not end")
		}
	})
}
