package upstream

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

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
