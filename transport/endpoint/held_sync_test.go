package endpoint_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// The PING timeout is k×SRTT + 4×RTTVAR (RFC 6298 smoothing, k = 2),
// at least 200ms and at most 2s.
func TestPingTimeoutRule(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		samples []time.Duration
		want    time.Duration
	}{
		{"no sample: the floor", nil, 200 * ms},
		{"loopback: the floor", []time.Duration{ms / 10, ms / 10}, 200 * ms},
		// First sample: srtt 100, rttvar 50: 2×100 + 4×50.
		{"first sample", []time.Duration{100 * ms}, 400 * ms},
		// srtt = 7/8×100 + 1/8×100 = 100; rttvar = 3/4×50 + 1/4×0 = 37.5.
		{"steady", []time.Duration{100 * ms, 100 * ms}, 200*ms + 150*ms},
		// srtt = 87.5 + 37.5 = 125; rttvar = 37.5 + 50 = 87.5: 250 + 350.
		{"jumpy", []time.Duration{100 * ms, 300 * ms}, 600 * ms},
		{"far: the cap", []time.Duration{time.Second}, 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, endpoint.PingTimeout(tc.samples...))
		})
	}
}

// fakePing answers after rtt(), or never when rtt() is negative.
func fakePing(rtt func() time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		d := rtt()
		if d < 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// On a near server a PING unanswered for the floor (200ms) is a lost
// connection, reported within one PING interval (+10% jitter) and that
// timeout of the server hanging.
func TestPingLoopDetectsHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		hang := start.Add(5 * time.Second)
		rtt := func() time.Duration {
			if time.Now().Before(hang) {
				return time.Millisecond
			}
			return -1
		}
		f, err := endpoint.RunPingLoop(t.Context(), 250*time.Millisecond, time.Millisecond, fakePing(rtt), nil)
		took := time.Since(hang)
		assert.Equal(t, upstream.FailureConnLost, f)
		assert.ErrorContains(t, err, "PING unanswered within 200ms")
		assert.GreaterOrEqual(t, took, 200*time.Millisecond)
		assert.LessOrEqual(t, took, 275*time.Millisecond+200*time.Millisecond+time.Millisecond)
	})
}

// On a far server (300ms) the timeout follows the RTT: PINGs of 450ms are
// late but not lost, as they would be with the floor alone; one of 2.1s is.
func TestPingLoopFollowsRTT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		rtt := func() time.Duration {
			n++
			switch {
			case n <= 20:
				return 300 * time.Millisecond
			case n <= 22:
				return 450 * time.Millisecond
			}
			return 2100 * time.Millisecond
		}
		start := time.Now()
		f, err := endpoint.RunPingLoop(t.Context(), 250*time.Millisecond, 300*time.Millisecond, fakePing(rtt), nil)
		assert.Equal(t, upstream.FailureConnLost, f)
		assert.Equal(t, 23, n)
		assert.ErrorContains(t, err, "PING unanswered")
		assert.Greater(t, time.Since(start), 22*(250*time.Millisecond*9/10+300*time.Millisecond))
	})
}

// A lost connection is reported at once, without waiting for a PING; a
// done context ends the loop with nothing to report.
func TestPingLoopLostAndStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lost := make(chan struct{})
		time.AfterFunc(time.Second+time.Millisecond, func() { close(lost) })
		start := time.Now()
		f, err := endpoint.RunPingLoop(t.Context(), time.Hour, time.Millisecond, fakePing(func() time.Duration { return 0 }), lost)
		assert.Equal(t, upstream.FailureConnLost, f)
		assert.Error(t, err)
		assert.Equal(t, time.Second+time.Millisecond, time.Since(start))

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		f, err = endpoint.RunPingLoop(ctx, 100*time.Millisecond, time.Millisecond, fakePing(func() time.Duration { return 0 }), nil)
		assert.Zero(t, f)
		assert.True(t, err == nil || errors.Is(err, context.DeadlineExceeded))
	})
}
