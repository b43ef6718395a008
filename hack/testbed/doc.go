// Package testbed runs a real Kubernetes control plane for end-to-end tests,
// benchmarks and demos of apifailover: one etcd and several kube-apiservers,
// each on its own address (10.250.0.K:6443) inside a private network
// namespace, plus a fault API to kill, hang, blackhole, reset, stop, restart,
// add and remove apiservers, and gray faults that leave them up but unwell:
// slow (a latency shim), lossy (random drops), serving certificates not yet
// valid or for the wrong name, and client certificates that expire.
//
// A test binary calls [ReexecInNetns] from TestMain; the process then runs
// inside a network namespace that dies with it, so addresses and iptables
// rules never touch the host. Then:
//
//	bed, err := testbed.Start(ctx, testbed.Options{APIServers: 3, Dir: t.TempDir()})
//	if err != nil { ... }
//	defer bed.Close()
//	cs := kubernetes.NewForConfigOrDie(bed.RESTConfig(testbed.Origin))
//	bed.APIServers()[0].Kill()
//
// Prerequisites: hack/tools/ensure-deps.sh (etcd, iptables, iproute2) and
// hack/tools/build-kube.sh (kube-apiserver and kubectl from the Go module
// proxy, cached per user). [Start] runs build-kube.sh when the binaries are
// not cached yet, and ensure-deps.sh when [Options.InstallDeps] is set.
//
// Facts about kube-apiserver v1.36.3 this package relies on, measured on
// 2 cores (etcd 3.4.23):
//
//   - With --endpoint-reconciler-type=lease each apiserver writes the
//     "kubernetes" Endpoints and EndpointSlice (Ready=true) itself; no
//     kube-controller-manager is needed. Lease TTL 15 s, reconcile interval
//     10 s (pkg/controlplane/instance.go constants, not flags).
//   - Started together, the apiservers' first reconciles race: the last
//     writer often misses a peer and the slice is complete only one round
//     (10 s) later. Started one after the other (what Start does, ~2.5 s
//     each, 3 in ~8 s) the slice is complete as soon as the last is ready.
//   - SIGKILL: the address stays listed Ready until its lease expires and a
//     peer reconciles. The lease is renewed every 10 s with a 15 s TTL, so
//     that is 5 to 25 s after the kill (measured 14-20 s). SIGSTOP: the
//     same (~20 s); after SIGCONT it lists itself again at once.
//   - SIGTERM: /readyz fails within ~15 ms ("[-]shutdown failed"), the
//     address leaves the slice within ~150 ms, the server keeps serving
//     for --shutdown-delay-duration and exits 0 about 1 s after it. A
//     second SIGTERM makes it exit at once with status 1.
//   - Its loopback client dials its own --bind-address. A fault on that
//     address also cuts the loopback: the kubernetes-service controller then
//     blocks ~30 s per round, the lease lapses and the address flaps out of
//     and into the slice. The bed spares the apiservers' own connections
//     (see APIServerGID) so a blackholed server stays listed, as in reality.
//   - SIGSTOP of etcd (PauseEtcd): every apiserver keeps its listener and
//     serves watches from its cache, completes TLS handshakes, but its
//     /readyz waits for etcd (--etcd-readycheck-timeout, 2 s): a 500 ms
//     probe times out on all of them at once. Quorum reads and writes wait
//     and succeed after SIGCONT.
//   - kube-apiserver issues TLS 1.3 session tickets: a client with a
//     session cache resumes on its second connection to the same server
//     (not on another: each has its own ticket keys).
//   - /readyz, /livez, /healthz and /version are readable anonymously
//     (system:public-info-viewer).
//   - The Node authorizer gives a node (system:node:<name> in system:nodes)
//     the rules of bootstrappolicy.NodeRules: `get` on core endpoints in any
//     namespace (commented "Needed for glusterfs volumes"), get/list/watch
//     services, but nothing on discovery.k8s.io endpointslices (Forbidden).
//     A node-level failover client must fall back to polling
//     endpoints/kubernetes; reading v1 Endpoints draws the warning "v1
//     Endpoints is deprecated in v1.33+".
//   - EndpointSlices reject loopback addresses, so the apiservers bind to
//     10.250.0.K added to lo.
//   - iptables nat OUTPUT DNAT works in the namespace, so Slow redirects
//     new connections to a relay in the test process; the relay's own
//     connections carry SO_MARK 0x2000 and are exempt. A GET on a new
//     connection through Slow(300ms handshake, 1s response) takes ~1.31 s.
//     With 20% random drops each way (Lossy) GETs on new connections
//     succeed, the slowest of five ~1.2 s (a lost SYN costs 1 s).
//   - kube-apiserver serves a serving certificate that is not yet valid
//     without complaint; clients fail with "x509: certificate has expired
//     or is not yet valid" until NotBefore and verify it at once after,
//     no restart. Restarting one apiserver takes 5-8 s (2 s shutdown delay
//     included) until it is listed again.
//   - The x509 client authenticator verifies the client certificate on
//     every request: a request on a connection opened while the
//     certificate was valid is answered 401 once it has expired.
package testbed
