package endpoint

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

	// mu guards the fields below. Holdoff calls nothing while holding it,
	// so it may be called with any other lock held, and OnEvent from pool
	// event delivery.
	mu     sync.Mutex
	failed error // of the last round that failed on every endpoint
	at     time.Time
	// ended counts End calls: a round that began before the latest End
	// (an endpoint came back, or another round succeeded) is out of date
	// and its failure starts no holdoff.
	ended uint64
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
	if wait := OrDefault(h.Duration, DefaultHoldoff) - ago; wait > 0 {
		return fmt.Errorf("%w (every endpoint failed %s ago; next attempt in %s)",
			h.failed, ago.Round(time.Millisecond), wait.Round(time.Millisecond))
	}
	return nil
}

// Round is called before a dial that tries every endpoint; pass its result
// to Failed if the dial fails.
func (h *Holdoff) Round() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

// Failed reports that the dial begun at round failed on every endpoint: it
// starts a holdoff, unless the holdoff was ended since round began (an
// endpoint came back or another dial succeeded meanwhile), or err is this
// host's own shortage (upstream.IsLocalError: out of descriptors or
// memory), which says nothing of the endpoints.
func (h *Holdoff) Failed(round uint64, err error) {
	if upstream.IsLocalError(err) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if round != h.ended {
		return
	}
	h.failed, h.at = err, time.Now()
}

// End lets the next caller dial at once: a dial succeeded, or an endpoint
// came back.
func (h *Holdoff) End() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = nil
	h.ended++
}

// OnEvent ends the holdoff when an endpoint becomes healthy or is added;
// pass it pool events (upstream.Pool.Subscribe).
func (h *Holdoff) OnEvent(ev upstream.Event) {
	if ev.Kind == upstream.EventUp || ev.Kind == upstream.EventAdded {
		h.End()
	}
}
