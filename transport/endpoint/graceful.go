package endpoint

import "github.com/apifailover/apifailover/transport/upstream"

// Graceful reports whether an EventDown or EventRemoved is for a server that
// still answers, so that its connections should be drained rather than cut:
// it failed /readyz with an answer (or none in time after the TLS
// handshake: see ReadyzError), or it left its source while healthy
// (an apiserver leaves the EndpointSlice as its graceful shutdown begins).
func Graceful(ev upstream.Event) bool {
	switch ev.Kind {
	case upstream.EventDown:
		return IsReadyzError(ev.Err)
	case upstream.EventRemoved:
		return ev.State == upstream.StateHealthy
	}
	return false
}
