package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// requireOrder checks that Candidates, Pick and Status agree and that the
// candidates come in the given groups; the order inside a group is free.
func requireOrder(t *testing.T, p *upstream.Pool, groups ...[]string) {
	t.Helper()
	got := p.Candidates()
	var n int
	for _, g := range groups {
		n += len(g)
	}
	require.Len(t, got, n, "candidates %v", got)
	i := 0
	for gi, g := range groups {
		assert.ElementsMatch(t, g, got[i:i+len(g)], "group %d of %v", gi, got)
		i += len(g)
	}
	pick, err := p.Pick()
	require.NoError(t, err)
	assert.Equal(t, got[0], pick, "Pick is the first candidate")
	st := p.Status()
	require.Len(t, st, len(got))
	for i, s := range st {
		assert.Equal(t, got[i], s.Addr, "Status is in candidate order")
	}
	assert.Equal(t, []string{got[0]}, preferredOf(p), "exactly the first candidate is preferred")
}

func TestOrderHealth(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 3})
	mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC, addrD, addrE, addrF))
	// A healthy, B unknown, C suspect, D draining, E unhealthy, F quarantined.
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrC)
	p.ReportFailure(addrC, upstream.FailureConnLost, nil)
	p.ReportSuccess(addrD)
	p.ReportFailure(addrD, upstream.FailureGoAway, nil)
	p.ReportFailure(addrE, upstream.FailureDial, nil)
	p.ReportFailure(addrF, upstream.FailureCertificate, nil)
	requireOrder(t, p, []string{addrA}, []string{addrB}, []string{addrC, addrD}, []string{addrE}, []string{addrF})

	// Everything recovers but F; equals keep the current preference.
	p.ReportSuccess(addrB)
	p.ReportSuccess(addrC)
	p.ReportSuccess(addrD)
	for range 2 {
		p.ReportSuccess(addrE)
	}
	requireOrder(t, p, []string{addrA}, []string{addrB, addrC, addrD, addrE}, []string{addrF})
}

// A connection race hedges with endpoints as healthy as its first
// candidate was when it began only (HedgeBar); one that was down may be
// followed by anything. The bar stays when the first candidate's health
// drops afterwards (its attempt failed).
func TestMayHedge(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 3})
	mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC, addrD, addrE))
	// A and B healthy, C unknown, D suspect, E unhealthy.
	for _, a := range []string{addrA, addrB, addrD} {
		p.ReportSuccess(a)
	}
	p.ReportFailure(addrD, upstream.FailureConnLost, nil)
	p.ReportFailure(addrE, upstream.FailureDial, nil)
	for _, tc := range []struct {
		first, next string
		want        bool
	}{
		{addrA, addrB, true}, {addrA, addrC, false}, {addrA, addrD, false}, {addrA, addrE, false},
		{addrD, addrA, true}, {addrD, addrE, false}, {addrE, addrD, true}, {addrE, addrE, true},
		{addrA, "192.0.2.9:6443", true}, {"192.0.2.9:6443", addrE, true},
	} {
		assert.Equal(t, tc.want, p.MayHedge(p.HedgeBars([]string{tc.first})[0], tc.next), "MayHedge(HedgeBars(%s), %s)", tc.first, tc.next)
	}
	bars := p.HedgeBars([]string{addrA, addrE})
	p.ReportFailure(addrA, upstream.FailureDial, nil)
	p.ReportFailure(addrA, upstream.FailureDial, nil)
	p.ReportFailure(addrA, upstream.FailureDial, nil)
	require.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrA))
	assert.False(t, p.MayHedge(bars[0], addrE), "A's failure does not lower the bar of A's attempt")
	assert.True(t, p.MayHedge(bars[0], addrB))
	assert.True(t, p.MayHedge(bars[1], addrA), "E's attempt, E down when the race began")
	assert.False(t, p.MayHedge(bars[0].Stricter(bars[1]), addrE), "with A's attempt in flight too")
	assert.False(t, p.MayHedge(bars[1].Stricter(bars[0]), addrE))
	assert.True(t, p.MayHedge(upstream.HedgeBar{}.Stricter(bars[1]), addrE), "the zero bar lets every endpoint hedge")
	assert.True(t, p.MayHedge(upstream.HedgeBar{}, addrE))
}

