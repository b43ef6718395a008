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
// maxAcceptBackoff; a shortage that lasts acceptStuckAfter without a
// dial that connects fails /healthz, saying why; one dial that connects
// ends it.
func TestShortageBacksOffAndFailsLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := New(Config{Endpoints: []string{"127.0.0.1:1"}})
		require.NoError(t, err)
		c := &conn{p: p, raddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}}
		emfile := errors.Join(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)})
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

		require.NoError(t, p.stuckAccepting(start.Add(acceptStuckAfter-time.Second)))
		err = p.stuckAccepting(start.Add(acceptStuckAfter))
		require.Error(t, err, "a shortage as long as acceptStuckAfter")
		for _, s := range []string{"for want of local resources", "too many open files"} {
			assert.True(t, strings.Contains(err.Error(), s), "%q does not say %q", err, s)
		}

		p.dialed()
		assert.NoError(t, p.stuckAccepting(start.Add(acceptStuckAfter)), "after a dial that connected")
		p.shortOf(c, emfile)
		assert.Equal(t, minAcceptBackoff, time.Until(p.acceptPaused()), "a new shortage starts its backoff over")
	})
}
