package altsvc

import (
	"net/netip"
	"strconv"
	"strings"
)

const (
	maxNameLength  = 253 // RFC 1123 host name, without trailing dot
	maxLabelLength = 63
	maxPort        = 65535
)

// parseAuthority parses the unescaped content of an alt-authority,
// "[host]:port". It returns the canonical host (see [Alternative.Host]) and
// the port, or a message and the offset in s of the problem.
func parseAuthority(s string) (host string, port int, off int, msg string) {
	if s == "" {
		return "", 0, 0, "empty alt-authority"
	}
	portAt := 0
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, 0, "missing ']' after IPv6 address"
		}
		if host, msg = canonicalIPv6(s[1:end]); msg != "" {
			return "", 0, 1, msg
		}
		if end+1 >= len(s) || s[end+1] != ':' {
			return "", 0, end + 1, "expected ':' after IPv6 address"
		}
		portAt = end + 2
	} else {
		colon := strings.LastIndexByte(s, ':')
		if colon < 0 {
			return "", 0, len(s), "missing ':' before port"
		}
		if host, off, msg = canonicalHost(s[:colon]); msg != "" {
			return "", 0, off, msg
		}
		portAt = colon + 1
	}
	if port, off, msg = parsePort(s[portAt:]); msg != "" {
		return "", 0, portAt + off, msg
	}
	return host, port, 0, ""
}

// parsePort parses a decimal port, 1 to 65535. Leading zeros are allowed.
func parsePort(s string) (port int, off int, msg string) {
	if s == "" {
		return 0, 0, "missing port"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, i, "invalid character in port"
		}
		port = port*10 + int(c-'0')
		if port > maxPort {
			return 0, 0, "port out of range"
		}
	}
	if port == 0 {
		return 0, 0, "port out of range"
	}
	return port, 0, ""
}

// canonicalHost checks an unbracketed host: empty, an IPv4 address or an
// RFC 1123 DNS name. DNS names are lower-cased.
func canonicalHost(h string) (string, int, string) {
	if h == "" {
		return "", 0, ""
	}
	if i := strings.IndexByte(h, ':'); i >= 0 {
		return "", i, "IPv6 address must be in brackets"
	}
	if c := h[0]; c >= '0' && c <= '9' {
		// The netip parser is strict (four decimal octets, no leading
		// zeros), so an accepted address is already canonical.
		if a, err := netip.ParseAddr(h); err == nil && a.Is4() {
			return h, 0, ""
		}
	}
	return canonicalName(h)
}

// canonicalName checks an RFC 1123 host name: dot-separated labels of 1 to 63
// letters, digits and hyphens, not starting or ending with a hyphen, at most
// 253 bytes, no trailing dot, and a last label that is not all digits (that
// would be a malformed IPv4 address). The result is lower-cased.
func canonicalName(h string) (string, int, string) {
	if len(h) > maxNameLength {
		return "", maxNameLength, "host name too long"
	}
	label, last, digits, upper := 0, 0, true, false
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 {
				return "", i, "empty label in host name"
			}
			if h[i-1] == '-' {
				return "", i - 1, "host name label ends with '-'"
			}
			label, last, digits = 0, i+1, true
			continue
		case c >= 'a' && c <= 'z':
			digits = false
		case c >= 'A' && c <= 'Z':
			digits, upper = false, true
		case c >= '0' && c <= '9':
		case c == '-':
			if label == 0 {
				return "", i, "host name label starts with '-'"
			}
			digits = false
		default:
			return "", i, "invalid character in host"
		}
		label++
		if label > maxLabelLength {
			return "", i, "host name label too long"
		}
	}
	switch {
	case label == 0:
		return "", len(h), "host name ends with '.'"
	case h[len(h)-1] == '-':
		return "", len(h) - 1, "host name label ends with '-'"
	case digits:
		return "", last, "invalid IPv4 address"
	case upper:
		return strings.ToLower(h), 0, ""
	}
	return h, 0, ""
}

// parseIPv6 checks the content of an IP-literal: an IPv6 address without
// zone.
func parseIPv6(h string) (netip.Addr, string) {
	a, err := netip.ParseAddr(h)
	switch {
	case err != nil:
		return netip.Addr{}, "invalid IPv6 address"
	case !a.Is6():
		return netip.Addr{}, "bracketed address is not IPv6"
	case a.Zone() != "":
		return netip.Addr{}, "IPv6 zone not allowed"
	}
	return a, ""
}

// canonicalIPv6 checks an IPv6 address like parseIPv6 and returns it as
// netip.Addr.String writes it (RFC 5952).
func canonicalIPv6(h string) (string, string) {
	a, msg := parseIPv6(h)
	if msg != "" {
		return "", msg
	}
	var buf [64]byte
	if b := a.AppendTo(buf[:0]); string(b) != h {
		return string(b), ""
	}
	return h, ""
}

// appendShortIPv6 appends the shortest text form of the IPv6 address a:
// hexadecimal groups without leading zeros, the zero run whose compression
// to "::" saves the most compressed (the first of equals; none if nothing is
// saved). Unlike RFC 5952 it compresses a single zero group when that is
// shorter, and writes IPv4-mapped addresses in hexadecimal, so the result is
// never longer than any text form of a that netip.ParseAddr accepts.
func appendShortIPv6(b []byte, a netip.Addr) []byte {
	v := a.As16()
	var g [8]uint64
	digits := len(g) - 1 // separators of the uncompressed form
	for i := range g {
		g[i] = uint64(v[2*i])<<8 | uint64(v[2*i+1])
		digits += hexDigits(g[i])
	}
	bestStart, bestEnd, bestLen := 0, 0, digits
	for i := 0; i < len(g); {
		if g[i] != 0 {
			i++
			continue
		}
		j := i
		for j < len(g) && g[j] == 0 {
			j++
		}
		// Groups outside [i, j) with their separators, plus "::".
		n := digits - len(g) + 1 - (j - i) + max(i-1, 0) + max(len(g)-j-1, 0) + 2
		if n < bestLen {
			bestStart, bestEnd, bestLen = i, j, n
		}
		i = j
	}
	for i := 0; i < len(g); i++ {
		if i == bestStart && bestEnd > bestStart {
			b = append(b, "::"...)
			i = bestEnd - 1
			continue
		}
		if i > 0 && i != bestEnd {
			b = append(b, ':')
		}
		b = strconv.AppendUint(b, g[i], 16)
	}
	return b
}

// hexDigits returns the number of hexadecimal digits of a 16-bit group.
func hexDigits(x uint64) int {
	switch {
	case x >= 0x1000:
		return 4
	case x >= 0x100:
		return 3
	case x >= 0x10:
		return 2
	}
	return 1
}
