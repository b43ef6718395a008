// Package upstream is the one selector of apifailover: the set of API server
// endpoints, their health, and the order in which clients should try them.
//
// The pool knows nothing of HTTP. Health probes are supplied through the
// Prober interface; the dialer, the RoundTripper and the L4 proxy report what
// they see on real traffic (Report*, ConnOpened/ConnClosed) and react to the
// pool's events (an endpoint went down or was removed: close its connections;
// a better endpoint is preferred: retire the old connections gracefully).
package upstream
