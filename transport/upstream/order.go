package upstream

import (
	"cmp"
	"net"
	"slices"
	"time"
)

// rankKey orders endpoints; smaller is better. Fields are compared in order.
type rankKey struct {
	class      int // health: see healthClass
	stalled    int // connections waiting past their first-byte deadline (AddStalled)
	locality   int // 0 local, 1 same zone, 2 elsewhere
	lastResort int // 1 for an endpoint known only from static config
	tier       int // RTT tier, see rttTier and stickyTier; compared as rankedTier
	waiting    int // connections waiting for their first byte (AddWaiting)
	notPref    int // 0 for the currently preferred endpoint: stickiness
	tie        uint64
}

// healthClass ranks health: healthy, unknown, suspect or draining or slow,
// unhealthy, quarantined.
func healthClass(e *endpoint) int {
	switch {
	case e.state == StateQuarantined:
		return 4
	case e.state == StateUnhealthy:
		return 3
	case e.suspect || e.draining || !e.slowUntil.IsZero():
		return 2
	case e.state == StateUnknown:
		return 1
	}
	return 0
}

// rttTier groups round-trip times so that small differences do not cause
// flapping between endpoints; an unknown RTT sits in the middle.
func rttTier(d time.Duration) int {
	switch {
	case d == 0:
		return 2
	case d < 2*time.Millisecond:
		return 0
	case d < 10*time.Millisecond:
		return 1
	case d < 50*time.Millisecond:
		return 2
	case d < 250*time.Millisecond:
		return 3
	}
	return 4
}

// tierHysteresis widens the current tier's bounds: an endpoint changes
// tier only when its average RTT is this factor beyond them, so an RTT
// hovering around a boundary does not flip the order (and move new
// connections) back and forth.
const tierHysteresis = 1.5

// tierBounds returns the RTT range [lo, hi) of tier t; hi is 0 for the
// last tier.
func tierBounds(t int) (lo, hi time.Duration) {
	bounds := []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond, 0}
	return bounds[t], bounds[t+1]
}

// stickyTier returns the tier for average RTT d of an endpoint now in
// tier cur: cur while d is within cur's bounds widened by tierHysteresis,
// else rttTier(d).
func stickyTier(cur int, d time.Duration) int {
	t := rttTier(d)
	if t == cur {
		return cur
	}
	lo, hi := tierBounds(cur)
	if float64(d)*tierHysteresis >= float64(lo) && (hi == 0 || float64(d) < float64(hi)*tierHysteresis) {
		return cur
	}
	return t
}

func (p *Pool) keyLocked(e *endpoint) rankKey {
	k := rankKey{
		class:    healthClass(e),
		stalled:  e.stalled,
		locality: 2,
		tier:     e.tier,
		waiting:  e.waiting,
		notPref:  1,
		tie:      e.tie,
	}
	if e.sources == SourceStatic {
		k.lastResort = 1
	}
	switch {
	case e.local:
		k.locality = 0
	case p.cfg.Zone != "" && e.zone == p.cfg.Zone:
		k.locality = 1
	}
	if e.addr == p.preferred {
		k.notPref = 0
	}
	return k
}

// crowdedWaiting is the count of connections waiting for their first
// byte from which an endpoint ranks as one RTT tier slower (rankedTier).
// One is a handshake under way; two on a server that answers within a few
// milliseconds is a server that has stopped answering, or a burst.
const crowdedWaiting = 2

// rankedTier is the RTT tier the order ranks k by: one tier slower with
// crowdedWaiting or more connections waiting. Waiting alone breaks ties
// within a tier, so a server that hangs while alone in the best tier (a
// millisecond closer than the rest) would otherwise get every new
// connection until its first one passes the first-byte deadline and it
// ranks as stalled; a burst to healthy servers spreads over one tier
// more, not over all of them. Locality ranks before the tier: a local or
// same-zone server alone in its class keeps new connections until it is
// stalled. Derived from waiting, it is no key of the
// preferred endpoint either (rebuildLocked).
func (k rankKey) rankedTier() int {
	if k.waiting >= crowdedWaiting {
		return k.tier + 1
	}
	return k.tier
}

