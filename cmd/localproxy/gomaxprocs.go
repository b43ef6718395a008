package main

import "runtime"

// defaultGOMAXPROCS is --gomaxprocs's default: two Ps, what make bench
// measures on its two cores. The proxy's event loop blocks a thread in
// epoll_wait with one P, and the other runs the rest (accepts, dials,
// probes, discovery); more Ps bring more threads and garbage-collection
// workers to a node proxy, not more speed (the loop is one thread). With
// one P the loop waits through Go's network poller instead, which costs
// more per message (localproxy/await_linux.go).
const defaultGOMAXPROCS = 2

// maxGOMAXPROCS is the most --gomaxprocs allows. The runtime aborts the
// process beyond an int32 ("procresize: invalid arg") and allocates every
// P's caches and work buffers long before that; the proxy's loop is one
// thread, so Ps beyond a handful bring threads, not speed. 0 gives a
// larger machine all its CPUs.
const maxGOMAXPROCS = 1024

// setGOMAXPROCS is runtime.GOMAXPROCS; the tests, which run the proxy
// inside their own process, record the request instead.
var setGOMAXPROCS = runtime.GOMAXPROCS

// applyGOMAXPROCS sets GOMAXPROCS from --gomaxprocs (n; set: given as a
// flag or LOCALPROXY_GOMAXPROCS): n > 0 is set; 0 keeps Go's own choice
// (the CPUs, the container's CPU limit, or the GOMAXPROCS environment
// variable); the default applies unless the environment variable
// GOMAXPROCS (env) is set, which the Go runtime has applied already. It
// returns the GOMAXPROCS in effect.
func applyGOMAXPROCS(n int, set bool, env string) int {
	if n > 0 && (set || env == "") {
		setGOMAXPROCS(n)
	}
	return setGOMAXPROCS(0)
}