func TestOrderSuspectBelowUnknown(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 2})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportSuccess(addrA)
	mustSet(t, p, upstream.SourceDiscovery, specs(addrB))
	requireOrder(t, p, []string{addrA}, []string{addrB})

	p.ReportFailure(addrA, upstream.FailureDial, nil)
	requireOrder(t, p, []string{addrB}, []string{addrA})
	assert.True(t, statusOf(t, p, addrA).Suspect)
}

func TestOrderLocality(t *testing.T) {
	isLocal := func(host string) bool { return host == "10.0.0.5" || host == "fe80::5%eth0" }
	tests := []struct {
		name   string
		zone   string
		specs  []upstream.Spec
		groups [][]string
	}{
		{
			name: "local before same zone before others",
			zone: "z1",
			specs: []upstream.Spec{
				{Addr: addrA, Zone: "z2"},
				{Addr: addrB, Zone: "z1"},
				{Addr: addrC},
				{Addr: addrD, Zone: "z1"},
				{Addr: addrE, Zone: "z2"}, // local, in another zone
			},
			groups: [][]string{{addrE}, {addrB, addrD}, {addrA, addrC}},
		},
		{
			name: "zones ignored without a client zone",
			specs: []upstream.Spec{
				{Addr: addrA, Zone: "z2"},
				{Addr: addrB, Zone: "z1"},
				{Addr: addrC},
				{Addr: addrE},
			},
			groups: [][]string{{addrE}, {addrA, addrB, addrC}},
		},
		{
			name: "no zone matches",
			zone: "z9",
			specs: []upstream.Spec{
				{Addr: addrA, Zone: "z2"},
				{Addr: addrB, Zone: "z1"},
			},
			groups: [][]string{{addrA, addrB}},
		},
		{
			name: "ipv6 with zone",
			specs: []upstream.Spec{
				{Addr: "[fe80::5%eth0]:6443"},
				{Addr: "[fe80::6%eth0]:6443"},
			},
			groups: [][]string{{"[fe80::5%eth0]:6443"}, {"[fe80::6%eth0]:6443"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, upstream.Config{Zone: tt.zone, IsLocal: isLocal})
			mustSet(t, p, upstream.SourceDiscovery, tt.specs)
			requireOrder(t, p, tt.groups...)
			// The same with every endpoint healthy.
			for _, s := range tt.specs {
				addr, err := upstream.ParseAddr(s.Addr)
				require.NoError(t, err)
				p.ReportSuccess(addr)
			}
			requireOrder(t, p, tt.groups...)
		})
	}
}

func TestOrderHealthBeforeLocality(t *testing.T) {
	p := newPool(t, upstream.Config{Zone: "z1", IsLocal: func(h string) bool { return h == "10.0.0.1" }})
	mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA}, {Addr: addrB, Zone: "z1"}, {Addr: addrC}})
	p.ReportSuccess(addrC)
	requireOrder(t, p, []string{addrC}, []string{addrA}, []string{addrB})

	p.ReportFailure(addrA, upstream.FailureDial, nil)
	requireOrder(t, p, []string{addrC}, []string{addrB}, []string{addrA})
	assert.True(t, statusOf(t, p, addrA).Local)
}

