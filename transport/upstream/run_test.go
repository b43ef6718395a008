package upstream_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// In these tests Run starts before Set: its first round finds no endpoint,
// and the kick from Set starts the next round a quarter interval later. The
// rounds then follow one another deterministically on the bubble's clock.

func TestRunNilProber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()

		advance(time.Hour)
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before its context was done", err)
		default:
		}
		p.Kick()
		advance(time.Hour)
		assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrA), "no probes")

		start := time.Now()
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, start, time.Now(), "Run returns at once")
	})
}

func TestRunInterval(t *testing.T) {
	tests := []struct {
		name   string
		jitter float64
		spread float64 // the jitter actually expected
	}{
		{"default jitter", 0, upstream.DefaultJitter},
		{"jitter 0.3", 0.3, 0.3},
		{"no jitter", -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const interval = 2 * time.Second
				prober := newProbeLog(nil)
				p := newPool(t, upstream.Config{Prober: prober, Interval: interval, Jitter: tt.jitter})
				stop := startRun(t, p)
				defer stop()
				start := time.Now()
				mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
				advance(200 * time.Second)

				times := prober.times(addrA)
				require.Greater(t, len(times), 80)
				assert.Equal(t, times, prober.times(addrB), "both endpoints in every round")
				assert.Equal(t, start.Add(interval/4), times[0], "first round: a quarter interval after the kick")

				lo := time.Duration(float64(interval) * (1 - tt.spread))
				hi := time.Duration(float64(interval) * (1 + tt.spread))
				minGap, maxGap := time.Duration(1<<62), time.Duration(0)
				for i := 1; i < len(times); i++ {
					gap := times[i].Sub(times[i-1])
					require.GreaterOrEqual(t, gap, lo, "gap %d", i)
					require.LessOrEqual(t, gap, hi, "gap %d", i)
					minGap, maxGap = min(minGap, gap), max(maxGap, gap)
				}
				if tt.spread == 0 {
					assert.Equal(t, interval, minGap)
					assert.Equal(t, interval, maxGap)
				} else {
					// With more than 80 uniform draws, both ends of the range are used.
					quarter := time.Duration(float64(interval) * tt.spread / 2)
					assert.Less(t, minGap, interval-quarter, "jitter shortens some intervals")
					assert.Greater(t, maxGap, interval+quarter, "jitter lengthens some intervals")
				}
			})
		})
	}
}

func TestRunConcurrentProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 500 * time.Millisecond
		var mu sync.Mutex
		returned := make(map[string]time.Time)
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			var err error
			switch addr {
			case addrA: // blackholed
				err = blockUntilDone(ctx)
			case addrD:
				time.Sleep(200 * time.Millisecond)
			}
			mu.Lock()
			returned[addr] = time.Now()
			mu.Unlock()
			return err
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Timeout: timeout, Jitter: -1})
		r := record(p)
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC, addrD))
		round := time.Now().Add(time.Second / 4)
		advance(time.Second)

		for _, a := range []string{addrA, addrB, addrC, addrD} {
			require.Equal(t, []time.Time{round}, prober.times(a), "%s probed once, when the round started", a)
		}
		assert.Equal(t, round, returned[addrB])
		assert.Equal(t, round.Add(200*time.Millisecond), returned[addrD])
		assert.Equal(t, round.Add(timeout), returned[addrA], "the blackholed probe ends at its timeout")

		for _, a := range []string{addrB, addrC, addrD} {
			at, ok := r.first(upstream.EventUp, a)
			require.True(t, ok, "%s up", a)
			// Results are applied together when the round ends: at most the
			// timeout after it started, not later.
			assert.LessOrEqual(t, at.Sub(round), timeout, "%s up after %v", a, at.Sub(round))
		}
		at, ok := r.first(upstream.EventDown, addrA)
		require.True(t, ok)
		assert.Equal(t, timeout, at.Sub(round))
		s := statusOf(t, p, addrA)
		assert.Equal(t, upstream.StateUnhealthy, s.State)
		assert.Contains(t, s.LastError, context.DeadlineExceeded.Error())
	})
}

func TestRunProbeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 300 * time.Millisecond
		var mu sync.Mutex
		deadlines := make(map[string][]time.Duration)
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			d, ok := ctx.Deadline()
			mu.Lock()
			if ok {
				deadlines[addr] = append(deadlines[addr], time.Until(d))
			}
			mu.Unlock()
			if addr == addrA {
				time.Sleep(100 * time.Millisecond) // the others start at the same time
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Timeout: timeout})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		advance(5 * time.Second)

		for _, a := range []string{addrA, addrB, addrC} {
			require.NotEmpty(t, deadlines[a])
			for _, d := range deadlines[a] {
				assert.Equal(t, timeout, d, "%s: every probe gets the full timeout", a)
			}
		}
	})
}

