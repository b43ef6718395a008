// Package endpoint is what both front ends need above the pool: the
// staggered Dialer and its TrackedConn connections, one socket-tuning
// helper (TuneTCP), the Holdoff after every endpoint refused, the Prober
// and its configuration (ProbeConfig: probe modes, credentials, TLS files
// that rotate), EndpointSlice discovery (Discoverer), Graceful (drain or
// cut) and the pool's Prometheus collectors.
//
// It builds on transport/upstream, the endpoint pool, and knows nothing of
// HTTP requests: package transport (the client-go front end) and package
// localproxy (the L4 front end) both build on it.
package endpoint
