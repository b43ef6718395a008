package upstream_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// An RTT hovering around a tier boundary must not move the preference
// back and forth; an RTT clearly in a worse tier still does.
func TestOrderRTTHysteresis(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A alternates 8ms and 13ms (its average crosses 10ms, the tier
		// 1/2 boundary, again and again), then answers in 40ms. B answers
		// in 3ms (tier 1).
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			d := 3 * time.Millisecond
			if addr == addrA {
				switch {
				case n >= 20:
					d = 40 * time.Millisecond
				case n%2 == 0:
					d = 8 * time.Millisecond
				default:
					d = 13 * time.Millisecond
				}
			}
			time.Sleep(d)
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		advance(300 * time.Millisecond)
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		r := record(p)

		crossed := false
		for range 18 {
			advance(time.Second)
			if statusOf(t, p, addrA).RTT >= 10*time.Millisecond {
				crossed = true
			}
			pick, err := p.Pick()
			require.NoError(t, err)
			require.Equal(t, addrA, pick, "A (RTT %v) lost the preference", statusOf(t, p, addrA).RTT)
		}
		require.True(t, crossed, "the test never took A's average over the boundary")
		for _, e := range r.take() {
			assert.NotEqual(t, upstream.EventPreferred, e.Kind, "preference moved: %+v", e)
		}

		for range 10 { // A converges on 40ms: clearly tier 2
			advance(time.Second)
		}
		pick, err := p.Pick()
		require.NoError(t, err)
		assert.Equal(t, addrB, pick, "A at %v", statusOf(t, p, addrA).RTT)
	})
}

// A server that hangs keeps every connection it accepted waiting for its
// first byte. When it is alone in the best RTT tier, waiting alone (a
// tie-break within a tier) would send it every new connection until the
// first one passes its first-byte deadline (AddStalled); with two
// waiting, it ranks as one tier slower, so the next connection goes to
// the next tier's endpoint, and no further: a burst of new connections to
// healthy servers spreads over one tier more, not over all of them. The
// preference does not move.
func TestCrowdedRanksOneTierSlower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rtts := map[string]time.Duration{
			addrA: 1 * time.Millisecond,  // tier 0
			addrB: 5 * time.Millisecond,  // tier 1
			addrC: 30 * time.Millisecond, // tier 2
		}
		p := newPool(t, upstream.Config{Prober: rttProber(rtts), Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		advance(time.Second)
		requireOrder(t, p, []string{addrA}, []string{addrB}, []string{addrC})
		r := record(p)

		p.AddWaiting(addrA, 1)
		requireCandidates(t, p, addrA, addrB, addrC) // one waiting: a handshake under way
		p.AddWaiting(addrA, 1)
		requireCandidates(t, p, addrB, addrA, addrC)
		p.AddWaiting(addrA, 5)
		requireCandidates(t, p, addrB, addrA, addrC) // one tier, however many wait
		p.AddWaiting(addrB, 1)
		requireCandidates(t, p, addrB, addrA, addrC) // within the tier, fewer waiting first
		p.AddWaiting(addrB, 1)
		requireCandidates(t, p, addrA, addrC, addrB) // B crowded too: tier 2, after C (fewer waiting)

		p.AddWaiting(addrA, -7)
		p.AddWaiting(addrB, -2)
		requireCandidates(t, p, addrA, addrB, addrC)
		for _, e := range r.take() {
			assert.NotEqual(t, upstream.EventPreferred, e.Kind, "preference moved: %+v", e)
		}
	})
}

// requireCandidates requires the candidate order want, and Pick to give
// its first.
func requireCandidates(t *testing.T, p *upstream.Pool, want ...string) {
	t.Helper()
	require.Equal(t, want, p.Candidates())
	pick, err := p.Pick()
	require.NoError(t, err)
	require.Equal(t, want[0], pick)
}
