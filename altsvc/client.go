package altsvc

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// ClientConfig configures the client side: what is learned from Alt-Svc
// headers and where it goes. The package keeps no endpoint policy of its
// own: Admit decides what may be used and Update receives it.
type ClientConfig struct {
	// Origin is the origin whose responses are trusted. Required; Scheme
	// must be "https".
	Origin Origin
	// Admit decides which alternatives may be used; addr is the
	// alternative's host:port (the origin's host when the alternative names
	// none; an IPv6 address bracketed in RFC 5952 form, a DNS name in lower
	// case). Required:
	// apiserver proxy subresources pass upstream headers through, so a
	// header alone proves nothing; the caller knows which addresses and
	// ports belong to API servers. Admit is called for every alternative
	// on every response that is observed, outside the Learner's lock.
	Admit func(addr string) bool
	// Update receives the admitted alternatives, sorted and without
	// duplicates, each time they change (empty once none is left), for
	// example to give them to an endpoint pool. Required. Calls are made
	// one at a time, in order, with the Learner's lock held: Update must
	// not call back into the Learner.
	Update func(addrs []string)
	// Trust, if set, decides which requests' responses may teach: a
	// server that relays other servers' headers on some paths is trusted
	// only on the others (kube-apiserver passes those of pods/proxy,
	// services/proxy and nodes/proxy answers through, from any pod or
	// node: one could clear what was learned, or pin every client to one
	// alternative). If nil, every request's.
	Trust func(req *http.Request) bool
	// Cache holds what was learned. If nil, NewCache with defaults (entries
	// expire after ma minus Age, at most 70s).
	Cache *Cache
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Logger receives ignored headers and alternatives at V(2). The zero
	// value discards.
	Logger logr.Logger
}

// Learner learns alternatives from the Alt-Svc headers of responses from
// the origin and hands them to ClientConfig.Update. Only responses that arrived over
// HTTP/2 with a verified TLS connection count, never a 421, and only
// alternatives with protocol h2 that ClientConfig.Admit admits. Connections to an
// alternative verify its certificate for the origin's name (the transport's
// TLS configuration), so an alternative cannot impersonate the origin. One
// Learner serves every RoundTripper of a client, so they agree on what was
// learned. It is safe for concurrent use.
type Learner struct {
	cfg ClientConfig

	// mu guards applied and is held while ClientConfig.Update runs, so
	// that updates reach it one at a time and in order. Update must not
	// call back into the Learner (nor send a request through one of its
	// RoundTrippers). Update usually sets an endpoint pool, whose
	// subscribers then run with mu held: they must not call the Learner
	// either. The Cache and Admit are called with mu released.
	mu      sync.Mutex
	applied []string // the alternatives last given to Update, sorted
}

// NewLearner validates cfg and returns a Learner.
func NewLearner(cfg ClientConfig) (*Learner, error) {
	if cfg.Update == nil {
		return nil, fmt.Errorf("altsvc: ClientConfig.Update is nil: the learned alternatives would go nowhere")
	}
	if cfg.Admit == nil {
		return nil, fmt.Errorf("altsvc: ClientConfig.Admit is nil: without an admission policy no alternative would be used")
	}
	if cfg.Origin.Scheme != "https" || cfg.Origin.Host == "" || cfg.Origin.Port < 1 || cfg.Origin.Port > 65535 {
		return nil, fmt.Errorf("altsvc: ClientConfig.Origin %+v: want scheme https, a host and a port 1-65535", cfg.Origin)
	}
	if cfg.Cache == nil {
		cfg.Cache = NewCache(CacheConfig{})
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Learner{cfg: cfg}, nil
}

// Observe learns from resp, the answer to req, and expires what ran out.
func (l *Learner) Observe(req *http.Request, resp *http.Response) {
	now := l.cfg.Now()
	if resp != nil && l.trusted(req, resp) {
		if v, ok := resp.Header["Alt-Svc"]; ok {
			l.learn(v, ageOf(resp.Header), now)
		}
	}
	l.apply(now)
}

// RoundTripper sends requests with next and lets a Learner observe the
// responses.
type RoundTripper struct {
	l    *Learner
	next http.RoundTripper
}

// NewRoundTripper returns a RoundTripper with a Learner of its own.
func NewRoundTripper(cfg ClientConfig, rt http.RoundTripper) (*RoundTripper, error) {
	l, err := NewLearner(cfg)
	if err != nil {
		return nil, err
	}
	return l.Wrap(rt), nil
}

// Wrap returns a RoundTripper that sends with rt and learns into l.
func (l *Learner) Wrap(rt http.RoundTripper) *RoundTripper {
	return &RoundTripper{l: l, next: rt}
}

// WrappedRoundTripper returns the RoundTripper requests are sent with.
func (rt *RoundTripper) WrappedRoundTripper() http.RoundTripper { return rt.next }

// RoundTrip sends req and learns from the response.
func (rt *RoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	if err != nil {
		resp = nil
	}
	rt.l.Observe(req, resp)
	return resp, err
}

// trusted reports whether resp may teach alternatives for the origin.
func (l *Learner) trusted(req *http.Request, resp *http.Response) bool {
	switch {
	case req.URL == nil || req.URL.Scheme != "https":
		return false
	case !l.isOrigin(req.URL.Host):
		return false
	case l.cfg.Trust != nil && !l.cfg.Trust(req):
		return false
	case resp.StatusCode == http.StatusMisdirectedRequest:
		return false
	case resp.ProtoMajor != 2:
		return false
	case resp.TLS == nil || len(resp.TLS.VerifiedChains) == 0:
		return false
	}
	return true
}

func (l *Learner) isOrigin(hostport string) bool {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, "443"
	}
	p, _ := strconv.Atoi(port)
	return strings.EqualFold(strings.Trim(host, "[]"), l.cfg.Origin.Host) && p == l.cfg.Origin.Port
}

func (l *Learner) learn(lines []string, age time.Duration, now time.Time) {
	v, err := ParseHeader(lines)
	if err != nil {
		l.cfg.Logger.V(2).Info("ignoring Alt-Svc header", "err", err.Error())
		return
	}
	l.cfg.Cache.Update(l.cfg.Origin, now, v, age)
}

// apply gives Update the current, admitted alternatives when they changed.
func (l *Learner) apply(now time.Time) {
	var addrs []string
	for _, e := range l.cfg.Cache.Get(l.cfg.Origin, now) {
		if addr, ok := l.admit(e.Alternative); ok {
			addrs = append(addrs, addr)
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Equal(addrs, l.applied) {
		return
	}
	l.cfg.Update(addrs)
	l.applied = addrs
}

// admit returns the address of an h2 alternative that Admit admits. Parse
// has canonicalized the alternative's host.
func (l *Learner) admit(a Alternative) (string, bool) {
	if a.Protocol != "h2" {
		return "", false
	}
	host := a.Host
	if host == "" {
		host = l.cfg.Origin.Host
	}
	addr := net.JoinHostPort(host, strconv.Itoa(a.Port))
	if !l.cfg.Admit(addr) {
		l.cfg.Logger.V(2).Info("ignoring alternative the policy does not admit", "alternative", addr)
		return "", false
	}
	return addr, true
}

// ageOf reads the Age header (RFC 9111 delta-seconds); invalid means 0.
func ageOf(h http.Header) time.Duration {
	v := h.Get("Age")
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 31)
	if err != nil {
		return 0
	}
	return time.Duration(n) * time.Second
}
