package endpoint_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// On a near server a PING unanswered for the floor (200ms) is reported
// late, and the connection lost once it stays unanswered for the
// confirmation (300ms): within one PING interval (+10% jitter) and that of
// the server hanging.
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
		var late []time.Duration
		f, err := endpoint.RunPingLoopWith(t.Context(), endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, Seed: time.Millisecond, Ping: fakePing(rtt),
			Late:     func(err error) { late = append(late, time.Since(hang)) },
			Answered: func() { t.Error("a PING never answered was answered") },
		})
		took := time.Since(hang)
		assert.Equal(t, upstream.FailureConnLost, f)
		assert.ErrorContains(t, err, "PING unanswered within 300ms")
		assert.Equal(t, 300*time.Millisecond, endpoint.ConfirmTimeout(200*time.Millisecond))
		if assert.Len(t, late, 1) {
			assert.Equal(t, took-100*time.Millisecond, late[0], "late at the timeout, 100ms before the confirmation")
		}
		assert.GreaterOrEqual(t, took, 300*time.Millisecond)
		assert.LessOrEqual(t, took, 275*time.Millisecond+300*time.Millisecond+time.Millisecond)
	})
}

// A PING answered after its timeout but before the confirmation is
// reported late, then answered; the connection is not lost.
func TestPingLoopLateAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		rtt := func() time.Duration {
			n++
			if n == 5 {
				return 250 * time.Millisecond
			}
			return time.Millisecond
		}
		var events []string
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		f, err := endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, Seed: time.Millisecond, Ping: fakePing(rtt),
			Late:     func(err error) { events = append(events, "late: "+err.Error()) },
			Answered: func() { events = append(events, "answered") },
		})
		assert.Zero(t, f)
		assert.NoError(t, err)
		assert.Equal(t, []string{"late: held connection: PING unanswered within 200ms", "answered"}, events)
		assert.Greater(t, n, 10, "PINGs go on")
	})
}

// An endpoint with no request waiting is PINGed every IdleInterval, a
// busy one every Interval; a wake (a request sent) PINGs at once and from
// then on every Interval while busy. Between idle PINGs the loop sleeps:
// it asks Busy only after a PING.
func TestPingLoopBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pings []time.Time
		ping := func(ctx context.Context) error {
			pings = append(pings, time.Now())
			return nil
		}
		start := time.Now()
		var busy atomic.Bool
		var asked atomic.Int32
		wake := endpoint.NewWaker()
		time.AfterFunc(10*time.Second+time.Millisecond, func() {
			busy.Store(true)
			wake.Wake()
		})
		ctx, cancel := context.WithTimeout(t.Context(), 12*time.Second)
		defer cancel()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: 2 * time.Second, Seed: time.Millisecond,
			Busy: func() bool { asked.Add(1); return busy.Load() }, Waker: wake, Ping: ping,
		})
		idle, fast := 0, 0
		for _, p := range pings {
			if p.Sub(start) < 10*time.Second+time.Millisecond {
				idle++
			} else {
				fast++
			}
		}
		assert.InDelta(t, 5, idle, 1, "idle: one PING per 2s over 10s")
		assert.InDelta(t, 8, fast, 1, "busy: one PING at once (or 250ms after the last), then one per 250ms (±10%) until 12s")
		if assert.Greater(t, len(pings), idle) && assert.Positive(t, idle) {
			woke := start.Add(10*time.Second + time.Millisecond)
			want := woke
			if after := pings[idle-1].Add(250 * time.Millisecond); after.After(woke) {
				want = after
			}
			assert.Equal(t, want, pings[idle], "the wake PINGs at once, or 250ms after the last PING")
		}
		assert.Equal(t, len(pings)+1, int(asked.Load()), "Busy asked once per PING, and at the start")
	})
}

