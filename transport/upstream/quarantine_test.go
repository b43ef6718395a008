package upstream_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// errCertFor is a probe error as a Prober reports a certificate that does not
// verify (unknown authority).
var errCertFor = fmt.Errorf("tls: failed to verify certificate: %w: %w", upstream.ErrCertificate, x509.UnknownAuthorityError{})

// errNotYetValid is a probe error for a certificate that verifies except for its
// validity period, wrapped as a Prober that knows only ErrCertificate wraps
// it. crypto/x509 uses Reason Expired for "not yet valid" too.
var errNotYetValid = fmt.Errorf("tls: failed to verify certificate: %w: %w", upstream.ErrCertificate, x509.CertificateInvalidError{
	Reason: x509.Expired,
	Detail: "current time 2026-01-01T00:00:00Z is before 2026-01-01T00:00:05Z",
})

// A quarantined endpoint is probed again with backoff (first after 5s, then
// doubling, Jitter off) and becomes healthy on its first successful probe,
// without Set or ResetQuarantine.
func TestQuarantineIsReprobed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr == addrA && n < 3 {
				return errCertFor
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Jitter: -1})
		rec := record(p)
		stop := startRun(t, p)
		defer stop()
		t0 := time.Now()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(time.Second)
		require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA))
		require.False(t, p.Usable(addrA))

		advance(time.Minute)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA), "lifted by a successful probe")
		assert.True(t, p.Usable(addrA))
		assert.Empty(t, statusOf(t, p, addrA).LastError)

		// Rounds run at t0 + 250ms + k s. Re-probes wait 5s, 10s, 20s.
		times := prober.times(addrA)
		require.GreaterOrEqual(t, len(times), 4)
		first := t0.Add(250 * time.Millisecond)
		want := []time.Time{first, first.Add(5 * time.Second), first.Add(15 * time.Second), first.Add(35 * time.Second)}
		assert.Equal(t, want, times[:4])
		// Once lifted, probed every round like the others.
		assert.Equal(t, prober.times(addrB)[35:], times[3:])

		var down, up []upstream.Event
		for _, e := range rec.take() {
			if e.Addr != addrA {
				continue
			}
			switch e.Kind {
			case upstream.EventDown:
				down = append(down, e)
			case upstream.EventUp:
				up = append(up, e)
			}
		}
		require.Len(t, down, 1)
		assert.Equal(t, upstream.StateQuarantined, down[0].State)
		assert.ErrorIs(t, down[0].Err, upstream.ErrCertificate)
		require.Len(t, up, 1, "one EventUp when the quarantine is lifted")
		assert.Equal(t, upstream.StateHealthy, up[0].State)
	})
}

// With default settings every endpoint that presents a bad certificate
// (e.g. while certificates are renewed) is usable again within a minute
// of the certificate being fixed.
func TestQuarantineAllRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		bad := true
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			mu.Lock()
			defer mu.Unlock()
			if bad {
				return errCertFor
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		advance(2 * time.Minute)
		require.False(t, p.Healthy())
		n := prober.count(addrA)
		assert.Less(t, n, 10, "quarantined endpoints are probed with backoff, not every interval")
		assert.Greater(t, n, 3, "quarantined endpoints are probed again")

		mu.Lock()
		bad = false
		mu.Unlock()
		advance(time.Minute)
		for _, a := range []string{addrA, addrB, addrC} {
			assert.Equal(t, upstream.StateHealthy, stateOf(t, p, a), a)
		}
	})
}

