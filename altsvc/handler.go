package altsvc

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// DefaultAdvertiseMaxAge is the ma of advertised alternatives: short, so a
// removed API server is forgotten quickly.
const DefaultAdvertiseMaxAge = 60 * time.Second

// HandlerConfig configures the server side.
type HandlerConfig struct {
	// Endpoints returns the ready endpoints (host:port) to advertise, for
	// example from the kubernetes EndpointSlice or a static list. Required.
	Endpoints func() []string
	// MaxAge is the advertised ma. If zero, DefaultAdvertiseMaxAge.
	MaxAge time.Duration
	// ClientCIDRs, if set, limits the header to clients whose address is
	// in one of these prefixes.
	ClientCIDRs []netip.Prefix
}

// NewHandler returns next with an Alt-Svc header on every response to a
// TLS request, listing the current endpoints as h2 alternatives. With no
// endpoints it sends nothing (not "clear": an empty list is more likely a
// discovery hiccup than an instruction to forget).
func NewHandler(next http.Handler, cfg HandlerConfig) http.Handler {
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultAdvertiseMaxAge
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && clientAllowed(r.RemoteAddr, cfg.ClientCIDRs) {
			if v := advertise(cfg.Endpoints(), cfg.MaxAge); v != "" {
				w.Header().Set("Alt-Svc", v)
			}
		}
		next.ServeHTTP(w, r)
	})
}

func clientAllowed(remote string, cidrs []netip.Prefix) bool {
	if len(cidrs) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	for _, p := range cidrs {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// advertise formats endpoints as an Alt-Svc value; invalid ones are
// skipped, at most MaxAlternatives are listed.
func advertise(endpoints []string, ma time.Duration) string {
	var v Value
	for _, ep := range endpoints {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			continue
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			continue
		}
		a := Alternative{Protocol: "h2", Host: host, Port: p, MaxAge: ma.Truncate(time.Second)}
		if _, err := Format(Value{Alternatives: []Alternative{a}}); err != nil {
			continue
		}
		v.Alternatives = append(v.Alternatives, a)
		if len(v.Alternatives) == MaxAlternatives {
			break
		}
	}
	if len(v.Alternatives) == 0 {
		return ""
	}
	s, _ := Format(v)
	return s
}