// A busy endpoint whose server sends data on client connections is not
// PINGed every Interval (its flow-control updates keep a client's
// connection waiting for two seconds after each answer), only every
// 4 Intervals; once the server falls silent, the PINGs go every Interval
// after its last data.
func TestPingLoopBusyHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pings []time.Duration
		start := time.Now()
		ping := func(ctx context.Context) error { pings = append(pings, time.Since(start)); return nil }
		silent := 5 * time.Second
		heard := func(within time.Duration) (time.Duration, bool) {
			ago := 10 * time.Millisecond // answers go on
			if since := time.Since(start); since >= silent {
				ago = since - silent
			}
			return ago, ago < within
		}
		ctx, cancel := context.WithTimeout(t.Context(), 7*time.Second)
		defer cancel()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: 5 * time.Second, Seed: time.Millisecond,
			Busy: func() bool { return true }, Heard: heard, Ping: ping,
		})
		talking := 0
		for _, p := range pings {
			if p < silent {
				talking++
			}
		}
		assert.InDelta(t, 4, talking, 1, "while the server sends data: the first PING, then one per second or so: %v", pings)
		if assert.Greater(t, len(pings), talking, "no PING once the server fell silent") {
			assert.LessOrEqual(t, pings[talking], silent+250*time.Millisecond, "the first PING goes 250ms after the server's last data")
		}
		assert.InDelta(t, 8, len(pings)-talking, 1, "then one per 250ms (±10%%) until 7s: %v", pings)
	})
}

// Requests every 50ms to a server heard from each time (answered at
// once): after the first wake's PING the loop looks at the server's data
// every 250ms, not at each request, and PINGs once a second or so.
func TestPingLoopWakeHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pings, looks := 0, 0
		heard := func(within time.Duration) (time.Duration, bool) {
			looks++
			return 10 * time.Millisecond, 10*time.Millisecond < within
		}
		wake := endpoint.NewWaker()
		ticker := time.NewTicker(50 * time.Millisecond)
		defer ticker.Stop()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-ticker.C:
				}
				wake.Wake()
			}
		}()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: 5 * time.Second, Seed: time.Millisecond,
			Busy: func() bool { return false }, Heard: heard, Waker: wake, Ping: func(context.Context) error { pings++; return nil },
		})
		assert.InDelta(t, 3, pings, 1, "the first wake's PING, then one per second or so, in 3s (12 at one per 250ms)")
		assert.InDelta(t, 9, looks, 2, "a look at the server's data every 250ms, not one per request (60)")
	})
}

// An endpoint that carries no connection at all is PINGed every
// UnusedInterval; one that carries connections, none waiting, every
// IdleInterval.
func TestPingLoopUnused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			inUse bool
			want  int
		}{{false, 2}, {true, 6}} {
			n := 0
			ctx, cancel := context.WithTimeout(t.Context(), 31*time.Second)
			endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
				Interval: 250 * time.Millisecond, IdleInterval: 5 * time.Second, UnusedInterval: 15 * time.Second,
				Seed: time.Millisecond, Busy: func() bool { return false }, InUse: func() bool { return tc.inUse },
				Ping: func(context.Context) error { n++; return nil },
			})
			cancel()
			assert.InDelta(t, tc.want, n, 1, "in use %v: PINGs in 31s", tc.inUse)
		}
	})
}

// A wake of an endpoint whose request is answered before the PING: one
// PING, then the idle schedule again.
func TestPingLoopWakeAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pings []time.Duration
		start := time.Now()
		ping := func(ctx context.Context) error { pings = append(pings, time.Since(start)); return nil }
		wake := endpoint.NewWaker()
		time.AfterFunc(time.Second, wake.Wake)
		ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
		defer cancel()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: 2 * time.Second, Seed: time.Millisecond,
			Busy: func() bool { return false }, Waker: wake, Ping: ping,
		})
		require.Len(t, pings, 2, "the wake's PING, then one idle PING in 4s")
		assert.Equal(t, time.Second, pings[0])
		assert.InDelta(t, float64(3*time.Second), float64(pings[1]), float64(200*time.Millisecond), "idle again: 2s (±10%) after")
	})
}

