package endpoint

import (
	"math/rand/v2"
	"time"
)

// Backoff is the wait between retries: Min after the first failure,
// doubling with each further one up to Max, each wait spread by ±20%
// (Jitter). Reset starts over after a success. Zero Min or Max: 1s, 30s,
// as discovery's.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the wait before the next retry.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = OrDefault(b.Min, minBackoff)
	} else {
		b.cur = min(2*b.cur, OrDefault(b.Max, maxBackoff))
	}
	return Jitter(b.cur)
}

// Reset makes the next wait Min again.
func (b *Backoff) Reset() { b.cur = 0 }

// Jitter spreads d by ±20% at random, so that a fleet does not retry in
// step.
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
