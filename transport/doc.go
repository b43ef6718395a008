// Package transport gives a client-go program direct, health-checked
// failover across every kube-apiserver of a cluster, with no VIP or load
// balancer.
//
// Wrap takes the program's rest.Config and returns a Failover whose
// Config and HTTPClient send each request to the best endpoint that is up:
// endpoints are found from the kubernetes EndpointSlice (and any named in
// Options.Endpoints), probed on /readyz, dialed with staggered parallel
// TLS attempts, and a request that failed before the server processed it
// is sent again to another endpoint. Informers, clientsets and
// controller-runtime clients built from the returned configuration share
// one HTTP/2 connection pool per endpoint.
//
// The package is the client-go layer of the module. Below it,
// transport/upstream is the endpoint pool (health state, ordering, events)
// and transport/endpoint the parts both front ends share: dialer, prober,
// holdoff, discovery, TLS file watches and pool metrics. Package altsvc
// lets a front proxy advertise the endpoints (RFC 7838, Options.AltSvc).
// For clients that cannot be wrapped (kubelet, kubectl), localproxy and
// cmd/localproxy are an L4 proxy built on the same layers.
package transport