// rttProber takes a fixed amount of simulated time per endpoint.
func rttProber(rtts map[string]time.Duration) *probeLog {
	return newProbeLog(func(ctx context.Context, addr string, n int) error {
		d, ok := rtts[addr]
		if !ok {
			return errors.New("unexpected probe")
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

func TestOrderRTT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rtts := map[string]time.Duration{
			addrA: 300 * time.Millisecond, // tier 4
			addrB: 100 * time.Millisecond, // tier 3
			addrC: 30 * time.Millisecond,  // tier 2
			addrD: 5 * time.Millisecond,   // tier 1
			addrE: 1 * time.Millisecond,   // tier 0
			addrF: 0,                      // answers at once: RTT unknown, tier 2
		}
		p := newPool(t, upstream.Config{Prober: rttProber(rtts), Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC, addrD, addrE, addrF))
		advance(time.Second)

		requireOrder(t, p, []string{addrE}, []string{addrD}, []string{addrC, addrF}, []string{addrB}, []string{addrA})
		for addr, d := range rtts {
			s := statusOf(t, p, addr)
			assert.Equal(t, upstream.StateHealthy, s.State, addr)
			assert.Equal(t, d, s.RTT, "first sample of %s", addr)
		}
	})
}

func TestOrderRTTMovingAverage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A answers in 1ms, then 20ms; the average moves by 30% a sample.
		rtt := []time.Duration{time.Millisecond, 20 * time.Millisecond}
		prober := newProbeLog(func(ctx context.Context, addr string, n int) error {
			d := rtt[min(n, len(rtt)-1)]
			if addr == addrB {
				d = 3 * time.Millisecond // tier 1
			}
			time.Sleep(d)
			return nil
		})
		p := newPool(t, upstream.Config{Prober: prober, Interval: time.Second, Jitter: -1})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))

		// Run's first round found no endpoint; the kick from Set starts the
		// next one a quarter interval after it.
		advance(300 * time.Millisecond)
		require.Equal(t, 1, prober.count(addrA))
		assert.Equal(t, time.Millisecond, statusOf(t, p, addrA).RTT)
		requireOrder(t, p, []string{addrA}, []string{addrB})

		advance(time.Second) // second round
		require.Equal(t, 2, prober.count(addrA))
		want := (time.Millisecond*7 + 20*time.Millisecond*3) / 10 // 6.7ms: tier 1
		assert.Equal(t, want, statusOf(t, p, addrA).RTT)
		requireOrder(t, p, []string{addrA}, []string{addrB}) // equal tiers: A stays preferred

		for range 10 { // A converges on 20ms: tier 2
			advance(time.Second)
		}
		assert.Greater(t, statusOf(t, p, addrA).RTT, 10*time.Millisecond)
		requireOrder(t, p, []string{addrB}, []string{addrA})
	})
}

func TestOrderLocalityBeforeRTT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rtts := map[string]time.Duration{addrA: 500 * time.Millisecond, addrB: time.Millisecond}
		p := newPool(t, upstream.Config{
			Prober:  rttProber(rtts),
			Jitter:  -1,
			IsLocal: func(h string) bool { return h == "10.0.0.1" },
		})
		stop := startRun(t, p)
		defer stop()
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		advance(time.Second)
		requireOrder(t, p, []string{addrA}, []string{addrB})
	})
}

// TestStickiness checks that the preferred endpoint stays first among
// equals. Across many pools (random tie seeds) the newcomer would win the
// tie about half the time without stickiness.
func TestStickiness(t *testing.T) {
	const pools = 100
	wouldWin := 0
	for i := range pools {
		fresh := newPool(t, upstream.Config{})
		mustSet(t, fresh, upstream.SourceDiscovery, specs(addrA, addrB))
		if c := fresh.Candidates(); c[0] == addrB {
			wouldWin++
		}

		p := newPool(t, upstream.Config{})
		r := record(p)
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		p.ReportSuccess(addrA)
		require.Equal(t, []ev{
			{Kind: upstream.EventAdded, Addr: addrA},
			{Kind: upstream.EventPreferred, Addr: addrA},
			{Kind: upstream.EventUp, Addr: addrA, State: upstream.StateHealthy},
		}, r.short(), "pool %d", i)

		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		p.ReportSuccess(addrB)
		pick, err := p.Pick()
		require.NoError(t, err)
		require.Equal(t, addrA, pick, "pool %d: the preferred endpoint stays first", i)
		require.Equal(t, []ev{
			{Kind: upstream.EventAdded, Addr: addrB},
			{Kind: upstream.EventUp, Addr: addrB, State: upstream.StateHealthy},
		}, r.short(), "pool %d: no EventPreferred for an equal newcomer", i)
	}
	assert.Greater(t, wouldWin, pools/5, "the newcomer wins the tie in some fresh pools")
	assert.Less(t, wouldWin, pools*4/5, "the newcomer loses the tie in some fresh pools")
}

