package upstream

import (
	"fmt"
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

// UnmarshalText reads what MarshalText writes ("none" or names separated
// by commas), so that a /status document decodes into a Status.
func (s *Source) UnmarshalText(b []byte) error {
	var out Source
	if text := string(b); text != "none" {
	names:
		for name := range strings.SplitSeq(text, ",") {
			for _, n := range sourceNames {
				if n.name == name {
					out |= n.s
					continue names
				}
			}
			return fmt.Errorf("upstream: unknown endpoint source %q in %q: want none, or static, discovery, altsvc and statefile separated by commas", name, text)
		}
	}
	*s = out
	return nil
}

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

// UnmarshalText reads a state's name as String writes it.
func (s *State) UnmarshalText(b []byte) error {
	for st := StateUnknown; st <= StateQuarantined; st++ {
		if st.String() == string(b) {
			*s = st
			return nil
		}
	}
	return fmt.Errorf("upstream: unknown endpoint state %q: want unknown, healthy, unhealthy or quarantined", b)
}

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
	// Waiting is the number of those waiting for their first byte (see
	// Pool.AddWaiting).
	Waiting int `json:"waiting,omitempty"`
	// Stalled is the number of those waiting past their deadline (see
	// Pool.AddStalled).
	Stalled int `json:"stalled,omitempty"`
	// Preferred marks the endpoint new connections go to first, unless
	// one waits on it for its first byte while another has none waiting
	// (see Pool.AddWaiting).
	Preferred bool `json:"preferred"`
	// LastError is the most recent failure, empty after a success.
	LastError string `json:"lastError,omitempty"`
	// Since is when State last changed.
	Since time.Time `json:"since"`
}
