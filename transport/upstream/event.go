package upstream

import "strconv"

// EventKind says what changed.
type EventKind uint8

const (
	// EventAdded: a new endpoint entered the pool.
	EventAdded EventKind = iota + 1
	// EventRemoved: the endpoint's last source dropped it. Close its
	// connections.
	EventRemoved
	// EventUp: the endpoint became healthy.
	EventUp
	// EventDown: the endpoint became unhealthy or quarantined. Close its
	// connections.
	EventDown
	// EventPreferred: a different endpoint is now preferred: first in
	// line whenever no connection waits on it for its first byte (see
	// Pool.AddWaiting). Prev is the one preferred before (empty if none).
	// New connections should go to Addr; connections to Prev may be
	// retired gracefully.
	EventPreferred
)

// String returns the lowercase event name.
func (k EventKind) String() string {
	switch k {
	case EventAdded:
		return "added"
	case EventRemoved:
		return "removed"
	case EventUp:
		return "up"
	case EventDown:
		return "down"
	case EventPreferred:
		return "preferred"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is a change in the pool, delivered to subscribers in order.
type Event struct {
	Kind EventKind
	Addr string
	// Prev is set for EventPreferred.
	Prev string
	// State is the endpoint's state after the change.
	State State
	// Err is the failure that caused an EventDown, if any.
	Err error
}
