package transport_test

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// advertise makes s answer with an Alt-Svc header listing addrs.
func advertise(s *server, addrs ...string) {
	v := ""
	for i, a := range addrs {
		if i > 0 {
			v += ", "
		}
		v += fmt.Sprintf(`h2="%s";ma=60`, a)
	}
	s.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Alt-Svc", v)
		w.Header().Set("X-Server", s.name)
		fmt.Fprint(w, s.name)
	})
}

func altSvcEndpoints(f *transport.Failover) map[string]upstream.State {
	out := map[string]upstream.State{}
	for _, s := range f.Pool().Status() {
		if s.Sources&upstream.SourceAltSvc != 0 {
			out[s.Addr] = s.State
		}
	}
	return out
}

// wrapAltSvc wraps a client that knows only the first server (the front
// proxy) and learns the others from Alt-Svc.
func wrapAltSvc(t *testing.T, c *cluster, alt *transport.AltSvcOptions) *transport.Failover {
	t.Helper()
	f, err := transport.Wrap(t.Context(), c.config(), transport.Options{DisableDiscovery: true, AltSvc: alt})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func TestAltSvcLearnsAlternativesAndSurvivesTheFront(t *testing.T) {
	c := newCluster(t, 3)
	front, a, b := c.servers[0], c.servers[1], c.servers[2]
	advertise(front, a.addr, b.addr)
	seenAltUsed := make(chan string, 100)
	for _, s := range []*server{a, b} {
		s.setHandler(func(w http.ResponseWriter, r *http.Request) {
			seenAltUsed <- r.Header.Get("Alt-Used")
			fmt.Fprint(w, s.name)
		})
	}
	// The test servers listen on ports of their own: allow them.
	f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{portOf(t, a.addr), portOf(t, b.addr)}})
	assert.Equal(t, front.name, mustGet(t, f, "/api"))
	require.Eventually(t, func() bool {
		eps := altSvcEndpoints(f)
		return eps[a.addr] == upstream.StateHealthy && eps[b.addr] == upstream.StateHealthy
	}, 10*time.Second, 10*time.Millisecond, "alternatives not learned: %+v", f.Pool().Status())

	// The front is static only: the learned alternatives rank before it.
	name := mustGet(t, f, "/api")
	assert.Contains(t, []string{a.name, b.name}, name)
	assert.Equal(t, c.named(name).addr, <-seenAltUsed, "requests to an alternative carry Alt-Used")

	front.kill()
	for range 5 {
		assert.NotEqual(t, front.name, mustGet(t, f, "/api"))
	}
}

func TestAltSvcPoisoning(t *testing.T) {
	t.Run("alternative with a certificate for another name", func(t *testing.T) {
		c := newCluster(t, 1)
		impostor := newServer(t, "impostor", c.pki.Wrong)
		advertise(c.servers[0], impostor.addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{portOf(t, impostor.addr)}})
		mustGet(t, f, "/api")
		require.Eventually(t, func() bool {
			return altSvcEndpoints(f)[impostor.addr] == upstream.StateQuarantined
		}, 10*time.Second, 10*time.Millisecond)
		for range 5 {
			mustGet(t, f, "/api")
		}
		c.servers[0].kill()
		_, err := get(t, f, "/api")
		require.Error(t, err, "the impostor must not serve")
		assert.Zero(t, impostor.count("GET /api"), "no request bytes may reach the impostor")
	})
	t.Run("header relayed from a pod or a node", func(t *testing.T) {
		// Every kube-apiserver passes the headers of pods/proxy,
		// services/proxy and nodes/proxy answers through, from any pod
		// or node: they may neither clear nor replace what was learned.
		c := newCluster(t, 3)
		a, b := c.servers[1], c.servers[2]
		v := fmt.Sprintf(`h2="%s";ma=60, h2="%s";ma=60`, a.addr, b.addr)
		for _, s := range c.servers {
			s.setHandler(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/api/v1/namespaces/d/pods/p/proxy/":
					w.Header().Set("Alt-Svc", "clear")
				case "/api/v1/nodes/n/proxy/x":
					w.Header().Set("Alt-Svc", fmt.Sprintf(`h2="%s";ma=60`, a.addr))
				default:
					w.Header().Set("Alt-Svc", v)
				}
				fmt.Fprint(w, s.name)
			})
		}
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{portOf(t, a.addr), portOf(t, b.addr)}})
		mustGet(t, f, "/api")
		require.Eventually(t, func() bool { return len(altSvcEndpoints(f)) == 2 }, 10*time.Second, 10*time.Millisecond)
		for range 3 {
			mustGet(t, f, "/api/v1/namespaces/d/pods/p/proxy/")
			mustGet(t, f, "/api/v1/nodes/n/proxy/x")
		}
		eps := altSvcEndpoints(f)
		assert.Contains(t, eps, a.addr)
		assert.Contains(t, eps, b.addr)
	})
	t.Run("alternative outside the allowlist", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
		for range 3 {
			mustGet(t, f, "/api")
		}
		assert.Empty(t, altSvcEndpoints(f))
	})
	t.Run("HTTP proxy configured", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		cfg := c.config()
		proxyURL, _ := url.Parse("http://127.0.0.1:1")
		cfg.Proxy = http.ProxyURL(proxyURL)
		f, err := transport.Wrap(t.Context(), cfg, transport.Options{DisableDiscovery: true, AltSvc: &transport.AltSvcOptions{AllowedCIDRs: loopback}})
		require.NoError(t, err)
		defer f.Close()
		_, err = get(t, f, "/api") // goes to the (absent) proxy
		require.Error(t, err)
		assert.Empty(t, altSvcEndpoints(f))
		assert.Zero(t, c.servers[1].count("GET /api"))
	})
	t.Run("no allowlist is an error", func(t *testing.T) {
		c := newCluster(t, 1)
		_, err := transport.Wrap(t.Context(), c.config(), transport.Options{DisableDiscovery: true, AltSvc: &transport.AltSvcOptions{}})
		require.ErrorContains(t, err, "AllowedCIDRs")
	})
	t.Run("invalid port is an error", func(t *testing.T) {
		c := newCluster(t, 1)
		_, err := transport.Wrap(t.Context(), c.config(), transport.Options{DisableDiscovery: true, AltSvc: &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{0}}})
		require.ErrorContains(t, err, "AllowedPorts")
	})
}

