package upstream

import "time"

// Slow endpoints. A dialer that races connection attempts (start the next
// candidate when the first has not connected after a short delay) learns
// something probes may not: the first candidate lost to a later one. A
// server whose TLS handshake takes 600 ms still passes a 1 s probe, and a
// SIGSTOPped server passes a TCP-only probe (the kernel completes the
// connect), yet every connection to it loses the race. An endpoint that
// loses slowAfter races in a row is demoted for a while: ranked with
// suspect endpoints, so new connections go elsewhere, without counting as
// down (its connections are retired, not cut). The demotion lasts
// slowHoldMin, doubling up to slowHoldMax while the endpoint keeps losing
// whenever it is tried first again; a won race lifts it and resets the
// hold.
const (
	slowAfter   = 2
	slowHoldMin = 5 * time.Second
	slowHoldMax = time.Minute
)

// ReportDialRace records the outcome of a staggered connection race that
// addr started as the first candidate: won is false when a later candidate
// connected first while addr's attempt was still running. A failed attempt
// is not a lost race (report it with ReportFailure).
func (p *Pool) ReportDialRace(addr string, won bool) {
	now := time.Now()
	p.mu.Lock()
	e, ok := p.eps[addr]
	if !ok {
		p.mu.Unlock()
		return
	}
	if won {
		e.racesLost = 0
		e.slowHold = 0
		if !e.slowUntil.IsZero() {
			e.slowUntil = time.Time{}
			p.dirty = true
		}
	} else {
		e.racesLost++
		if e.racesLost >= slowAfter && e.slowUntil.IsZero() {
			e.slowHold = min(max(2*e.slowHold, slowHoldMin), slowHoldMax)
			e.slowUntil = now.Add(e.slowHold)
			p.slowNext = earliest(p.slowNext, e.slowUntil)
			p.dirty = true
			p.cfg.Logger.Info("endpoint slow: it lost connection races in a row; new connections go elsewhere", "addr", addr, "races", e.racesLost, "for", e.slowHold)
		}
	}
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
}

// expireSlowLocked lifts the demotions that ran out by now. Called wherever
// the order is read, so that no timer is needed. It reports whether it
// lifted any (the order was rebuilt and may have events to flush).
func (p *Pool) expireSlowLocked(now time.Time) bool {
	if p.slowNext.IsZero() || now.Before(p.slowNext) {
		return false
	}
	p.slowNext = time.Time{}
	for _, e := range p.eps {
		if e.slowUntil.IsZero() {
			continue
		}
		if !now.Before(e.slowUntil) {
			e.slowUntil = time.Time{}
			// One more lost race demotes it again, for twice as long.
			e.racesLost = slowAfter - 1
			p.dirty = true
			continue
		}
		p.slowNext = earliest(p.slowNext, e.slowUntil)
	}
	p.rebuildLocked()
	return true
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}