// TestRunProbeIgnoresContext records what happens with a Prober that breaks
// its contract and does not return when ctx is done: the round waits for it
// (and so do the other endpoints' results), and a success that came too late
// counts as a timeout.
func TestRunProbeIgnoresContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 500 * time.Millisecond
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr == addrA {
				time.Sleep(3 * timeout)
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: 2 * time.Second, Timeout: timeout, Jitter: -1})
		r := record(p)
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		round := time.Now().Add(500 * time.Millisecond)
		advance(2 * time.Second)

		s := statusOf(t, p, addrA)
		assert.Equal(t, upstream.StateUnhealthy, s.State, "a late success is a failure")
		assert.Contains(t, s.LastError, context.DeadlineExceeded.Error())
		down, ok := r.first(upstream.EventDown, addrA)
		require.True(t, ok)
		assert.Equal(t, 3*timeout, down.Sub(round), "the round waits for the probe")
		up, ok := r.first(upstream.EventUp, addrB)
		require.True(t, ok)
		assert.Equal(t, 3*timeout, up.Sub(round), "the other results wait with it")

		// The rounds keep their cadence: the next one starts an interval after
		// the slow one started.
		advance(3 * time.Second)
		times := prober.times(addrB)
		require.GreaterOrEqual(t, len(times), 2)
		assert.Equal(t, 2*time.Second, times[1].Sub(times[0]))
	})
}

func TestRunKick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = time.Second
		prober := newProbeLog(nil)
		p := newPool(t, upstream.Config{Prober: prober, Interval: interval, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		t0 := time.Now()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA)) // kicks
		advance(interval / 2)
		require.Equal(t, []time.Time{t0.Add(interval / 4)}, prober.times(addrA))

		// A kick long enough after the last round runs one at once.
		p.Kick()
		synctest.Wait()
		require.Equal(t, 2, prober.count(addrA))
		assert.Equal(t, t0.Add(interval/2), prober.times(addrA)[1])

		// A kick soon after a round waits for the quarter interval.
		advance(50 * time.Millisecond)
		p.Kick()
		advance(150 * time.Millisecond)
		assert.Equal(t, 2, prober.count(addrA), "not yet")
		advance(50 * time.Millisecond)
		require.Equal(t, 3, prober.count(addrA))
		assert.Equal(t, t0.Add(interval/2+interval/4), prober.times(addrA)[2])

		// A storm of kicks (and of passive failures, which kick) runs a round
		// every quarter interval, never more often.
		stormStart := time.Now()
		for i := range 400 {
			if i%2 == 0 {
				p.Kick()
			} else {
				p.ReportFailure(addrA, upstream.FailureGoAway, nil)
			}
			advance(5 * time.Millisecond)
		}
		times := prober.times(addrA)
		var storm []time.Time
		for _, at := range times {
			if at.After(stormStart) {
				storm = append(storm, at)
			}
		}
		require.Len(t, storm, 8, "2s of kicks: 8 rounds")
		for i := 1; i < len(storm); i++ {
			assert.Equal(t, interval/4, storm[i].Sub(storm[i-1]), "round %d", i)
		}

		// Kick never blocks, with or without a pending kick.
		for range 10 {
			p.Kick()
		}
	})
}

func TestRunKickedBySetAndReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 4 * time.Second
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr == addrB && n == 0 {
				return fmt.Errorf("x509: %w", upstream.ErrCertificate)
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: interval, Timeout: time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(interval / 2)
		require.Equal(t, 1, prober.count(addrA))
		require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrB))

		// A new endpoint is probed at once, not after the interval.
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		synctest.Wait()
		assert.Equal(t, 1, prober.count(addrC))
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrC))

		// The quarantined endpoint is not probed within its backoff (5s,
		// more than the interval); reset, it is probed at once (the last
		// round was half an interval ago).
		advance(interval / 2)
		assert.Equal(t, 1, prober.count(addrB), "no probes while quarantined")
		assert.Greater(t, prober.count(addrA), 1)
		p.ResetQuarantine()
		synctest.Wait()
		assert.Equal(t, 2, prober.count(addrB))
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrB))
	})
}