func TestPreferredEvents(t *testing.T) {
	isLocal := func(h string) bool { return h == "10.0.0.3" }
	p := newPool(t, upstream.Config{Fall: 2, Zone: "z1", IsLocal: isLocal})
	r := record(p)
	mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
	p.ReportSuccess(addrA)
	r.take()

	steps := []struct {
		name string
		do   func()
		want []ev
	}{
		{"equal newcomer: nothing", func() {
			mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
			p.ReportSuccess(addrB)
		}, []ev{
			{Kind: upstream.EventAdded, Addr: addrB},
			{Kind: upstream.EventUp, Addr: addrB, State: upstream.StateHealthy},
		}},
		{"preferred gets worse: suspect", func() {
			p.ReportFailure(addrA, upstream.FailureConnLost, nil)
		}, []ev{
			{Kind: upstream.EventPreferred, Addr: addrB, Prev: addrA, State: upstream.StateHealthy},
		}},
		{"old one recovers to equal: no flap back", func() {
			p.ReportSuccess(addrA)
		}, nil},
		{"repeated successes: nothing", func() {
			p.ReportSuccess(addrA)
			p.ReportSuccess(addrB)
		}, nil},
		{"same zone arrives: strictly better once healthy", func() {
			mustSet(t, p, upstream.SourceAltSvc, []upstream.Spec{{Addr: addrD, Zone: "z1"}})
			p.ReportSuccess(addrD)
		}, []ev{
			{Kind: upstream.EventAdded, Addr: addrD},
			{Kind: upstream.EventUp, Addr: addrD, State: upstream.StateHealthy},
			{Kind: upstream.EventPreferred, Addr: addrD, Prev: addrB, State: upstream.StateHealthy},
		}},
		{"local arrives unknown: not better than healthy", func() {
			mustSet(t, p, upstream.SourceStateFile, specs(addrC))
		}, []ev{
			{Kind: upstream.EventAdded, Addr: addrC},
		}},
		{"local becomes healthy: strictly better", func() {
			p.ReportSuccess(addrC)
		}, []ev{
			{Kind: upstream.EventUp, Addr: addrC, State: upstream.StateHealthy},
			{Kind: upstream.EventPreferred, Addr: addrC, Prev: addrD, State: upstream.StateHealthy},
		}},
		{"preferred drains", func() {
			p.ReportFailure(addrC, upstream.FailureGoAway, nil)
		}, []ev{
			{Kind: upstream.EventPreferred, Addr: addrD, Prev: addrC, State: upstream.StateHealthy},
		}},
		{"local recovers: strictly better again", func() {
			p.ReportSuccess(addrC)
		}, []ev{
			{Kind: upstream.EventPreferred, Addr: addrC, Prev: addrD, State: upstream.StateHealthy},
		}},
		{"preferred removed", func() {
			mustSet(t, p, upstream.SourceStateFile, nil)
		}, []ev{
			{Kind: upstream.EventRemoved, Addr: addrC, State: upstream.StateHealthy},
			{Kind: upstream.EventPreferred, Addr: addrD, Prev: addrC, State: upstream.StateHealthy},
		}},
		{"everything removed: no preferred event", func() {
			mustSet(t, p, upstream.SourceAltSvc, nil)
			mustSet(t, p, upstream.SourceDiscovery, nil)
		}, nil},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do()
			got := r.short()
			if st.name == "everything removed: no preferred event" {
				// D goes, then A or B (equals: the tie decides) is preferred,
				// then both go in map order and nothing is preferred.
				require.Len(t, got, 4)
				assert.Equal(t, ev{Kind: upstream.EventRemoved, Addr: addrD, State: upstream.StateHealthy}, got[0])
				assert.Equal(t, upstream.EventPreferred, got[1].Kind)
				assert.Contains(t, []string{addrA, addrB}, got[1].Addr)
				assert.Equal(t, addrD, got[1].Prev)
				assert.ElementsMatch(t, []ev{
					{Kind: upstream.EventRemoved, Addr: addrA, State: upstream.StateHealthy},
					{Kind: upstream.EventRemoved, Addr: addrB, State: upstream.StateHealthy},
				}, got[2:])
				_, err := p.Pick()
				assert.ErrorIs(t, err, upstream.ErrNoEndpoints)
				return
			}
			assert.Equal(t, st.want, got)
		})
	}
}

func TestFailOpen(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 1, IsLocal: func(h string) bool { return h == "10.0.0.1" }})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB, addrC))
	mustSet(t, p, upstream.SourceDiscovery, specs(addrC, addrD, addrE, addrF))
	// A, B static only (A local); C static and discovery; D, E, F discovery.
	for _, a := range []string{addrA, addrB, addrC, addrD, addrE} {
		p.ReportFailure(a, upstream.FailureDial, nil)
	}
	p.ReportFailure(addrF, upstream.FailureCertificate, nil)

	assert.False(t, p.Healthy())
	requireOrder(t, p,
		[]string{addrA},               // local first, even static only
		[]string{addrC, addrD, addrE}, // unhealthy, known from discovery
		[]string{addrB},               // static only
		[]string{addrF},               // quarantined
	)

	// One healthy endpoint goes first, even a static-only one; the rest keep
	// their fail-open order.
	p.ReportSuccess(addrB)
	p.ReportSuccess(addrB) // Rise
	requireOrder(t, p, []string{addrB}, []string{addrA}, []string{addrC, addrD, addrE}, []string{addrF})
}

