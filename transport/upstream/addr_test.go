package upstream_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

func TestParseAddr(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := label63 + "." + label63 + "." + label63 + "." + strings.Repeat("d", 61)
	require.Len(t, name253, 253)

	tests := []struct {
		name string
		in   string
		want string
	}{
		{"ipv4", "10.0.0.1:6443", "10.0.0.1:6443"},
		{"ipv4 lowest port", "10.0.0.1:1", "10.0.0.1:1"},
		{"ipv4 highest port", "10.0.0.1:65535", "10.0.0.1:65535"},
		{"port with leading zeros", "10.0.0.1:06443", "10.0.0.1:6443"},
		{"loopback", "127.0.0.1:7445", "127.0.0.1:7445"},
		{"bracketed ipv4", "[10.0.0.1]:443", "10.0.0.1:443"},
		{"ipv6", "[2001:db8::1]:6443", "[2001:db8::1]:6443"},
		{"ipv6 normalized", "[2001:DB8:0:0:0:0:0:1]:6443", "[2001:db8::1]:6443"},
		{"ipv6 loopback", "[::1]:6443", "[::1]:6443"},
		{"ipv6 with zone", "[fe80::1%eth0]:6443", "[fe80::1%eth0]:6443"},
		{"ipv6 with zone normalized", "[FE80:0::1%eth0]:6443", "[fe80::1%eth0]:6443"},
		{"ipv4-mapped ipv6", "[::ffff:10.0.0.1]:6443", "10.0.0.1:6443"},
		{"ipv4-mapped ipv6 hex", "[::ffff:a00:1]:6443", "10.0.0.1:6443"},
		{"dns name", "api.example.com:6443", "api.example.com:6443"},
		{"dns name lowercased", "API.Example.COM:6443", "api.example.com:6443"},
		{"dns name trailing dot", "api.example.com.:6443", "api.example.com:6443"},
		{"dns name case and trailing dot", "Kubernetes.Default.SVC.:443", "kubernetes.default.svc:443"},
		{"single label", "localhost:6443", "localhost:6443"},
		{"inner hyphens and digits", "cp-1.k8s-2.example:6443", "cp-1.k8s-2.example:6443"},
		{"digits with a letter", "1.2.3.4a:443", "1.2.3.4a:443"},
		{"label of 63", label63 + ".example:443", label63 + ".example:443"},
		{"name of 253", name253 + ":443", name253 + ":443"},
		{"name of 253 with trailing dot", name253 + ".:443", name253 + ":443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := upstream.ParseAddr(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)

			again, err := upstream.ParseAddr(got)
			require.NoError(t, err, "canonical form must parse")
			assert.Equal(t, got, again, "canonical form must be a fixed point")
		})
	}
}