func TestRunStateMachine(t *testing.T) {
	const (
		y = true
		n = false
	)
	var (
		healthy     = upstream.StateHealthy
		unhealthy   = upstream.StateUnhealthy
		quarantined = upstream.StateQuarantined
	)
	certErr := fmt.Errorf("tls: failed to verify certificate: %w", upstream.ErrCertificate)
	tests := []struct {
		name       string
		rise, fall int
		results    []error
		want       []upstream.State // after each round
		suspect    []bool
	}{
		{"unknown to healthy on first success", 2, 2,
			[]error{nil}, []upstream.State{healthy}, []bool{n}},
		{"unknown to unhealthy on first failure", 2, 2,
			[]error{errTimeout}, []upstream.State{unhealthy}, []bool{n}},
		{"fall 3", 2, 3,
			[]error{nil, errTimeout, errTimeout, errTimeout},
			[]upstream.State{healthy, healthy, healthy, unhealthy}, []bool{n, y, y, n}},
		{"rise 3", 3, 2,
			[]error{errTimeout, nil, nil, nil},
			[]upstream.State{unhealthy, unhealthy, unhealthy, healthy}, []bool{n, n, n, n}},
		{"flapping never reaches fall", 2, 2,
			[]error{nil, errTimeout, nil, errTimeout, nil},
			[]upstream.State{healthy, healthy, healthy, healthy, healthy}, []bool{n, y, n, y, n}},
		{"certificate error quarantines", 2, 2,
			[]error{nil, certErr, nil, nil},
			[]upstream.State{healthy, quarantined, quarantined, quarantined}, []bool{n, n, n, n}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				prober := newProbeLog(func(ctx context.Context, addr string, i int) error {
					if i >= len(tt.results) {
						return errors.New("script exhausted")
					}
					return tt.results[i]
				})
				p := newPool(t, upstream.Config{Prober: prober, Rise: tt.rise, Fall: tt.fall, Jitter: -1})
				stop := startRun(t, p)
				defer stop()
				t0 := time.Now()
				mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
				quarantinedAt := -1
				for i := range tt.want {
					// Round i starts at t0 + 250ms + i s.
					sleepUntil(t0.Add(250*time.Millisecond + time.Duration(i)*time.Second + time.Millisecond))
					s := statusOf(t, p, addrA)
					require.Equal(t, tt.want[i], s.State, "after round %d", i)
					require.Equal(t, tt.suspect[i], s.Suspect, "after round %d", i)
					if s.State == quarantined && quarantinedAt < 0 {
						quarantinedAt = i
					}
				}
				if quarantinedAt >= 0 {
					assert.Equal(t, quarantinedAt+1, prober.count(addrA), "no probes within the quarantine backoff")
					assert.ErrorIs(t, certErr, upstream.ErrCertificate)
					assert.Equal(t, certErr.Error(), statusOf(t, p, addrA).LastError)
				} else {
					assert.Equal(t, len(tt.want), prober.count(addrA))
				}
			})
		})
	}
}

var errTimeout = errors.New("i/o timeout")

func TestRunCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr == addrA {
				return blockUntilDone(ctx)
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Timeout: time.Second})
		r := record(p)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		synctest.Wait()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(400 * time.Millisecond) // in the middle of the first round
		require.Equal(t, 1, prober.count(addrA))
		r.take()

		start := time.Now()
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, start, time.Now(), "Run returns as soon as its probes do")
		assert.Empty(t, r.take(), "results of a cancelled round are dropped")
		assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrA))
		assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrB))

		// The pool outlives Run, and Run can be started again.
		ctx2, cancel2 := context.WithCancel(t.Context())
		go func() { done <- p.Run(ctx2) }()
		advance(2 * time.Second)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrB))
		cancel2()
		require.NoError(t, <-done)
		// synctest.Test fails if a goroutine of the bubble is left behind.
	})
}

// TestRunCadence checks that a blackholed endpoint does not stretch the probe
// period of the others.
func TestRunCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = time.Second
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr == addrA {
				return blockUntilDone(ctx)
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: interval, Timeout: interval / 2, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(20 * interval)
		times := prober.times(addrB)
		require.Len(t, times, 20)
		for i := 1; i < len(times); i++ {
			assert.Equal(t, interval, times[i].Sub(times[i-1]), "round %d", i)
		}
		assert.Equal(t, times, prober.times(addrA))
	})
}