func TestNeverEmpty(t *testing.T) {
	p := newPool(t, upstream.Config{})
	_, err := p.Pick()
	assert.ErrorIs(t, err, upstream.ErrNoEndpoints)
	assert.Empty(t, p.Candidates())
	assert.Empty(t, p.Status())
	assert.False(t, p.Healthy())

	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportFailure(addrA, upstream.FailureCertificate, nil)
	pick, err := p.Pick()
	require.NoError(t, err)
	assert.Equal(t, addrA, pick, "a quarantined endpoint is still a candidate")
	assert.Equal(t, []string{addrA}, p.Candidates())

	mustSet(t, p, upstream.SourceStatic, nil)
	_, err = p.Pick()
	assert.ErrorIs(t, err, upstream.ErrNoEndpoints)
	assert.Empty(t, p.Candidates())
}

func TestTieSpreading(t *testing.T) {
	const pools = 300
	addrs := []string{addrA, addrB, addrC}
	first := make(map[string]int)
	for range pools {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrs...))
		pick, err := p.Pick()
		require.NoError(t, err)
		first[pick]++
	}
	for _, a := range addrs {
		// Expected 100 each; 60 is about 5 standard deviations below.
		assert.GreaterOrEqual(t, first[a], pools/5, "%s first in %d of %d pools: %v", a, first[a], pools, first)
	}
}

// TestTieSpreadingAfterProbes checks that a probe round which finds every
// endpoint healthy keeps the spread: its results are applied together.
func TestTieSpreadingAfterProbes(t *testing.T) {
	const pools = 300
	addrs := []string{addrA, addrB, addrC}
	first := make(map[string]int)
	for range pools {
		synctest.Test(t, func(t *testing.T) {
			p := newPool(t, upstream.Config{Prober: newProbeLog(nil)})
			mustSet(t, p, upstream.SourceDiscovery, specs(addrs...))
			stop := startRun(t, p)
			for _, a := range addrs {
				require.Equal(t, upstream.StateHealthy, stateOf(t, p, a))
			}
			pick, err := p.Pick()
			require.NoError(t, err)
			first[pick]++
			stop()
		})
	}
	for _, a := range addrs {
		assert.GreaterOrEqual(t, first[a], pools/5, "%s first in %d of %d pools: %v", a, first[a], pools, first)
	}
}

func TestTieOrderStable(t *testing.T) {
	// Within one pool, equal endpoints keep their order across rebuilds.
	p := newPool(t, upstream.Config{Fall: 3})
	var addrs []string
	for i := range 20 {
		addrs = append(addrs, fmt.Sprintf("10.0.1.%d:6443", i+1))
	}
	mustSet(t, p, upstream.SourceDiscovery, specs(addrs...))
	for _, a := range addrs {
		p.ReportSuccess(a)
	}
	before := p.Candidates()
	mustSet(t, p, upstream.SourceAltSvc, specs(addrs[:5]...))
	assert.Equal(t, before, p.Candidates(), "a new source changes nothing")
	// A failure and recovery of the last one puts it back in place.
	last := before[len(before)-1]
	p.ReportFailure(last, upstream.FailureDial, nil)
	assert.Equal(t, last, p.Candidates()[len(before)-1])
	mid := before[10]
	p.ReportFailure(mid, upstream.FailureDial, nil)
	assert.ElementsMatch(t, []string{mid, last}, p.Candidates()[len(before)-2:], "suspect endpoints go last")
	p.ReportSuccess(last)
	p.ReportSuccess(mid)
	assert.Equal(t, before, p.Candidates())
}

