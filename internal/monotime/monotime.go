// Package monotime keeps instants as int64 nanoseconds, for atomics, on
// the monotonic clock: a step of the wall clock (NTP correcting a node
// that booted with its clock wrong) moves none of them, nor any
// comparison between two of them or with time.Now. Unix nanoseconds read
// back with time.Unix carry no monotonic reading, and time.Since of one
// is wall time.
package monotime

import "time"

// base is the origin of the instants; time.Now's reading carries the
// monotonic clock.
var base = time.Now()

// Now returns the current instant, never 0 (which callers keep for
// "never").
func Now() int64 { return Of(time.Now()) }

// Of returns t's instant, never 0. t must come from time.Now, or from
// such a time by Add; a time without a monotonic reading (time.Unix,
// Round(0), a parsed one) is read on the wall clock.
func Of(t time.Time) int64 {
	if d := int64(t.Sub(base)); d != 0 {
		return d
	}
	return 1
}

// Time returns the instant ns as a time.Time that carries a monotonic
// reading: time.Since and Sub against time.Now use the monotonic clock.
func Time(ns int64) time.Time { return base.Add(time.Duration(ns)) }