// After a quarantine is lifted, passive certificate failures quarantine the
// endpoint again, and its next re-probe waits longer than the last one: a
// prober that does not see the certificate (tcp) and a dialer that does
// cannot make it flip every interval.
func TestQuarantinePassiveNoTightLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(nil) // always succeeds, like a tcp probe
		p := newPool(t, upstream.Config{Prober: prober, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		// The endpoint re-quarantines itself whenever it is usable, as a
		// dialer that handshakes with it at once would.
		var downs []time.Time
		var mu sync.Mutex
		p.Subscribe(func(e upstream.Event) {
			if e.Addr != addrA {
				return
			}
			switch e.Kind {
			case upstream.EventUp:
				p.ReportFailure(addrA, upstream.FailureCertificate, errCertFor)
			case upstream.EventDown:
				mu.Lock()
				downs = append(downs, time.Now())
				mu.Unlock()
			}
		})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		advance(time.Second) // probed: healthy, then quarantined by the dialer
		p.ReportSuccess(addrA)
		require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA), "a passive success does not lift a quarantine")

		advance(3 * time.Minute)
		mu.Lock()
		defer mu.Unlock()
		// Each wait is the backoff, rounded up to the next round (the
		// ReportFailure kicks a round that shifts their cadence).
		s := time.Second
		want := []time.Duration{5 * s, 10 * s, 20 * s, 30 * s, 30 * s, 30 * s, 30 * s}
		require.Len(t, downs, len(want)+1, "downs at %v", downs)
		for i, w := range want {
			gap := downs[i+1].Sub(downs[i])
			assert.True(t, gap >= w && gap < w+s, "gap %d is %v, want %v rounded up to a round", i, gap, w)
		}
	})
}

// A certificate that is not yet valid (or expired) is a transient failure:
// the endpoint is unhealthy, probed every interval, and healthy once the
// probes succeed (Rise 2).
func TestCertificateTimeErrorIsTransient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if n < 3 {
				return errNotYetValid
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		advance(time.Second)
		assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA), "not quarantined")
		advance(2 * time.Second)
		assert.Equal(t, 3, prober.count(addrA), "probed every interval")
		assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA))
		advance(2 * time.Second)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
	})
}

// A passive time-validity failure counts like a TLS failure.
func TestCertificateTimeErrorPassive(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 1})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportSuccess(addrA)
	p.ReportFailure(addrA, upstream.FailureCertificate, errNotYetValid)
	assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA))
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrA)
	assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
}

// concurrencyProber records how many probes run at once; each probe lasts
// 100ms of the bubble's clock, one endpoint never answers.
type concurrencyProber struct {
	dead string

	mu       sync.Mutex
	cur, max int
	calls    map[string][]time.Time
}

func (c *concurrencyProber) Probe(ctx context.Context, addr string) error {
	c.mu.Lock()
	c.cur++
	c.max = max(c.max, c.cur)
	if c.calls == nil {
		c.calls = make(map[string][]time.Time)
	}
	c.calls[addr] = append(c.calls[addr], time.Now())
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.cur--
		c.mu.Unlock()
	}()
	if addr == c.dead {
		return blockUntilDone(ctx)
	}
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// manyAddrs returns n distinct endpoint addresses.
func manyAddrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.1.%d.%d:6443", i/250, i%250+1)
	}
	return out
}

// A round over thousands of endpoints runs at most DefaultMaxConcurrentProbes
// (32) probes at once, and every endpoint is still probed.
func TestProbeFanOutCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr := &concurrencyProber{}
		p := newPool(t, upstream.Config{Prober: pr, Interval: 10 * time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		addrs := manyAddrs(2000)
		mustSet(t, p, upstream.SourceDiscovery, specs(addrs...))
		advance(9 * time.Second) // 2000/32 × 100ms ≈ 6.3s
		pr.mu.Lock()
		defer pr.mu.Unlock()
		assert.Equal(t, 32, pr.max)
		for _, a := range addrs {
			assert.Len(t, pr.calls[a], 1, a)
		}
	})
}

// With few endpoints a dead one does not delay the others: every probe of a
// round starts at once.
func TestProbeFanOutFewEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr := &concurrencyProber{dead: addrA}
		p := newPool(t, upstream.Config{Prober: pr, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		advance(10 * time.Second)
		pr.mu.Lock()
		defer pr.mu.Unlock()
		assert.Equal(t, 3, pr.max)
		assert.Equal(t, pr.calls[addrA], pr.calls[addrB])
		assert.Equal(t, pr.calls[addrA], pr.calls[addrC])
		assert.Len(t, pr.calls[addrA], 10)
	})
}

// MaxConcurrentProbes sets the cap; a negative value removes it.
func TestProbeFanOutConfig(t *testing.T) {
	for _, tt := range []struct {
		max, want int
	}{{5, 5}, {-1, 300}} {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pr := &concurrencyProber{}
				p := newPool(t, upstream.Config{Prober: pr, Interval: 10 * time.Second, Jitter: -1, MaxConcurrentProbes: tt.max})
				stop := startRun(t, p)
				defer stop()
				addrs := manyAddrs(300)
				mustSet(t, p, upstream.SourceDiscovery, specs(addrs...))
				advance(9 * time.Second) // 300/5 × 100ms = 6s
				pr.mu.Lock()
				defer pr.mu.Unlock()
				assert.Equal(t, tt.want, pr.max)
				for _, a := range addrs {
					assert.Len(t, pr.calls[a], 1, a)
				}
			})
		})
	}
}

