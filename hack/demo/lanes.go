package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/peers"
	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// The demo's clients, in the table's order.
const (
	laneTransport  = "transport"
	laneLocalProxy = "localproxy"
	laneHAProxy    = "haproxy"
)

var laneNames = []string{laneTransport, laneLocalProxy, laneHAProxy}

// laneWhat says what each client is.
var laneWhat = map[string]string{
	laneTransport:  "client-go with transport.Wrap, in process",
	laneLocalProxy: "client-go via localproxy on 127.0.0.1:7445 (held probes, discovery)",
	laneHAProxy:    "client-go via HAProxy on " + peers.HAProxyListen + ", kubespray's configuration",
}

// lane is one client path, started fresh for every fault: a client-go
// configuration and client, and what can be seen of the path.
type lane struct {
	name   string
	config *rest.Config
	client *http.Client
	// serving is the apiserver carrying the client's traffic now, "" if
	// unknown (workload.Config.Serving).
	serving func() string
	// down reports whether the path counts addr down (HAProxy: not UP).
	down func(addr string) bool
	// placed, if set, is called once the client uses the apiserver the
	// fault will hit (HAProxy: the other servers back in rotation).
	placed func() error
	close  func()
}

// freshClient is rest.HTTPClientFor with a Dial of its own: a transport
// that client-go's cache shares with no other client (a fresh proxy on the
// same port must not get the last one's dead connections).
func freshClient(cfg *rest.Config) (*rest.Config, *http.Client, error) {
	cfg = rest.CopyConfig(cfg)
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = d.DialContext
	hc, err := rest.HTTPClientFor(cfg)
	return cfg, hc, err
}

// poolDown is a lane's down for a pool: not healthy, or gone from it.
func poolDown(p *upstream.Pool) func(string) bool {
	return func(addr string) bool {
		for _, s := range p.Status() {
			if s.Addr == addr {
				return s.State != upstream.StateHealthy
			}
		}
		return true
	}
}

// startTransport starts transport.Wrap with its defaults and waits until
// it counts every apiserver healthy.
func startTransport(ctx context.Context, bed *testbed.Bed) (*lane, error) {
	f, err := transport.Wrap(ctx, bed.RESTConfig(testbed.Origin), transport.Options{})
	if err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, f.Pool(), len(bed.APIServers())); err != nil {
		f.Close()
		return nil, fmt.Errorf("transport: %w", err)
	}
	return &lane{name: laneTransport, config: f.Config(), client: f.HTTPClient(),
		serving: workload.FailoverServing(f), down: poolDown(f.Pool()), close: func() { f.Close() }}, nil
}

// startLocalProxy runs a localproxy in this process, configured as
// cmd/localproxy is (held probes, discovery), on the bed's LocalProxy
// address, and waits until it counts every apiserver healthy. The
// apiserver at local is this node's own: the proxy prefers it, as a
// localproxy on a control-plane node prefers the apiserver beside it.
func startLocalProxy(ctx context.Context, bed *testbed.Bed, local string) (*lane, error) {
	listen := strings.TrimPrefix(bed.RESTConfig(testbed.LocalProxy).Host, "https://")
	cfg, err := bed.LocalProxyConfig(listen, "127.0.0.1:0", endpoint.ProbeHeld)
	if err != nil {
		return nil, err
	}
	localHost, _, _ := net.SplitHostPort(local)
	cfg.Pool.IsLocal = func(host string) bool {
		a, err1 := netip.ParseAddr(host)
		b, err2 := netip.ParseAddr(localHost)
		return err1 == nil && err2 == nil && a == b
	}
	cfg.Registry = prometheus.NewRegistry()
	cfg.Logger = logr.Discard()
	p, stop, err := testbed.RunLocalProxy(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, p.Pool(), len(bed.APIServers())); err != nil {
		stop()
		return nil, fmt.Errorf("localproxy: %w", err)
	}
	rc, hc, err := freshClient(bed.RESTConfig(testbed.LocalProxy))
	if err != nil {
		stop()
		return nil, err
	}
	return &lane{name: laneLocalProxy, config: rc, client: hc,
		serving: workload.PoolServing(p.Pool()), down: poolDown(p.Pool()),
		close: func() { hc.CloseIdleConnections(); stop() }}, nil
}

// startHAProxy starts HAProxy with kubespray's configuration and waits
// until it counts every apiserver up. The client's first connection must
// go to the apiserver at first, and leastconn may send it to any: every
// other server is set to drain (HAProxy's runtime API: no new
// connections, checks go on) until the lane is placed, then ready again,
// so that from the fault on HAProxy runs as kubespray configures it.
func startHAProxy(ctx context.Context, bed *testbed.Bed, dir, first string) (*lane, error) {
	var names, addrs []string
	for _, s := range bed.APIServers() {
		if s.Addr() == first {
			names, addrs = append([]string{s.Name()}, names...), append([]string{s.Addr()}, addrs...)
		} else {
			names, addrs = append(names, s.Name()), append(addrs, s.Addr())
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, sock, err := peers.StartHAProxy(ctx, dir, names, addrs, 0)
	if err != nil {
		return nil, err
	}
	addrOf := map[string]string{}
	for i, n := range names {
		addrOf[n] = addrs[i]
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := peers.HAProxyServerStates(sock)
		up := 0
		for _, s := range st {
			if s == "UP" {
				up++
			}
		}
		if err == nil && up == len(names) {
			break
		}
		if time.Now().After(deadline) || !sleep(ctx, 100*time.Millisecond) {
			p.Stop()
			return nil, fmt.Errorf("haproxy: %d of %d servers up after 30s (%v); log %s", up, len(names), err, filepath.Join(dir, "haproxy.log"))
		}
	}
	setOthers := func(state string) error {
		for _, n := range names[1:] {
			if err := peers.HAProxySetState(sock, n, state); err != nil {
				return err
			}
		}
		return nil
	}
	if err := setOthers("drain"); err != nil {
		p.Stop()
		return nil, err
	}
	serving := peers.HAProxyServing(sock)
	cfg := bed.RESTConfig(testbed.Origin)
	cfg.Host = "https://" + peers.HAProxyListen
	rc, hc, err := freshClient(cfg)
	if err != nil {
		p.Stop()
		return nil, err
	}
	return &lane{name: laneHAProxy, config: rc, client: hc,
		serving: func() string { return addrOf[serving()] },
		down: func(addr string) bool {
			st, err := peers.HAProxyServerStates(sock)
			if err != nil {
				return false
			}
			for n, a := range addrOf {
				if a == addr {
					return !strings.HasPrefix(st[n], "UP")
				}
			}
			return false
		},
		placed: func() error { return setOthers("ready") },
		close:  func() { hc.CloseIdleConnections(); p.Stop() }}, nil
}

// waitHealthy waits until pool counts n endpoints healthy, at most 90s.
func waitHealthy(ctx context.Context, pool *upstream.Pool, n int) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		healthy := 0
		for _, s := range pool.Status() {
			if s.State == upstream.StateHealthy {
				healthy++
			}
		}
		if healthy >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d endpoints healthy after 90s: %s", healthy, n, poolLine(pool))
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func poolLine(pool *upstream.Pool) string {
	var parts []string
	for _, s := range pool.Status() {
		p := s.Addr + " " + s.State.String() + " (" + s.Sources.String() + ")"
		if s.Preferred {
			p += " preferred"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
