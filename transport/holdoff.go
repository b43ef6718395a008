package transport

import (
	"fmt"
	"sync"
	"time"

	"github.com/apifailover/apifailover/transport/upstream"
)

// DefaultHoldoff is how long a Holdoff makes callers fail fast after a
// connection setup failed on every endpoint.
const DefaultHoldoff = 250 * time.Millisecond

// Holdoff bounds connection attempts while every API server is down: after
// a dial that tried every endpoint failed, callers get that error at once
// for Duration instead of dialing again. A client (or a node-local proxy
// accepting clients) then makes at most one round of attempts per Duration,
// whatever its request or connection rate, and does not hammer servers that
// are coming back. An endpoint becoming healthy or being added ends the
// holdoff at once (OnEvent). The zero value is ready to use.
type Holdoff struct {
	// Duration is the holdoff after a failed round. If zero,
	// DefaultHoldoff; if negative, there is none.
	Duration time.Duration

	mu     sync.Mutex
	failed error // of the last round that failed on every endpoint
	at     time.Time
}

// Err returns a non-nil error, wrapping the failed round's, while a holdoff
// is in force.
func (h *Holdoff) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed == nil {
		return nil
	}
	ago := time.Since(h.at)
	if wait := orDefault(h.Duration, DefaultHoldoff) - ago; wait > 0 {
		return fmt.Errorf("%w (every endpoint failed %s ago; next attempt in %s)",
			h.failed, ago.Round(time.Millisecond), wait.Round(time.Millisecond))
	}
	return nil
}

// Record reports the outcome of a dial that tried every endpoint: an error
// starts a holdoff, nil ends it.
func (h *Holdoff) Record(err error) {
	h.mu.Lock()
	h.failed, h.at = err, time.Now()
	h.mu.Unlock()
}

// End lets the next caller dial at once.
func (h *Holdoff) End() { h.Record(nil) }

// OnEvent ends the holdoff when an endpoint becomes healthy or is added;
// pass it pool events (upstream.Pool.Subscribe).
func (h *Holdoff) OnEvent(ev upstream.Event) {
	if ev.Kind == upstream.EventUp || ev.Kind == upstream.EventAdded {
		h.End()
	}
}
