package transport

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/altsvc"
	"github.com/apifailover/apifailover/transport/upstream"
)

// AltSvcOptions turns on learning API servers from Alt-Svc response headers
// (RFC 7838), for control planes whose entry point sends them. Upstream
// kube-apiserver does not; EndpointSlice discovery is the primary source.
//
// Alternatives are learned only from HTTP/2 responses over verified TLS for
// the origin, never from 421 responses, only with protocol h2, and only when
// the allowlist admits both the address and the port: apiserver proxy
// subresources pass upstream headers through, so a header alone proves
// nothing. Connections to an alternative verify its certificate for the
// origin's name, like every connection. Requests sent to an alternative
// carry Alt-Used.
type AltSvcOptions struct {
	// AllowedCIDRs admits alternatives whose address is in one of these
	// prefixes, on a port API servers are known to use (see AllowedPorts).
	AllowedCIDRs []netip.Prefix
	// AllowDiscovered admits alternatives already known, with their port,
	// from EndpointSlice discovery.
	AllowDiscovered bool
	// AllowedPorts are ports an alternative in AllowedCIDRs may use besides
	// the ones API servers are known to use: the origin's, those of
	// Options.Endpoints and those of discovered endpoints. Other ports are
	// refused: on a control-plane node the kubelet (port 10250) may serve
	// a certificate from the cluster CA that carries the node's address,
	// and an injected h2=":10250" would send it the credentials. If empty,
	// no other port.
	AllowedPorts []int
	// MaxTTL caps how long an alternative is kept after the last header
	// listing it. If zero, 70s (kube-apiserver's default shutdown window).
	MaxTTL time.Duration
}

// newAltSvcLearner returns the learner that turns the origin's Alt-Svc
// headers into pool endpoints.
func newAltSvcLearner(o *AltSvcOptions, u *url.URL, pool *upstream.Pool, log logr.Logger) (*altsvc.Learner, error) {
	if len(o.AllowedCIDRs) == 0 && !o.AllowDiscovered {
		return nil, errors.New("transport: Options.AltSvc: set AllowedCIDRs or AllowDiscovered; without an allowlist no alternative would ever be used")
	}
	a := &altSvcAdmitter{pool: pool, cidrs: o.AllowedCIDRs, discovered: o.AllowDiscovered, log: log}
	for _, p := range o.AllowedPorts {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("transport: Options.AltSvc.AllowedPorts: invalid port %d: want 1-65535", p)
		}
		a.ports = append(a.ports, p)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || u.Port() == "" {
		port = 443
	}
	return altsvc.NewLearner(altsvc.ClientConfig{
		Origin: altsvc.Origin{Scheme: u.Scheme, Host: u.Hostname(), Port: port},
		Admit:  a.admit,
		Update: a.update,
		Trust:  func(req *http.Request) bool { return apiserverWrote(req.URL.Path) },
		Cache:  altsvc.NewCache(altsvc.CacheConfig{MaxTTL: o.MaxTTL}),
		Logger: log,
	})
}

// altSvcAdmitter is the Alt-Svc allowlist: an alternative needs an allowed
// address (in a CIDR, or discovered) and a port API servers use. What it
// admits becomes the pool's SourceAltSvc endpoints.
type altSvcAdmitter struct {
	pool       *upstream.Pool
	cidrs      []netip.Prefix
	discovered bool
	ports      []int // AllowedPorts
	log        logr.Logger
}

// admit implements altsvc.ClientConfig.Admit.
func (a *altSvcAdmitter) admit(alt string) bool {
	addr, err := upstream.ParseAddr(alt) // the pool's spelling (IPv4-mapped unmapped)
	if err != nil {
		return false
	}
	if a.discovered && a.pool.Sources(addr)&upstream.SourceDiscovery != 0 {
		return true // the address and its port come from the EndpointSlice
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false // a DNS name: only discovery vouches for those
	}
	ip := ap.Addr().Unmap()
	for _, p := range a.cidrs {
		if p.Contains(ip) {
			return a.knownPort(int(ap.Port()))
		}
	}
	return false
}

// update implements altsvc.ClientConfig.Update: the admitted alternatives
// are the pool's SourceAltSvc endpoints.
func (a *altSvcAdmitter) update(alts []string) {
	specs := make([]upstream.Spec, len(alts))
	for i, alt := range alts {
		specs[i] = upstream.Spec{Addr: alt}
	}
	if err := a.pool.Set(upstream.SourceAltSvc, specs); err != nil {
		a.log.V(2).Info("ignoring invalid alternatives", "err", err.Error())
	}
}

// knownPort reports whether port is in AllowedPorts or is the port of an
// endpoint known from configuration (the origin is one) or discovery.
// Alternatives learned from Alt-Svc do not vouch for a port.
func (a *altSvcAdmitter) knownPort(port int) bool {
	for _, p := range a.ports {
		if p == port {
			return true
		}
	}
	for _, s := range a.pool.Status() {
		if s.Sources&(upstream.SourceStatic|upstream.SourceDiscovery) == 0 {
			continue
		}
		if _, p, err := net.SplitHostPort(s.Addr); err == nil && p == strconv.Itoa(port) {
			return true
		}
	}
	return false
}