func TestParseAddrErrors(t *testing.T) {
	label64 := strings.Repeat("a", 64)
	label63 := strings.Repeat("a", 63)
	name254 := label63 + "." + label63 + "." + label63 + "." + strings.Repeat("d", 62)
	require.Len(t, name254, 254)

	tests := []struct {
		name string
		in   string
		msg  string // a fragment of the error message
	}{
		{"empty", "", "empty"},
		{"no port", "10.0.0.1", "missing port"},
		{"no port dns", "api.example.com", "missing port"},
		{"no port ipv6", "[2001:db8::1]", "missing port"},
		{"empty port", "10.0.0.1:", `port ""`},
		{"port 0", "10.0.0.1:0", `port "0"`},
		{"port 65536", "10.0.0.1:65536", `port "65536"`},
		{"port huge", "10.0.0.1:99999999999999999999", "not a number in 1-65535"},
		{"port plus sign", "10.0.0.1:+1", `port "+1"`},
		{"port minus sign", "10.0.0.1:-1", `port "-1"`},
		{"port name", "10.0.0.1:https", `port "https"`},
		{"port hex", "10.0.0.1:0x1bb", `port "0x1bb"`},
		{"port underscore", "10.0.0.1:6_443", `port "6_443"`},
		{"missing host", ":6443", "missing host"},
		{"missing host ipv6 brackets", "[]:6443", "missing host"},
		{"unspecified ipv4", "0.0.0.0:6443", "unspecified"},
		{"unspecified ipv6", "[::]:6443", "unspecified"},
		{"unspecified ipv4-mapped", "[::ffff:0.0.0.0]:6443", "unspecified"},
		{"ipv6 without brackets", "2001:db8::1:6443", "too many colons"},
		{"bad ipv6 digit", "[2001:db8::g]:6443", "not a valid IPv6"},
		{"bad ipv6 too short", "[1:2:3]:6443", "not a valid IPv6"},
		{"bad ipv6 two double colons", "[1::2::3]:6443", "not a valid IPv6"},
		{"bad ipv6 empty zone", "[fe80::1%]:6443", "not a valid IPv6"},
		{"unclosed bracket", "[2001:db8::1:6443", "missing ']'"},
		{"underscore", "api_server.example:6443", "letters, digits and inner hyphens"},
		{"leading hyphen", "-api.example:6443", "letters, digits and inner hyphens"},
		{"trailing hyphen", "api-.example:6443", "letters, digits and inner hyphens"},
		{"at sign", "user@api.example:6443", "letters, digits and inner hyphens"},
		{"non-ascii", "bücher.example:6443", "letters, digits and inner hyphens"},
		{"ipv4 with zone", "10.0.0.1%eth0:6443", "letters, digits and inner hyphens"},
		{"empty label", "api..example:6443", "labels of 1-63"},
		{"leading dot", ".example:6443", "labels of 1-63"},
		{"two trailing dots", "example..:6443", "labels of 1-63"},
		{"only a dot", ".:6443", "1-253 characters"},
		{"label of 64", label64 + ".example:6443", "labels of 1-63"},
		{"name of 254", name254 + ":6443", "1-253 characters"},
		{"three octets", "1.2.3:6443", "not a valid IPv4"},
		{"five octets", "1.2.3.4.5:6443", "not a valid IPv4"},
		{"octet too big", "256.1.1.1:6443", "not a valid IPv4"},
		{"leading zero octet", "010.0.0.1:6443", "not a valid IPv4"},
		{"all digits", "1234:6443", "not a valid IPv4"},
		{"leading space", " 10.0.0.1:6443", "letters, digits and inner hyphens"},
		{"space in name", "api example:6443", "letters, digits and inner hyphens"},
		{"space before port", "10.0.0.1: 6443", `port " 6443"`},
		{"trailing space", "10.0.0.1:6443 ", `port "6443 "`},
		{"scheme", "https://10.0.0.1:6443", "too many colons"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := upstream.ParseAddr(tt.in)
			require.Error(t, err)
			assert.Empty(t, got)

			var ae *upstream.AddrError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tt.in, ae.Input)
			assert.Contains(t, err.Error(), strconv.Quote(tt.in), "the message must name the input")
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

// FuzzParseAddr checks that the canonical form is a fixed point and that
// every error names its input.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:6443", "[2001:db8::1]:443", "[fe80::1%eth0]:1", "[::ffff:10.0.0.1]:6443",
		"API.Example.COM.:443", "localhost:1", "1.2.3:4", ":443", "10.0.0.1", "",
		"[::]:1", "a..b:1", "x:+1", "x:65536", "[1.2.3.4]:5", "-a:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := upstream.ParseAddr(s)
		if err != nil {
			var ae *upstream.AddrError
			if !errors.As(err, &ae) || ae.Input != s {
				t.Fatalf("ParseAddr(%q): error %v is not an AddrError for the input", s, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("ParseAddr(%q): error %q does not name the input", s, err)
			}
			return
		}
		again, err := upstream.ParseAddr(out)
		if err != nil {
			t.Fatalf("ParseAddr(%q) = %q, which does not parse: %v", s, out, err)
		}
		if again != out {
			t.Fatalf("ParseAddr(%q) = %q, but ParseAddr(%q) = %q", s, out, out, again)
		}
	})
}

