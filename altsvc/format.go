package altsvc

import (
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Format returns the canonical Alt-Svc field value for v, the shortest form
// without optional white space:
//
//	clear
//	h2=":443"
//	h2="a.example:8443";ma=60;persist=1,http%2F1.1="[2001:db8::1]:443"
//
// The protocol is percent-encoded with upper-case hex digits where it is not
// a token character (and for "%"). A DNS name is lower-cased. An IPv6
// address is bracketed and written in its shortest form: like RFC 5952, but
// a single zero group is compressed when that is shorter and IPv4-mapped
// addresses are hexadecimal ([Parse] turns it back into the RFC 5952 form
// that [Alternative.Host] holds). "ma" is left out when MaxAge is
// [DefaultMaxAge], otherwise written in whole seconds (rounded down, clamped
// to 2^31). "persist=1" is written when Persist is set.
//
// Format rejects what [Parse] would reject, so that for every Value v
// returned by [Parse], Parse(Format(v)) returns v again: a Value with both
// Clear and Alternatives, or with neither; more than [MaxAlternatives]
// alternatives ([ErrTooMany]); an output longer than [MaxFieldLength]
// ([ErrTooLong]); an empty or over-long protocol, an invalid host, a port
// outside 1 to 65535, or a negative MaxAge ([ErrSyntax]). The canonical form
// is never longer than any field value it was parsed from, so a Value from
// Parse always formats.
func Format(v Value) (string, error) {
	switch {
	case v.Clear && len(v.Alternatives) > 0:
		return "", &formatError{index: -1, msg: "both clear and alternatives", err: ErrSyntax}
	case v.Clear:
		return "clear", nil
	case len(v.Alternatives) == 0:
		return "", &formatError{index: -1, msg: "no alternatives", err: ErrSyntax}
	case len(v.Alternatives) > MaxAlternatives:
		return "", &formatError{index: MaxAlternatives, msg: "more than " + strconv.Itoa(MaxAlternatives) + " alternatives", err: ErrTooMany}
	}
	var buf [256]byte // the output of up to a few alternatives stays on the stack
	b := buf[:0]
	for i, a := range v.Alternatives {
		if i > 0 {
			b = append(b, ',')
		}
		var msg string
		if b, msg = appendAlternative(b, a); msg != "" {
			return "", &formatError{index: i, msg: msg, err: ErrSyntax}
		}
		if len(b) > MaxFieldLength {
			return "", &formatError{index: i, msg: "longer than " + strconv.Itoa(MaxFieldLength) + " bytes", err: ErrTooLong}
		}
	}
	return string(b), nil
}

// appendAlternative appends one alt-value, or returns why a cannot be
// formatted.
func appendAlternative(b []byte, a Alternative) ([]byte, string) {
	switch {
	case a.Protocol == "":
		return b, "empty protocol"
	case len(a.Protocol) > maxProtocolLength:
		return b, "protocol too long"
	case a.Port < 1 || a.Port > maxPort:
		return b, "port out of range"
	case a.MaxAge < 0:
		return b, "negative max age"
	}
	var (
		host string
		ip6  netip.Addr
		msg  string
	)
	if strings.IndexByte(a.Host, ':') >= 0 {
		ip6, msg = parseIPv6(a.Host)
	} else {
		host, _, msg = canonicalHost(a.Host)
	}
	if msg != "" {
		return b, msg
	}
	b = appendProtocol(b, a.Protocol)
	b = append(b, `="`...)
	if ip6.IsValid() {
		b = append(b, '[')
		b = appendShortIPv6(b, ip6)
		b = append(b, ']')
	} else {
		b = append(b, host...)
	}
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(a.Port), 10)
	b = append(b, '"')
	if a.MaxAge != DefaultMaxAge {
		b = append(b, ";ma="...)
		b = strconv.AppendInt(b, int64(min(a.MaxAge, maxMaxAge)/time.Second), 10)
	}
	if a.Persist {
		b = append(b, ";persist=1"...)
	}
	return b, ""
}

// appendProtocol appends the canonical protocol-id for an ALPN name (RFC 7838
// section 3.1): octets that are token characters other than "%" as they
// are, all others percent-encoded with upper-case hex digits.
func appendProtocol(b []byte, name string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(name); i++ {
		c := name[i]
		if isTChar(c) && c != '%' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&0xF])
	}
	return b
}

// formatError reports a Value that [Format] cannot write.
type formatError struct {
	index int    // index of the offending alternative, or -1
	msg   string // what is wrong
	err   error  // sentinel: ErrSyntax, ErrTooLong or ErrTooMany
}

func (e *formatError) Error() string {
	if e.index < 0 {
		return "altsvc: cannot format value: " + e.msg
	}
	return "altsvc: cannot format alternative " + strconv.Itoa(e.index) + ": " + e.msg
}

func (e *formatError) Unwrap() error { return e.err }
