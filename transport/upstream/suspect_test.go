package upstream_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// A connection waiting past its first-byte deadline (stalled) sends new
// connections elsewhere at once, even to an endpoint in a worse RTT tier:
// a server that stopped answering is often the fastest one until then.
// A connection merely waiting does not: that only breaks ties.
func TestStalledRanksBeforeRTTTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			d := 5 * time.Millisecond // tier 1
			if addr == addrA {
				d = time.Millisecond // tier 0
			}
			time.Sleep(d)
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(3 * time.Second)
		require.Equal(t, []string{addrA, addrB}, p.Candidates(), "A is in the better tier")

		p.AddWaiting(addrA, 1)
		assert.Equal(t, addrA, p.Candidates()[0], "a connection waiting within its deadline moved new ones to a worse tier")
		p.AddStalled(addrA, 1)
		assert.Equal(t, []string{addrB, addrA}, p.Candidates(), "new connections still go to the endpoint that stalled")
		assert.Equal(t, 1, statusOf(t, p, addrA).Stalled)
		assert.False(t, p.Outranks(addrA, addrB), "a stalled endpoint draws connections back by fail-back")

		// The first byte came: back to the better tier.
		p.AddStalled(addrA, -1)
		p.AddWaiting(addrA, -1)
		assert.Equal(t, []string{addrA, addrB}, p.Candidates())
		p.AddStalled(addrA, -5)
		assert.Zero(t, statusOf(t, p, addrA).Stalled, "negative")
	})
}

// A probe lifts a suspicion only if it was made for it: asked after the
// endpoint became suspect, with upstream.Suspected(ctx) true, so that a
// prober answering from what it saw earlier (a held connection's last
// PING) checks anew. A probe that was under way when the suspicion came
// counts as a success but leaves the endpoint suspect.
func TestProbeLiftsOnlyTheSuspicionItWasAskedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu        sync.Mutex
			suspected []bool
			hold      chan struct{}
		)
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			if addr != addrA {
				return nil
			}
			mu.Lock()
			suspected = append(suspected, upstream.Suspected(ctx))
			h := hold
			mu.Unlock()
			if h != nil {
				<-h
			}
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(1500 * time.Millisecond)
		require.False(t, statusOf(t, p, addrA).Suspect)

		// The next round's probe of A is under way when A goes silent.
		mu.Lock()
		hold = make(chan struct{})
		h := hold
		mu.Unlock()
		advance(time.Second)
		p.ReportFailure(addrA, upstream.FailureSilent, nil)
		// The round ends with the probe under way; the round the failure
		// kicked starts at once and waits in its probe of A.
		mu.Lock()
		h2 := make(chan struct{})
		hold = h2
		mu.Unlock()
		close(h)
		synctest.Wait()
		s := statusOf(t, p, addrA)
		assert.True(t, s.Suspect, "a probe begun before the suspicion lifted it")
		assert.Equal(t, upstream.StateHealthy, s.State)
		mu.Lock()
		require.GreaterOrEqual(t, len(suspected), 3)
		assert.False(t, suspected[len(suspected)-2], "the probe under way was asked as for a suspect endpoint")
		assert.True(t, suspected[len(suspected)-1], "the probe after the suspicion was not told")
		hold = nil
		mu.Unlock()

		// Its success lifts the suspicion.
		close(h2)
		synctest.Wait()
		assert.False(t, statusOf(t, p, addrA).Suspect)
		assert.False(t, upstream.Suspected(context.Background()))
	})
}