// The sentinel and the failure kind the transport uses for time-validity
// errors are ordinary failures too, and IsCertificateTimeError decides by
// type.
func TestCertificateTimeErrorKinds(t *testing.T) {
	timeErr := fmt.Errorf("tls: %w: %w", upstream.ErrCertificateTime, x509.CertificateInvalidError{Reason: x509.Expired})
	assert.True(t, upstream.IsCertificateTimeError(timeErr))
	assert.True(t, upstream.IsCertificateTimeError(errNotYetValid))
	assert.True(t, upstream.IsCertificateTimeError(upstream.ErrCertificateTime))
	assert.False(t, upstream.IsCertificateTimeError(errCertFor))
	assert.False(t, upstream.IsCertificateTimeError(x509.CertificateInvalidError{Reason: x509.NotAuthorizedToSign}))
	assert.False(t, upstream.IsCertificateTimeError(x509.HostnameError{}))
	assert.False(t, upstream.IsCertificateTimeError(nil))
	assert.Equal(t, "certificate_time", upstream.FailureCertificateTime.String())

	for _, tt := range []struct {
		name string
		f    upstream.Failure
		err  error
	}{
		{"FailureCertificateTime", upstream.FailureCertificateTime, timeErr},
		{"FailureCertificateTime without error", upstream.FailureCertificateTime, nil},
		{"FailureTLS with ErrCertificateTime", upstream.FailureTLS, timeErr},
		{"FailureCertificate with a time error", upstream.FailureCertificate, timeErr},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, upstream.Config{Fall: 2})
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
			p.ReportSuccess(addrA)
			p.ReportFailure(addrA, tt.f, tt.err)
			s := statusOf(t, p, addrA)
			assert.Equal(t, upstream.StateHealthy, s.State, "one failure is not Fall")
			assert.True(t, s.Suspect)
			p.ReportFailure(addrA, tt.f, tt.err)
			assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA))
		})
	}
}

// Set with a different spec and ResetQuarantine lift a quarantine and start
// its backoff over.
func TestQuarantineResetStartsBackoffOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error { return errCertFor })
		p := newPool(t, upstream.Config{Prober: prober, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		advance(time.Minute) // probes at 0.25, 5.25, 15.25, 35.25
		require.Equal(t, 4, prober.count(addrA))
		p.ResetQuarantine() // probed at once, quarantined again
		synctest.Wait()
		require.Equal(t, 5, prober.count(addrA))
		reset := time.Now()
		advance(6 * time.Second)
		times := prober.times(addrA)
		require.Len(t, times, 6)
		assert.Equal(t, reset.Add(5*time.Second), times[5], "the backoff started over")
	})
}

// LastProbeActivity moves on every round, also when every endpoint is
// quarantined and no probe is due: liveness checks built on it (localproxy's
// /healthz) see a probe loop that runs.
func TestLastProbeActivity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error { return errCertFor })
		p := newPool(t, upstream.Config{Prober: prober})
		assert.True(t, p.LastProbeActivity().IsZero(), "before Run")
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		for range 120 {
			advance(time.Second)
			age := time.Since(p.LastProbeActivity())
			require.LessOrEqual(t, age, 2*time.Second)
		}
		assert.Less(t, prober.count(addrA), 10)
	})
}

// LastProbeActivity carries a monotonic reading, so that its age, as
// time.Since gives it, ignores steps of the wall clock: Unix nanoseconds
// read back with time.Unix have none, and a clock stepped back an hour
// left /healthz blind for that hour.
func TestLastProbeActivityIsMonotonic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error { return nil })
		p := newPool(t, upstream.Config{Prober: prober})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		advance(2 * time.Second)
		require.False(t, p.LastProbeActivity().IsZero())
		assert.Contains(t, p.LastProbeActivity().String(), " m=")
		assert.Less(t, time.Since(p.LastProbeActivity()), 2*time.Second)
	})
}
