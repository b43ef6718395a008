package localproxy

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/apifailover/apifailover/transport/upstream"
)

// EndpointError reports a static endpoint that does not parse: its
// address (as upstream.ParseAddr takes it) or its zone.
type EndpointError struct {
	// Input is the endpoint as given.
	Input string
	// Zone is set when the zone after '@' is wrong, not the address.
	Zone bool
	// Msg says what is wrong, without the input.
	Msg string
}

func (e *EndpointError) Error() string {
	return fmt.Sprintf("invalid endpoint %q: %s", e.Input, e.Msg)
}

// ParseEndpoint parses a static endpoint: host:port as upstream.ParseAddr
// takes it (an IPv4 address, a bracketed IPv6 address or a DNS name, and a
// port), optionally followed by @zone, the topology zone of that API
// server (as in its node's topology.kubernetes.io/zone label; see
// CheckZone): 10.0.0.1:6443@zone-a, [fd00::1]:6443@zone-b. The address is
// returned in canonical form. An '@' inside an IPv6 address's brackets
// belongs to the address.
func ParseEndpoint(s string) (upstream.Spec, error) {
	addr, zone, hasZone := s, "", false
	if i := strings.LastIndexByte(s, '@'); i > strings.LastIndexByte(s, ']') {
		addr, zone, hasZone = s[:i], s[i+1:], true
	}
	canon, err := upstream.ParseAddr(addr)
	if err != nil {
		msg := err.Error()
		if ae, ok := err.(*upstream.AddrError); ok {
			msg = ae.Msg
		}
		return upstream.Spec{}, &EndpointError{Input: s, Msg: msg}
	}
	if hasZone {
		if err := CheckZone(zone); err != nil {
			return upstream.Spec{}, &EndpointError{Input: s, Zone: true, Msg: "zone " + err.Error()}
		}
	}
	return upstream.Spec{Addr: canon, Zone: zone}, nil
}

// FormatEndpoint is the inverse of ParseEndpoint: the address, followed by
// @zone if the spec has one.
func FormatEndpoint(s upstream.Spec) string {
	if s.Zone == "" {
		return s.Addr
	}
	return s.Addr + "@" + s.Zone
}

// ZoneRule says what a zone may be, for messages.
const ZoneRule = "a Kubernetes label value: 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"

// CheckZone reports whether zone is a valid topology zone: a non-empty
// Kubernetes label value, as the topology.kubernetes.io/zone label of a
// node holds. The error says what is wrong and what is allowed.
func CheckZone(zone string) error {
	switch {
	case zone == "":
		return fmt.Errorf("is empty; want %s", ZoneRule)
	case len(zone) > content.LabelValueMaxLength:
		return fmt.Errorf("%q has %d characters; want %s", zone, len(zone), ZoneRule)
	case len(content.IsLabelValue(zone)) > 0:
		return fmt.Errorf("%q is not a label value; want %s", zone, ZoneRule)
	}
	return nil
}
