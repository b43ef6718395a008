// Package altsvc implements HTTP Alternative Services (RFC 7838): parsing and
// formatting of Alt-Svc field values and a bounded, lazily expiring cache of
// the alternatives learned per origin.
//
// # Parsing
//
// [Parse] parses one field value, [ParseHeader] the field lines of one
// response (as returned by http.Header.Values). The grammar is RFC 7838
// section 3:
//
//	Alt-Svc       = clear / 1#alt-value
//	clear         = %s"clear"
//	alt-value     = alternative *( OWS ";" OWS parameter )
//	alternative   = protocol-id "=" alt-authority
//	protocol-id   = token ; percent-encoded ALPN protocol name
//	alt-authority = quoted-string ; containing [ uri-host ] ":" port
//	parameter     = token "=" ( token / quoted-string )
//
// Where the RFC leaves room, this package decides as follows:
//
//   - A field value is accepted or rejected as a whole: any syntax error, an
//     invalid host or port, too long a value or too many alternatives yields
//     a [*ParseError] and no alternatives at all (as Chromium does). Callers
//     leave their cache untouched on error.
//   - Empty list elements (", ,", a leading or trailing comma) are skipped,
//     as the RFC 9110 #rule requires of recipients. A value made only of empty
//     elements is an error: the grammar needs at least one alt-value.
//   - "clear" is case-sensitive. It may appear as any list element, on any
//     field line; then the result is [Value.Clear] and the alternatives of the
//     same response are discarded (RFC 7838 section 3: clear invalidates
//     "those specified in the same response, in case of an invalid reply
//     containing both"). "clear" with parameters is a syntax error.
//   - Limits apply to the combined field value (lines joined with ", "):
//     at most [MaxFieldLength] bytes ([ErrTooLong]) and at most
//     [MaxAlternatives] alternatives ([ErrTooMany]). Excess is an error, never
//     a silent truncation. Errors win over "clear".
//   - The protocol-id is percent-decoded into [Alternative.Protocol] (the ALPN
//     name, e.g. "http/1.1"). Lower-case hex digits are accepted; formatting
//     always uses the canonical encoding (upper-case hex, only non-tchar
//     octets and "%" encoded). The decoded name must be 1 to 255 octets.
//   - The host must be empty (same host as the origin), an IPv4 address, a
//     bracketed IPv6 address without zone, or an RFC 1123 DNS name without
//     trailing dot. Hosts are canonicalised: DNS names lower-cased, IPv6 as
//     netip.Addr.String writes it (RFC 5952), stored without brackets. The
//     port must be 1 to 65535.
//   - [Format] writes the shortest canonical form (no optional white space,
//     "ma" only when not the default, IPv6 addresses in their shortest
//     text), so a formatted Value is never longer than the field value it
//     was parsed from, and always parses back to the same Value.
//   - Parameter names are matched case-insensitively; values may be tokens or
//     quoted-strings. When a parameter repeats, the last one wins (as in RFC
//     8941 structured fields). "ma" must be delta-seconds; values above 2^31
//     are clamped to 2^31 (RFC 9111 section 1.2.2). "persist" is true only for
//     the value "1"; other values are ignored as the RFC requires. Unknown
//     parameters are checked for syntax and ignored.
//   - No white space is allowed around "=" (the grammar has none); OWS is
//     allowed around ";" and ",".
//
// # Caching
//
// [Cache] keeps the alternatives of up to a bounded number of origins, each
// with an expiry of now + min(ma − Age, cap). Expiry is checked lazily on
// [Cache.Get]; the cache starts no goroutines.
//
// # Learning and advertising
//
// A [Learner] (and its [RoundTripper]) learns alternatives from the
// responses of one origin and hands the admitted ones to a hook; which
// alternatives may be used ([ClientConfig.Admit]) and where they go
// ([ClientConfig.Update]) are the caller's policy: the package imports
// nothing of apifailover's. [NewHandler] advertises endpoints on the server
// side.
package altsvc

import "time"

const (
	// MaxFieldLength is the largest Alt-Svc field value, in bytes, that
	// [Parse] and [ParseHeader] accept. For several field lines it applies to
	// the combined value (lines joined with ", ").
	MaxFieldLength = 4096

	// MaxAlternatives is the largest number of alternatives that [Parse] and
	// [ParseHeader] accept in one response, and that [Cache] keeps per origin.
	MaxAlternatives = 16

	// DefaultMaxAge is the freshness lifetime of an alternative without an
	// "ma" parameter (RFC 7838 section 3.1: 24 hours).
	DefaultMaxAge = 24 * time.Hour

	// maxMaxAge is the largest "ma" value represented; larger values are
	// clamped to it (RFC 9111 section 1.2.2).
	maxMaxAge = (1 << 31) * time.Second

	// maxProtocolLength is the longest ALPN protocol name (RFC 7301 section 3.1).
	maxProtocolLength = 255
)

// Alternative is one alternative service: the origin's resource is also
// available over Protocol at Host:Port.
type Alternative struct {
	// Protocol is the ALPN protocol name, percent-decoded (e.g. "h2",
	// "http/1.1").
	Protocol string
	// Host is the alternative host without brackets: empty (the origin's own
	// host), an IPv4 address, an IPv6 address as netip.Addr.String writes
	// it (RFC 5952), or a lower-case DNS name.
	Host string
	// Port is the alternative port, 1 to 65535.
	Port int
	// MaxAge is the freshness lifetime from the "ma" parameter, in whole
	// seconds; [DefaultMaxAge] when absent. Zero means already stale (note
	// that the zero Alternative therefore formats with "ma=0").
	MaxAge time.Duration
	// Persist reports "persist=1": the alternative survives network
	// configuration changes. [Cache] stores but does not act on it.
	Persist bool
}

// Value is a parsed Alt-Svc field value: either "clear" or a non-empty list
// of alternatives, in the server's order of preference.
type Value struct {
	// Clear reports the special value "clear": all alternatives of the
	// origin are invalidated. Alternatives is then nil.
	Clear bool
	// Alternatives lists the advertised alternatives when Clear is false.
	Alternatives []Alternative
}
