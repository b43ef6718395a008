package endpoint_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestHoldoff(t *testing.T) {
	down := errors.New("connection refused")
	var h endpoint.Holdoff
	require.NoError(t, h.Err())

	h.Failed(h.Round(), down)
	err := h.Err()
	require.ErrorIs(t, err, down)
	assert.Contains(t, err.Error(), "next attempt in")

	h.OnEvent(upstream.Event{Kind: upstream.EventUp, Addr: "10.0.0.1:6443"})
	assert.NoError(t, h.Err(), "an endpoint coming up ends the holdoff")
	h.Failed(h.Round(), down)
	h.OnEvent(upstream.Event{Kind: upstream.EventDown, Addr: "10.0.0.1:6443"})
	assert.Error(t, h.Err(), "an endpoint going down does not")

	// A slow round that began before an endpoint came back (or before
	// another round succeeded) and failed after it starts no holdoff.
	h.End()
	slow := h.Round()
	h.OnEvent(upstream.Event{Kind: upstream.EventAdded, Addr: "10.0.0.2:6443"})
	h.Failed(slow, down)
	assert.NoError(t, h.Err(), "an out-of-date round held new dials off")

	synctest.Test(t, func(t *testing.T) {
		short := endpoint.Holdoff{Duration: 20 * time.Millisecond}
		short.Failed(short.Round(), down)
		time.Sleep(short.Duration - time.Nanosecond)
		require.Error(t, short.Err(), "the holdoff ended early")
		time.Sleep(time.Nanosecond)
		require.NoError(t, short.Err(), "the holdoff did not end after its duration")
	})

	none := endpoint.Holdoff{Duration: -1}
	none.Failed(none.Round(), down)
	assert.NoError(t, none.Err())

	// A round that failed because this host is out of descriptors (as
	// DialAny joins its attempts' errors) tried no endpoint: no holdoff,
	// which would tell the next clients that every endpoint refused.
	var local endpoint.Holdoff
	emfile := errors.Join(
		fmt.Errorf("10.0.0.1:6443: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}),
		fmt.Errorf("10.0.0.2:6443: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}))
	local.Failed(local.Round(), emfile)
	assert.NoError(t, local.Err(), "a round that failed for want of descriptors held new dials off")
}

// A caller that dials every endpoint unless a holdoff is in force, as both
// front ends do, makes one round of connection attempts per holdoff
// however fast its requests come: the others fail at once without dialing.
func TestHoldoffBoundsRoundsWhateverTheRequestRate(t *testing.T) {
	const window = 3 * endpoint.DefaultHoldoff
	for _, tc := range []struct {
		name     string
		duration time.Duration // Holdoff.Duration
		every    time.Duration // between one request's end and the next
		dial     time.Duration // how long a failing round takes
		requests int
		rounds   int
	}{
		{name: "a request per millisecond", every: time.Millisecond, requests: 750, rounds: 3},
		{name: "a request per 50ms", every: 50 * time.Millisecond, requests: 15, rounds: 3},
		{name: "a request per 100µs", every: 100 * time.Microsecond, requests: 7500, rounds: 3},
		// A holdoff starts when a round ends.
		{name: "rounds that time out after 100ms", every: time.Millisecond, dial: 100 * time.Millisecond, requests: 501, rounds: 3},
		// Requests slower than the holdoff all dial.
		{name: "a request per 300ms", every: 300 * time.Millisecond, requests: 3, rounds: 3},
		{name: "a 100ms holdoff", duration: 100 * time.Millisecond, every: time.Millisecond, requests: 750, rounds: 8},
		{name: "no holdoff", duration: -1, every: 10 * time.Millisecond, requests: 75, rounds: 75},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				down := errors.New("connection refused")
				h := endpoint.Holdoff{Duration: tc.duration}
				requests, rounds := 0, 0
				for start := time.Now(); time.Since(start) < window; {
					requests++
					if err := h.Err(); err != nil {
						require.ErrorIs(t, err, down)
					} else {
						round := h.Round()
						rounds++
						time.Sleep(tc.dial)
						h.Failed(round, down)
					}
					time.Sleep(tc.every)
				}
				assert.Equal(t, tc.requests, requests)
				assert.Equal(t, tc.rounds, rounds, "connection attempts must not follow the request rate")
			})
		})
	}
}

// An endpoint that comes back ends the holdoff at once, not when it runs
// out.
func TestHoldoffEndsAtOnceWhenAnEndpointComesBack(t *testing.T) {
	for _, kind := range []upstream.EventKind{upstream.EventUp, upstream.EventAdded} {
		t.Run(kind.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				down := errors.New("connection refused")
				var h endpoint.Holdoff
				h.Failed(h.Round(), down)
				time.Sleep(10 * time.Millisecond)
				assert.EqualError(t, h.Err(), "connection refused (every endpoint failed 10ms ago; next attempt in 240ms)")
				h.OnEvent(upstream.Event{Kind: kind, Addr: "10.0.0.1:6443"})
				assert.NoError(t, h.Err(), "the holdoff outlived the endpoint coming back")
			})
		})
	}
}
