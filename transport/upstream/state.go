// Package upstream is the one selector of apifailover: the set of API server
// endpoints, their health, and the order in which clients should try them.
//
// The pool knows nothing of HTTP. Health probes are supplied through the
// Prober interface; the dialer, the RoundTripper and the L4 proxy report what
// they see on real traffic (Report*, ConnOpened/ConnClosed) and react to the
// pool's events (an endpoint went down or was removed: close its connections;
// a better endpoint is preferred: retire the old connections gracefully).
package upstream

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Source says where the pool learned about an endpoint. An endpoint may have
// several sources; it stays in the pool while it has at least one.
type Source uint8

const (
	// SourceStatic: configured by the user (flags, Options.Endpoints, the
	// rest.Config host). Static endpoints are always kept.
	SourceStatic Source = 1 << iota
	// SourceDiscovery: the kubernetes EndpointSlice (or Endpoints) in default.
	SourceDiscovery
	// SourceAltSvc: an Alt-Svc response header.
	SourceAltSvc
	// SourceStateFile: the last-known-good list saved by an earlier run.
	SourceStateFile
)

var sourceNames = []struct {
	s    Source
	name string
}{
	{SourceStatic, "static"},
	{SourceDiscovery, "discovery"},
	{SourceAltSvc, "altsvc"},
	{SourceStateFile, "statefile"},
}

