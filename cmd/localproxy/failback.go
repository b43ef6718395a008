package main

import (
	"math"

	"github.com/apifailover/apifailover/localproxy"
)

// failback checks --failback-settle and --failback-rate: 0 turns
// fail-back off (a negative Config field), negative values are refused.
func (b *builder) failback(cfg *localproxy.Config) {
	switch {
	case b.failbackSettle < 0:
		b.reject("failback-settle", b.failbackSettle, "want 0 (fail-back off) or a positive duration")
	case b.failbackSettle == 0:
		cfg.FailbackSettle = -1
	default:
		cfg.FailbackSettle = b.failbackSettle
	}
	switch r := b.failbackRate; {
	case math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || (r > 0 && r < localproxy.MinFailbackRate) || r > localproxy.MaxFailbackRate:
		b.reject("failback-rate", r, "want 0 (fail-back off) or connections per second from 1/3600 (one an hour, about 0.00028) to 1000, e.g. 2 or 0.5")
	case r == 0:
		cfg.FailbackRate = -1
	default:
		cfg.FailbackRate = r
	}
}