func TestSourceString(t *testing.T) {
	tests := []struct {
		name string
		s    upstream.Source
		want string
	}{
		{"none", 0, "none"},
		{"static", upstream.SourceStatic, "static"},
		{"discovery", upstream.SourceDiscovery, "discovery"},
		{"altsvc", upstream.SourceAltSvc, "altsvc"},
		{"statefile", upstream.SourceStateFile, "statefile"},
		{"two", upstream.SourceStatic | upstream.SourceDiscovery, "static,discovery"},
		{"all", upstream.SourceStateFile | upstream.SourceAltSvc | upstream.SourceDiscovery | upstream.SourceStatic, "static,discovery,altsvc,statefile"},
		{"unknown bit ignored", upstream.SourceAltSvc | 1<<7, "altsvc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.s.String())
			b, err := tt.s.MarshalText()
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(b))
		})
	}
}

func TestStateString(t *testing.T) {
	tests := []struct {
		s    upstream.State
		want string
	}{
		{upstream.StateUnknown, "unknown"},
		{upstream.StateHealthy, "healthy"},
		{upstream.StateUnhealthy, "unhealthy"},
		{upstream.StateQuarantined, "quarantined"},
		{upstream.State(9), "state(9)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.s.String())
			b, err := tt.s.MarshalText()
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(b))
		})
	}
}

func TestEventKindString(t *testing.T) {
	tests := []struct {
		k    upstream.EventKind
		want string
	}{
		{upstream.EventAdded, "added"},
		{upstream.EventRemoved, "removed"},
		{upstream.EventUp, "up"},
		{upstream.EventDown, "down"},
		{upstream.EventPreferred, "preferred"},
		{upstream.EventKind(0), "event(0)"},
		{upstream.EventKind(42), "event(42)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.k.String())
		})
	}
}

func TestFailureString(t *testing.T) {
	tests := []struct {
		f    upstream.Failure
		want string
	}{
		{upstream.FailureDial, "dial"},
		{upstream.FailureTLS, "tls"},
		{upstream.FailureCertificate, "certificate"},
		{upstream.FailureConnLost, "conn_lost"},
		{upstream.FailureGoAway, "goaway"},
		{upstream.Failure(0), "failure(0)"},
		{upstream.Failure(200), "failure(200)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.f.String())
		})
	}
}

// TestStatusJSON checks that Source and State marshal as text in /status.
func TestStatusJSON(t *testing.T) {
	since := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	b, err := json.Marshal(upstream.Status{
		Addr:    "10.0.0.1:6443",
		Sources: upstream.SourceStatic | upstream.SourceDiscovery,
		State:   upstream.StateHealthy,
		RTT:     time.Millisecond,
		Conns:   2,
		Since:   since,
	})
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"addr": "10.0.0.1:6443",
		"sources": "static,discovery",
		"state": "healthy",
		"local": false,
		"suspect": false,
		"draining": false,
		"rtt": 1000000,
		"conns": 2,
		"preferred": false,
		"since": "2024-05-06T07:08:09Z"
	}`, string(b))
}

// Source and State read back what they marshal, so that a /status
// document decodes into a Status; anything else is an error naming it.
func TestStatusUnmarshalText(t *testing.T) {
	in := upstream.Status{Addr: "10.0.0.1:6443", Sources: upstream.SourceStatic | upstream.SourceAltSvc, State: upstream.StateQuarantined}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var out upstream.Status
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in, out)
	for _, s := range []upstream.Source{0, upstream.SourceDiscovery, upstream.SourceStateFile | upstream.SourceStatic | upstream.SourceDiscovery | upstream.SourceAltSvc} {
		var got upstream.Source
		require.NoError(t, got.UnmarshalText([]byte(s.String())))
		assert.Equal(t, s, got)
	}
	for st := upstream.StateUnknown; st <= upstream.StateQuarantined; st++ {
		var got upstream.State
		require.NoError(t, got.UnmarshalText([]byte(st.String())))
		assert.Equal(t, st, got)
	}
	var src upstream.Source
	assert.ErrorContains(t, src.UnmarshalText([]byte("static,dns")), `unknown endpoint source "dns" in "static,dns"`)
	assert.ErrorContains(t, src.UnmarshalText([]byte("")), `unknown endpoint source ""`)
	var st upstream.State
	assert.ErrorContains(t, st.UnmarshalText([]byte("state(9)")), `unknown endpoint state "state(9)"`)
}