func (c *cluster) named(name string) *server {
	for _, s := range c.servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

// An alternative on an allowed address is used only on a port API servers
// are known to use: on a control-plane node the kubelet's serving
// certificate (port 10250, from the cluster CA) may carry the node's
// address, and an injected h2=":10250" must not send it the credentials.
func TestAltSvcAdmitsOnlyAPIServerPorts(t *testing.T) {
	t.Run("unknown port", func(t *testing.T) {
		c := newCluster(t, 1)
		kubelet := newServer(t, "kubelet", c.pki.Cert)
		advertise(c.servers[0], kubelet.addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback})
		for range 5 {
			assert.Equal(t, c.servers[0].name, mustGet(t, f, "/api"))
		}
		assert.Empty(t, altSvcEndpoints(f))
		c.servers[0].kill()
		_, err := get(t, f, "/api")
		require.Error(t, err, "the kubelet must not serve")
		assert.Zero(t, kubelet.count("GET /api"), "no request may reach the other port")
	})
	t.Run("port in AllowedPorts", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{portOf(t, c.servers[1].addr)}})
		mustGet(t, f, "/api")
		assert.Contains(t, altSvcEndpoints(f), c.servers[1].addr)
	})
	t.Run("port of a static endpoint", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		advertise(c.servers[1], c.servers[1].addr) // either may answer first
		f, err := transport.Wrap(t.Context(), c.config(), transport.Options{
			DisableDiscovery: true,
			Endpoints:        []string{c.servers[1].addr},
			AltSvc:           &transport.AltSvcOptions{AllowedCIDRs: loopback},
		})
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		mustGet(t, f, "/api")
		assert.Contains(t, altSvcEndpoints(f), c.servers[1].addr)
	})
	t.Run("port of a discovered endpoint", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback})
		// Another address with the same port, as an EndpointSlice lists
		// every API server with the one port they share.
		require.NoError(t, f.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: fmt.Sprintf("127.0.0.3:%d", portOf(t, c.servers[1].addr))}}))
		mustGet(t, f, "/api")
		assert.Contains(t, altSvcEndpoints(f), c.servers[1].addr)
	})
	t.Run("discovered endpoint with AllowDiscovered", func(t *testing.T) {
		c := newCluster(t, 2)
		advertise(c.servers[0], c.servers[1].addr)
		f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowDiscovered: true})
		mustGet(t, f, "/api")
		assert.Empty(t, altSvcEndpoints(f), "not discovered yet")
		require.NoError(t, f.Pool().Set(upstream.SourceDiscovery, []upstream.Spec{{Addr: c.servers[1].addr}}))
		mustGet(t, f, "/api")
		assert.Contains(t, altSvcEndpoints(f), c.servers[1].addr)
	})
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// Alt-Used names the alternative a request is sent to, on that attempt
// only: a retry that goes to the origin, or to an endpoint not learned
// from Alt-Svc, carries none.
func TestAltUsedOnlyOnTheAttemptToTheAlternative(t *testing.T) {
	c := newCluster(t, 3)
	front, a, b := c.servers[0], c.servers[1], c.servers[2]
	const path = "/api/v1/namespaces/default/configmaps"
	v := fmt.Sprintf(`h2="%s";ma=60, h2="%s";ma=60`, a.addr, b.addr)
	altUsed := make(chan string, 10)
	front.setHandler(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == path {
			altUsed <- r.Header.Get("Alt-Used")
		}
		w.Header().Set("Alt-Svc", v)
		fmt.Fprint(w, front.name)
	})
	for _, s := range []*server{a, b} {
		s.setHandler(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == path {
				apiserverShutdown(w, r)
				return
			}
			fmt.Fprint(w, s.name)
		})
	}
	f := wrapAltSvc(t, c, &transport.AltSvcOptions{AllowedCIDRs: loopback, AllowedPorts: []int{portOf(t, a.addr), portOf(t, b.addr)}})
	mustGet(t, f, "/api")
	require.Eventually(t, func() bool {
		eps := altSvcEndpoints(f)
		return eps[a.addr] == upstream.StateHealthy && eps[b.addr] == upstream.StateHealthy
	}, 10*time.Second, 10*time.Millisecond, "alternatives not learned: %+v", f.Pool().Status())
	// Both alternatives refuse (shutting down): the third attempt goes
	// to the front.
	assert.Equal(t, front.name, mustGet(t, f, path))
	assert.Equal(t, 1, a.count("GET "+path))
	assert.Equal(t, 1, b.count("GET "+path))
	assert.Empty(t, <-altUsed, "the request to the origin carried Alt-Used")
}