// TestOrderStaticLastResort: within a health class and locality, endpoints
// known only from static configuration (the origin, maybe a VIP) come after
// discovered ones; health and locality still come first.
func TestOrderStaticLastResort(t *testing.T) {
	isLocal := func(h string) bool { return false }
	staticA := func(p *upstream.Pool) {
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		mustSet(t, p, upstream.SourceDiscovery, specs(addrB, addrC))
	}
	tests := []struct {
		name   string
		setup  func(p *upstream.Pool)
		groups [][]string
	}{
		{"unknown", staticA, [][]string{{addrB, addrC}, {addrA}}},
		{"healthy", func(p *upstream.Pool) {
			staticA(p)
			for _, a := range []string{addrA, addrB, addrC} {
				p.ReportSuccess(a)
			}
		}, [][]string{{addrB, addrC}, {addrA}}},
		{"static and discovered is no last resort", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
		}, [][]string{{addrA, addrB, addrC}}},
		{"health first", func(p *upstream.Pool) {
			staticA(p)
			p.ReportSuccess(addrA)
		}, [][]string{{addrA}, {addrB, addrC}}},
		{"last resort again when discovery drops it", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
			mustSet(t, p, upstream.SourceDiscovery, specs(addrB, addrC))
		}, [][]string{{addrB, addrC}, {addrA}}},
	}
	t.Run("local static beats remote discovered", func(t *testing.T) {
		p := newPool(t, upstream.Config{IsLocal: func(h string) bool { return h == "10.0.0.1" }})
		staticA(p)
		requireOrder(t, p, []string{addrA}, []string{addrB, addrC})
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, upstream.Config{IsLocal: isLocal})
			tt.setup(p)
			requireOrder(t, p, tt.groups...)
		})
	}
}

// TestOrderSourceAdded: an endpoint first known only statically stops being
// the last resort once discovery lists it too.
func TestOrderSourceAdded(t *testing.T) {
	p := newPool(t, upstream.Config{IsLocal: func(string) bool { return false }})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	mustSet(t, p, upstream.SourceDiscovery, specs(addrB, addrC))
	require.Equal(t, addrA, p.Candidates()[2], "static only: last resort")
	// Make B and C rank below A once A is no last resort: they are suspect.
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrB)
	p.ReportSuccess(addrC)
	require.Equal(t, addrA, p.Candidates()[2])
	mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
	assert.Equal(t, upstream.SourceStatic|upstream.SourceDiscovery, statusOf(t, p, addrA).Sources)
	requireOrder(t, p, []string{addrA, addrB, addrC})
}

// AddWaiting re-sorts the candidate order only when the count moves its
// endpoint past a neighbour: whatever the endpoints' other keys (zone,
// static or discovered, health, suspicion), the order after each change
// is the one a full re-sort gives (forced here by AddStalled with 0, which
// changes no count). Changes of health between them move the preferred
// endpoint, and stickiness with it: the order follows that too.
func TestAddWaitingOrdersAsAFullSort(t *testing.T) {
	addrs := []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443", "10.0.0.5:6443"}
	moved, preferred := 0, 0
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		p := newPool(t, upstream.Config{Zone: "a"})
		var disc, static []upstream.Spec
		for _, a := range addrs {
			s := upstream.Spec{Addr: a, Zone: []string{"a", "a", "b"}[rng.IntN(3)]}
			if rng.IntN(4) == 0 {
				static = append(static, s)
			} else {
				disc = append(disc, s)
			}
		}
		mustSet(t, p, upstream.SourceDiscovery, disc)
		mustSet(t, p, upstream.SourceStatic, static)
		waiting := map[string]int{}
		for i := range 300 {
			a := addrs[rng.IntN(len(addrs))]
			pref := slices.Clone(preferredOf(p))
			before := p.Candidates()
			op := ""
			switch rng.IntN(6) {
			case 0:
				op = "success"
				p.ReportSuccess(a)
			case 1:
				op = "silent"
				p.ReportFailure(a, upstream.FailureSilent, nil)
			default:
				n := 1
				if waiting[a] > 0 && rng.IntN(2) == 0 {
					n = -1
				}
				op = fmt.Sprintf("AddWaiting %d", n)
				p.AddWaiting(a, n)
				waiting[a] += n
			}
			got := p.Candidates()
			if op[0] == 'A' && !slices.Equal(before, got) {
				moved++
			}
			if !slices.Equal(preferredOf(p), pref) {
				preferred++
			}
			p.AddStalled(a, 0)
			require.Equal(t, p.Candidates(), got, "seed %d, change %d: the order after %s of %s, waiting %v", seed, i, op, a, waiting)
		}
	}
	t.Logf("of 6000 changes, %d of the waiting count moved an endpoint, and %d moved the preferred endpoint", moved, preferred)
	require.Greater(t, moved, 200, "too few changes of the waiting count moved an endpoint: the test proves little")
	require.Greater(t, preferred, 50, "the preferred endpoint moved too rarely: the test proves little")
}