func compareKeys(a, b rankKey) int {
	return cmp.Or(
		cmp.Compare(a.class, b.class),
		cmp.Compare(a.stalled, b.stalled),
		cmp.Compare(a.locality, b.locality),
		cmp.Compare(a.lastResort, b.lastResort),
		cmp.Compare(a.rankedTier(), b.rankedTier()),
		cmp.Compare(a.waiting, b.waiting),
		cmp.Compare(a.notPref, b.notPref),
		cmp.Compare(a.tie, b.tie),
	)
}

// rebuildLocked re-sorts the candidate order when something that affects it
// changed, and emits EventPreferred when the preferred endpoint changes.
func (p *Pool) rebuildLocked() {
	if !p.dirty {
		return
	}
	p.dirty = false
	type ranked struct {
		k rankKey
		e *endpoint
	}
	rs := make([]ranked, 0, len(p.eps))
	for _, e := range p.eps {
		rs = append(rs, ranked{p.keyLocked(e), e})
	}
	byRank := func(a, b ranked) int { return compareRanks(a.k, a.e, b.k, b.e) }
	// The preferred endpoint, the one stickiness holds to and
	// EventPreferred names, is the first by every key but waiting: a
	// connection waiting for its first byte sends the next ones to an
	// equal endpoint while it waits (the order), without moving the
	// preference. Otherwise the preference among equals would move with
	// most new connections (each waits a moment for the server's
	// ServerHello), and with it the events and the logs.
	first := ""
	if len(rs) > 0 {
		first = slices.MinFunc(rs, func(a, b ranked) int {
			a.k.waiting, b.k.waiting = 0, 0 // copies
			return byRank(a, b)
		}).e.addr
	}
	if first != p.preferred {
		prev := p.preferred
		p.preferred = first
		if first != "" {
			p.emitLocked(Event{Kind: EventPreferred, Addr: first, Prev: prev, State: p.eps[first].state})
			p.cfg.Logger.V(1).Info("preferred endpoint changed", "addr", first, "prev", prev)
		}
		// Stickiness goes with the preference: the order puts the new
		// preferred endpoint before its equals, not the old one.
		for i := range rs {
			rs[i].k = p.keyLocked(rs[i].e)
		}
	}
	slices.SortFunc(rs, byRank)
	p.order = p.order[:0]
	for _, r := range rs {
		p.order = append(p.order, r.e)
	}
}

// compareRanks orders endpoints a and b, of keys ka and kb, as the
// candidate order does: by key, then by address.
func compareRanks(ka rankKey, a *endpoint, kb rankKey, b *endpoint) int {
	return cmp.Or(compareKeys(ka, kb), cmp.Compare(a.addr, b.addr))
}

// inPlaceLocked reports whether e, whose key alone changed since the
// order was sorted, still ranks between its neighbours there: sorting
// again would give the same order.
func (p *Pool) inPlaceLocked(e *endpoint) bool {
	i := slices.Index(p.order, e)
	if i < 0 {
		return false
	}
	k := p.keyLocked(e)
	if i > 0 {
		if prev := p.order[i-1]; compareRanks(p.keyLocked(prev), prev, k, e) > 0 {
			return false
		}
	}
	if i+1 < len(p.order) {
		if next := p.order[i+1]; compareRanks(k, e, p.keyLocked(next), next) > 0 {
			return false
		}
	}
	return true
}

func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// Outranks reports whether a is healthy (not suspect, draining, slow or
// stalled either) and ranks above b for lasting reasons: locality (local, then
// same zone), discovered before static-only (the last resort), lower RTT
// tier. It compares the candidate order's own keys (Candidates), without
// what only orders equals (waiting connections, stickiness, the tie
// hash), so that connections are never moved between equals. A b that is
// down (unhealthy or quarantined) is outranked whatever its keys: the
// drain moves connections off an endpoint as it goes down, but not those
// made to it while it was down (a dial that failed open to it, the
// better attempts having failed), which would stay there as long as
// their clients keep them. False if either is not in the pool.
func (p *Pool) Outranks(a, b string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ea, eb := p.eps[a], p.eps[b]
	if ea == nil || eb == nil || ea.state != StateHealthy || healthClass(ea) != 0 || ea.stalled > 0 {
		return false
	}
	if eb.state == StateUnhealthy || eb.state == StateQuarantined {
		return true
	}
	lasting := func(k rankKey) rankKey {
		return rankKey{locality: k.locality, lastResort: k.lastResort, tier: k.tier}
	}
	return compareKeys(lasting(p.keyLocked(ea)), lasting(p.keyLocked(eb))) < 0
}
