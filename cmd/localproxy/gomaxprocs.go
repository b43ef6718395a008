package main

import "runtime"

// defaultGOMAXPROCS is --gomaxprocs's default. With one P, a goroutine
// that data wakes runs on the thread that polled the network, and no
// other thread is woken to look for work. In make bench (two cores,
// 2026-11-26 and 27), the proxy's CPU per request against HAProxy's went
// from 1.19-1.62× to 1.01-1.49× and 1.15-1.45× in two runs, and its bulk
// throughput stayed 1.6-2.1× HAProxy's (the copies splice in the kernel).
const defaultGOMAXPROCS = 1

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
