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