// TestRunDetectionTime measures, on the bubble's clock, how long it takes from
// the moment an endpoint dies (worst case: right after a successful probe)
// to its EventDown, with Interval 1s, Timeout 1s, Fall 2.
func TestRunDetectionTime(t *testing.T) {
	const (
		interval = time.Second
		timeout  = time.Second
		fall     = 2
	)
	tests := []struct {
		name    string
		jitter  float64
		timeout time.Duration // if zero, timeout
		dead    func(ctx context.Context) error
		bound   time.Duration
	}{
		{
			name:   "refused, no jitter",
			jitter: -1,
			dead:   func(context.Context) error { return errors.New("connection refused") },
			bound:  fall*interval + timeout,
		},
		{
			name:   "refused, default jitter",
			jitter: 0,
			dead:   func(context.Context) error { return errors.New("connection refused") },
			bound:  time.Duration(float64(fall*interval)*(1+upstream.DefaultJitter)) + timeout,
		},
		// BUG (minor): a round that runs into the timeout is followed by
		// the next one no sooner than Interval/4 after it ended
		// (run.go:45-47: max(nextInterval-elapsed, minGap)). With Timeout
		// equal to Interval (the defaults: 1s and 1s) every failing round of
		// a blackholed endpoint (SIGKILL, partition, dropped packets)
		// therefore stretches the period to Timeout+Interval/4, and
		// detection takes 3.25s instead of at most Fall×Interval+Timeout
		// = 3s. The bound holds when Timeout <= 3/4 Interval (next case).
		{
			name:   "blackholed, no jitter",
			jitter: -1,
			dead:   blockUntilDone,
			bound:  fall*interval + timeout,
		},
		{
			name:    "blackholed, shorter timeout",
			jitter:  -1,
			timeout: 750 * time.Millisecond,
			dead:    blockUntilDone,
			bound:   fall*interval + 750*time.Millisecond,
		},
		{
			name:    "blackholed, shorter timeout, jitter",
			jitter:  0.2,
			timeout: 500 * time.Millisecond,
			dead:    blockUntilDone,
			bound:   time.Duration(float64(fall*interval)*1.2) + 500*time.Millisecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const healthyRounds = 3
				var (
					mu     sync.Mutex
					diedAt time.Time
				)
				prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
					if addr != addrA {
						return nil
					}
					switch {
					case n < healthyRounds-1:
						return nil
					case n == healthyRounds-1: // answers, then dies
						mu.Lock()
						diedAt = time.Now()
						mu.Unlock()
						return nil
					}
					return tt.dead(ctx)
				})
				p := newPool(t, upstream.Config{
					Prober: prober, Interval: interval, Timeout: cmp.Or(tt.timeout, timeout), Fall: fall, Jitter: tt.jitter,
				})
				r := record(p)
				stop := startRun(t, p)
				defer stop()
				mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
				advance(30 * time.Second)

				up, ok := r.first(upstream.EventUp, addrA)
				require.True(t, ok)
				down, ok := r.first(upstream.EventDown, addrA)
				require.True(t, ok, "marked down")
				mu.Lock()
				died := diedAt
				mu.Unlock()
				require.True(t, up.Before(died) || up.Equal(died))
				took := down.Sub(died)
				t.Logf("down %v after it died (bound %v), probes at %v", took, tt.bound, prober.times(addrA)[:healthyRounds+fall])
				assert.LessOrEqual(t, took, tt.bound)
				assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrB), "the other endpoint is unaffected")
			})
		})
	}
}

func TestRunProberFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var called []string
		var mu sync.Mutex
		prober := upstream.ProberFunc(func(ctx context.Context, addr string) error {
			mu.Lock()
			called = append(called, addr)
			mu.Unlock()
			if addr == addrA {
				return errors.New("refused")
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		stop := startRun(t, p)
		defer stop()
		assert.ElementsMatch(t, []string{addrA, addrB}, called)
		assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA))
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrB))
		requireOrder(t, p, []string{addrB}, []string{addrA})
	})
}

// knownRTT answers at once and tells the round trip of its address.
type knownRTT map[string]time.Duration

func (r knownRTT) Probe(ctx context.Context, addr string) error { return nil }

func (r knownRTT) ProbeRTT(ctx context.Context, addr string) (time.Duration, error) {
	time.Sleep(time.Millisecond)
	return r[addr], nil
}