// A request sent while a PING is out, to a server that freezes then,
// gets a PING of its own within Interval of that one's answer, even
// though Busy cannot see it waiting (sent before its bytes were written,
// or in the same jiffy as the last answer came): the loop does not go
// idle for IdleInterval with the request unwatched.
func TestPingLoopWakeDuringPing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pings []time.Duration
		start := time.Now()
		wake := endpoint.NewWaker()
		ping := func(ctx context.Context) error {
			pings = append(pings, time.Since(start))
			if len(pings) == 1 {
				// The second request goes while the first PING is out.
				time.AfterFunc(5*time.Millisecond, wake.Wake)
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}
		time.AfterFunc(time.Second, wake.Wake)
		ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
		defer cancel()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: 5 * time.Second, Seed: time.Millisecond,
			Busy: func() bool { return false }, Waker: wake, Ping: ping,
		})
		require.Len(t, pings, 2, "the first request's PING, then one for the request sent while it was out, then idle: %v", pings)
		assert.Equal(t, time.Second, pings[0])
		assert.InDelta(t, float64(time.Second+10*time.Millisecond+250*time.Millisecond), float64(pings[1]), float64(25*time.Millisecond),
			"the second PING goes 250ms (±10%) after the first was answered")
	})
}

// Wakes come with every request; PINGs still go at most every Interval:
// a wake soon after a PING brings the next one to Interval after it, and
// wakes while PINGs go every Interval change nothing.
func TestPingLoopWakeRateBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		ping := func(ctx context.Context) error { n++; return nil }
		wake := endpoint.NewWaker()
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				wake.Wake()
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second+time.Millisecond)
		defer cancel()
		endpoint.RunPingLoopWith(ctx, endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, IdleInterval: time.Hour, Seed: time.Millisecond,
			Busy: func() bool { return false }, Waker: wake, Ping: ping,
		})
		close(stop)
		assert.InDelta(t, 9, n, 1, "a request every 10ms for 2s: a PING per 250ms")
	})
}

// A server that sends GOAWAY ends the loop with FailureGoAway, whether it
// closes the connection at once or answers PINGs meanwhile.
func TestPingLoopGoAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var away atomic.Bool
		time.AfterFunc(time.Second, func() { away.Store(true) })
		f, err := endpoint.RunPingLoopWith(t.Context(), endpoint.PingLoopHooks{
			Interval: 250 * time.Millisecond, Seed: time.Millisecond,
			Ping: fakePing(func() time.Duration { return time.Millisecond }), GoingAway: away.Load,
		})
		assert.Equal(t, upstream.FailureGoAway, f)
		assert.ErrorContains(t, err, "GOAWAY")

		lost := make(chan struct{})
		close(lost)
		f, _ = endpoint.RunPingLoopWith(t.Context(), endpoint.PingLoopHooks{
			Interval: time.Hour, Seed: time.Millisecond, Lost: lost,
			Ping: fakePing(func() time.Duration { return 0 }), GoingAway: func() bool { return true },
		})
		assert.Equal(t, upstream.FailureGoAway, f)
	})
}

// A connection a probe found unusable and replaced (retired) ends its
// loop at once, as a lost one: with FailureGoAway if the server sent
// GOAWAY, FailureConnLost otherwise; not at its next PING, an hour away
// here, running meanwhile beside the new connection's.
func TestPingLoopRetired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, away := range []bool{true, false} {
			retired := make(chan struct{})
			time.AfterFunc(time.Second, func() { close(retired) })
			start := time.Now()
			f, err := endpoint.RunPingLoopWith(t.Context(), endpoint.PingLoopHooks{
				Interval: time.Hour, IdleInterval: time.Hour, Seed: time.Millisecond, Retired: retired,
				Ping: fakePing(func() time.Duration { return 0 }), GoingAway: func() bool { return away },
			})
			want := upstream.FailureConnLost
			if away {
				want = upstream.FailureGoAway
			}
			assert.Equal(t, want, f, "going away: %v", away)
			assert.Error(t, err)
			assert.Equal(t, time.Second, time.Since(start), "going away: %v", away)
		}
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
