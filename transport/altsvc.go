package transport

import (
	"errors"
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
// the allowlist admits them: apiserver proxy subresources pass upstream
// headers through, so a header alone proves nothing. Connections to an
// alternative verify its certificate for the origin's name, like every
// connection. Requests sent to an alternative carry Alt-Used.
type AltSvcOptions struct {
	// AllowedCIDRs admits alternatives whose address is in one of these
	// prefixes.
	AllowedCIDRs []netip.Prefix
	// AllowDiscovered admits alternatives already known from EndpointSlice
	// discovery.
	AllowDiscovered bool
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
	port, err := strconv.Atoi(u.Port())
	if err != nil || u.Port() == "" {
		port = 443
	}
	return altsvc.NewLearner(altsvc.ClientConfig{
		Pool:            pool,
		Origin:          altsvc.Origin{Scheme: u.Scheme, Host: u.Hostname(), Port: port},
		AllowedCIDRs:    o.AllowedCIDRs,
		AllowDiscovered: o.AllowDiscovered,
		Cache:           altsvc.NewCache(altsvc.CacheConfig{MaxTTL: o.MaxTTL}),
		Logger:          log,
	})
}