// A Prober that tells the round trip (an RTTProber, as a held connection's
// PINGs do) sets the endpoints' RTT and tier, not the probe's duration;
// one that tells zero is timed.
func TestRunRTTProber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(t, upstream.Config{Prober: knownRTT{addrA: 30 * time.Millisecond, addrB: 0}, Interval: time.Second})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
		advance(3 * time.Second)
		assert.Equal(t, 30*time.Millisecond, statusOf(t, p, addrA).RTT)
		assert.Equal(t, time.Millisecond, statusOf(t, p, addrB).RTT)
		assert.Equal(t, []string{addrB, addrA}, p.Candidates(), "B (1ms) is in a nearer tier than A (30ms)")
	})
}

// With QuietInterval, rounds go every QuietInterval while every endpoint
// is healthy with no failure counted, and every Interval otherwise: until
// both are healthy, and from a reported failure (which kicks a round) until
// the endpoint is healthy again.
func TestRunQuietInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, quiet = time.Second, 5 * time.Second
		var failing sync.Map
		prober := newProbeLog(func(_ context.Context, addr string, _ int) error {
			if _, ok := failing.Load(addr); ok {
				return errors.New("refused")
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: interval, QuietInterval: quiet, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		t0 := time.Now()
		mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
		advance(30 * time.Second)
		times := prober.times(addrA)
		require.Len(t, times, 6, "a round a quarter interval after the kick, then every 5s: both healthy after the first")
		assert.Equal(t, t0.Add(interval/4), times[0])
		assert.Equal(t, quiet, times[1].Sub(times[0]))

		// A failure reported between rounds: a round soon, then every
		// Interval until the endpoint is healthy again.
		failing.Store(addrB, true)
		p.ReportFailure(addrB, upstream.FailureConnLost, errors.New("held connection lost"))
		advance(3 * time.Second)
		assert.InDelta(t, 6+4, prober.count(addrA), 1, "kicked round at once, then every second")
		failing.Delete(addrB)
		advance(10 * time.Second)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrB))
		n := prober.count(addrA)
		advance(10 * time.Second)
		assert.Equal(t, n+2, prober.count(addrA), "quiet again: every 5s")
	})
}

// An endpoint that becomes local after the pool was made (the node's
// address configured after the proxy started) is found by the probe
// loop at the second of its reads, every localEvery (30s), that says so,
// and preferred; one that stops being local loses it the same way; an
// answer that changes for one read only changes nothing.
func TestRunFindsLocalEndpointsAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var local atomic.Value
		local.Store("")
		var asked atomic.Int64
		p := newPool(t, upstream.Config{Prober: newProbeLog(nil), Interval: time.Second, Rise: 1,
			IsLocal: func(h string) bool { asked.Add(1); return h == local.Load().(string) }})
		var events []ev
		var mu sync.Mutex
		p.Subscribe(func(e upstream.Event) {
			mu.Lock()
			events = append(events, ev{e.Kind, e.Addr, e.Prev, e.State})
			mu.Unlock()
		})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceStatic, specs("10.0.0.1:6443", "10.0.0.2:6443"))
		advance(5 * time.Second)
		require.Equal(t, upstream.StateHealthy, stateOf(t, p, "10.0.0.2:6443"))
		before := preferredOf(p)
		require.Len(t, before, 1)
		other := "10.0.0.1"
		if before[0] == "10.0.0.1:6443" {
			other = "10.0.0.2"
		}
		isLocal := func() bool { return statusOf(t, p, other+":6443").Local }
		// nextRead advances to just after the probe loop's next read of
		// locality (IsLocal asked for both endpoints), and returns when
		// it came.
		nextRead := func() time.Duration {
			began, n := time.Now(), asked.Load()
			for asked.Load() < n+2 {
				advance(100 * time.Millisecond)
			}
			return time.Since(began)
		}

		local.Store(other)
		took := nextRead()
		assert.GreaterOrEqual(t, took, 20*time.Second, "the first read comes 30s after Run began")
		assert.False(t, isLocal(), "one read said so")
		local.Store("") // gone again before the next read
		took = nextRead()
		assert.InDelta(t, 30*time.Second, took, float64(6*time.Second), "reads every 30s")
		assert.False(t, isLocal(), "it did not hold")

		local.Store(other)
		nextRead()
		assert.False(t, isLocal())
		nextRead()
		assert.True(t, isLocal(), "two reads in a row")
		assert.Equal(t, []string{other + ":6443"}, preferredOf(p), "the local endpoint is preferred")
		mu.Lock()
		assert.Contains(t, events, ev{upstream.EventPreferred, other + ":6443", before[0], upstream.StateHealthy})
		mu.Unlock()

		local.Store("")
		nextRead()
		assert.True(t, isLocal())
		nextRead()
		assert.False(t, isLocal())
	})
}