// String lists the sources separated by commas, e.g. "static,discovery".
func (s Source) String() string {
	var parts []string
	for _, n := range sourceNames {
		if s&n.s != 0 {
			parts = append(parts, n.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// MarshalText renders the sources as in String.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// State is the health state of an endpoint.
type State uint8

const (
	// StateUnknown: not probed yet. Ranked after healthy endpoints and before
	// unhealthy ones.
	StateUnknown State = iota
	// StateHealthy: the last Rise observations succeeded (or the first one
	// did, for an endpoint that was unknown).
	StateHealthy
	// StateUnhealthy: Fall consecutive observations failed.
	StateUnhealthy
	// StateQuarantined: the endpoint presented a certificate that does not
	// verify (for a reason other than its validity period, see
	// ErrCertificateTime). It is tried last and probed with backoff
	// (Config.QuarantineBackoff) instead of every interval; the first
	// successful probe makes it healthy at once, as for an endpoint never
	// probed. Passive signals neither lift nor extend a quarantine. A
	// configuration change (Set with a different spec, or ResetQuarantine)
	// lifts it to StateUnknown.
	StateQuarantined
)

// String returns the lowercase state name.
func (s State) String() string {
	switch s {
	case StateUnknown:
		return "unknown"
	case StateHealthy:
		return "healthy"
	case StateUnhealthy:
		return "unhealthy"
	case StateQuarantined:
		return "quarantined"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText renders the state as in String.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Spec describes an endpoint as a source knows it.
type Spec struct {
	// Addr is host:port: an IPv4 address, a bracketed IPv6 address or a DNS
	// name, and a port. Use ParseAddr to validate and normalize user input.
	Addr string
	// Zone is the topology zone of the endpoint, if the source knows it.
	Zone string
}

// Status is a snapshot of one endpoint, as shown by /status and metrics.
type Status struct {
	Addr    string `json:"addr"`
	Sources Source `json:"sources"`
	State   State  `json:"state"`
	Zone    string `json:"zone,omitempty"`
	Local   bool   `json:"local"`
	// Suspect: the most recent observation failed, but not yet Fall in a row.
	Suspect bool `json:"suspect"`
	// Draining: the server announced a shutdown (GOAWAY); ranked lower until
	// a probe succeeds again.
	Draining bool `json:"draining"`
	// Slow: the endpoint lost connection races in a row as the first
	// candidate and is ranked with suspect endpoints for a while.
	Slow bool `json:"slow,omitempty"`
	// RTT is a moving average of successful probe durations; zero if unknown.
	RTT time.Duration `json:"rtt"`
	// Conns is the number of open connections the pool's users reported.
	Conns int `json:"conns"`
	// Preferred marks the endpoint new connections go to first.
	Preferred bool `json:"preferred"`
	// LastError is the most recent failure, empty after a success.
	LastError string `json:"lastError,omitempty"`
	// Since is when State last changed.
	Since time.Time `json:"since"`
}

// EventKind says what changed.
type EventKind uint8

const (
	// EventAdded: a new endpoint entered the pool.
	EventAdded EventKind = iota + 1
	// EventRemoved: the endpoint's last source dropped it. Close its
	// connections.
	EventRemoved
	// EventUp: the endpoint became healthy.
	EventUp
	// EventDown: the endpoint became unhealthy or quarantined. Close its
	// connections.
	EventDown
	// EventPreferred: a different endpoint is now first in line. Prev is the
	// one preferred before (empty if none). New connections should go to
	// Addr; connections to Prev may be retired gracefully.
	EventPreferred
)

// String returns the lowercase event name.
func (k EventKind) String() string {
	switch k {
	case EventAdded:
		return "added"
	case EventRemoved:
		return "removed"
	case EventUp:
		return "up"
	case EventDown:
		return "down"
	case EventPreferred:
		return "preferred"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is a change in the pool, delivered to subscribers in order.
type Event struct {
	Kind EventKind
	Addr string
	// Prev is set for EventPreferred.
	Prev string
	// State is the endpoint's state after the change.
	State State
	// Err is the failure that caused an EventDown, if any.
	Err error
}

// Failure classifies a passive failure seen on real traffic.
type Failure uint8

const (
	// FailureDial: the TCP connect failed or timed out.
	FailureDial Failure = iota + 1
	// FailureTLS: the TLS handshake failed for a reason other than the
	// certificate (reset, timeout).
	FailureTLS
	// FailureCertificate: the server's certificate did not verify. The
	// endpoint is quarantined, unless the error is a time-validity one
	// (IsCertificateTimeError), which counts like FailureCertificateTime.
	FailureCertificate
	// FailureConnLost: an established connection died (read error, ping
	// timeout) without the pool asking for it.
	FailureConnLost
	// FailureGoAway: the server sent GOAWAY (graceful shutdown or load
	// shedding). The endpoint is ranked lower until a probe succeeds; it is
	// not counted towards Fall.
	FailureGoAway
	// FailureCertificateTime: the server's certificate is expired or not yet
	// valid by this host's clock (see ErrCertificateTime). Counted like
	// FailureTLS, towards Fall: a clock that is wrong at boot, or a
	// certificate renewed a moment late, is transient.
	FailureCertificateTime
)

// String returns the failure name used in logs and metrics labels.
func (f Failure) String() string {
	switch f {
	case FailureDial:
		return "dial"
	case FailureTLS:
		return "tls"
	case FailureCertificate:
		return "certificate"
	case FailureConnLost:
		return "conn_lost"
	case FailureGoAway:
		return "goaway"
	case FailureCertificateTime:
		return "certificate_time"
	}
	return "failure(" + strconv.Itoa(int(f)) + ")"
}

// ErrCertificate marks probe errors caused by a certificate that does not
// verify. A Prober wraps such errors so that errors.Is(err, ErrCertificate)
// holds; the pool then quarantines the endpoint, unless the error is a
// time-validity one (IsCertificateTimeError).
var ErrCertificate = errors.New("certificate verification failed")

// ErrCertificateTime marks probe errors caused by a certificate that is
// expired or not yet valid by this host's clock, and otherwise unchecked
// (crypto/x509 checks a certificate's validity period before its chain and
// names). A Prober wraps such errors with it instead of ErrCertificate. The
// pool counts them as ordinary failures: the endpoint becomes unhealthy and
// is probed every interval, so it returns as soon as the clock or the
// certificate is right (a node booting with its clock behind, a VM restored
// from a snapshot, a certificate renewed a moment late).
var ErrCertificateTime = errors.New("certificate not valid at the current time")

// IsCertificateTimeError reports whether err is a certificate failure caused
// by the validity period only: it wraps ErrCertificateTime or an
// x509.CertificateInvalidError with Reason x509.Expired (which crypto/x509
// uses for "not yet valid" as well as for "expired").
func IsCertificateTimeError(err error) bool {
	if errors.Is(err, ErrCertificateTime) {
		return true
	}
	var ci x509.CertificateInvalidError
	return errors.As(err, &ci) && ci.Reason == x509.Expired
}

// ErrNoEndpoints is returned when the pool has no endpoint at all.
var ErrNoEndpoints = errors.New("no endpoints configured")

// AddrError reports an invalid endpoint address.
type AddrError struct {
	Input string
	Msg   string
}

func (e *AddrError) Error() string {
	return fmt.Sprintf("invalid endpoint %q: %s (want host:port with an IPv4 address, a bracketed IPv6 address or a DNS name, and a port 1-65535)", e.Input, e.Msg)
}

// ParseAddr validates an endpoint given as host:port and returns it in
// canonical form: IP addresses normalized (IPv6 in brackets, zone kept),
// DNS names lowercased without a trailing dot.
func ParseAddr(s string) (string, error) {
	if s == "" {
		return "", &AddrError{Input: s, Msg: "empty"}
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", &AddrError{Input: s, Msg: strings.TrimPrefix(err.Error(), "address "+s+": ")}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || port[0] == '+' {
		return "", &AddrError{Input: s, Msg: fmt.Sprintf("port %q is not a number in 1-65535", port)}
	}
	if host == "" {
		return "", &AddrError{Input: s, Msg: "missing host"}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Is4In6() {
			ip = ip.Unmap()
		}
		if ip.IsUnspecified() {
			return "", &AddrError{Input: s, Msg: "unspecified address " + host}
		}
		return netip.AddrPortFrom(ip, uint16(p)).String(), nil
	}
	if strings.Contains(host, ":") {
		return "", &AddrError{Input: s, Msg: fmt.Sprintf("host %q is not a valid IPv6 address", host)}
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if msg := checkDNSName(name); msg != "" {
		return "", &AddrError{Input: s, Msg: msg}
	}
	return net.JoinHostPort(name, strconv.FormatUint(p, 10)), nil
}

// checkDNSName validates an RFC 1123 host name; it returns "" when valid.
func checkDNSName(name string) string {
	if len(name) == 0 || len(name) > 253 {
		return fmt.Sprintf("host %q is not a valid DNS name (1-253 characters)", name)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Sprintf("host %q is not a valid DNS name (labels of 1-63 characters)", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(label)-1
			if !ok {
				return fmt.Sprintf("host %q is not a valid DNS name (letters, digits and inner hyphens only)", name)
			}
		}
	}
	// A name made only of digits and dots is a malformed IPv4 address.
	if strings.Trim(name, "0123456789.") == "" {
		return fmt.Sprintf("host %q is not a valid IPv4 address", name)
	}
	return ""
}
