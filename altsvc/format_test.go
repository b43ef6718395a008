package altsvc_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

func TestFormat(t *testing.T) {
	tests := []struct {
		name string
		in   altsvc.Value
		want string
	}{
		{"clear", altsvc.Value{Clear: true}, "clear"},
		{"same host", list(alt("h2", "", 443)), `h2=":443"`},
		{"DNS name", list(alt("h2", "alt.example", 8443)), `h2="alt.example:8443"`},
		{"DNS name lower-cased", list(alt("h2", "Alt.Example", 8443)), `h2="alt.example:8443"`},
		{"IPv4", list(alt("h2", "192.0.2.1", 6443)), `h2="192.0.2.1:6443"`},
		{"IPv6 bracketed", list(alt("h2", "2001:db8::1", 443)), `h2="[2001:db8::1]:443"`},
		{"IPv6 canonicalised", list(alt("h2", "2001:DB8:0::1", 443)), `h2="[2001:db8::1]:443"`},
		{"IPv4-mapped IPv6 in hex", list(alt("h2", "::ffff:192.0.2.1", 443)), `h2="[::ffff:c000:201]:443"`},
		{"ma", list(ma(alt("h2", "", 443), 3600)), `h2=":443";ma=3600`},
		{"ma zero", list(ma(alt("h2", "", 443), 0)), `h2=":443";ma=0`},
		{"ma rounded down", list(altsvc.Alternative{Protocol: "h2", Port: 443, MaxAge: 1500 * time.Millisecond}), `h2=":443";ma=1`},
		{"ma clamped", list(altsvc.Alternative{Protocol: "h2", Port: 443, MaxAge: 1 << 62}), `h2=":443";ma=2147483648`},
		{"persist", list(persist(alt("h2", "", 443))), `h2=":443";persist=1`},
		{"ma and persist", list(persist(ma(alt("h2", "", 443), 60))), `h2=":443";ma=60;persist=1`},
		{"percent-encoded protocol", list(alt("http/1.1", "", 80)), `http%2F1.1=":80"`},
		{"percent and non-ASCII encoded", list(alt("a%b\xff =", "", 80)), `a%25b%FF%20%3D=":80"`},
		{"several", list(alt("h2", "a.example", 443), ma(alt("h3", "", 443), 5)), `h2="a.example:443",h3=":443";ma=5`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := altsvc.Format(tt.in)
			if err != nil {
				t.Fatalf("Format(%+v): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("Format(%+v)\n got %s\nwant %s", tt.in, got, tt.want)
			}
		})
	}
}

// TestFormatIPv6 checks the shortest IPv6 form that Format writes.
func TestFormatIPv6(t *testing.T) {
	tests := []struct{ host, want string }{
		{"::", "::"},
		{"::1", "::1"},
		{"1::", "1::"},
		{"2001:db8::1", "2001:db8::1"},
		{"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"}, // first of equal runs
		{"2001:0:0:1:0:0:0:1", "2001:0:0:1::1"},       // longest run
		{"1:0:1:0:1:1:0:1", "1::1:0:1:1:0:1"},         // single zero group, first
		{"0:1:1:1:1:1:1:1", "0:1:1:1:1:1:1:1"},        // compressing saves nothing
		{"0:1:0:1:1:1:1:1", "0:1::1:1:1:1:1"},         // inner run beats edge run
		{"0:0:1:1:1:1:1:1", "::1:1:1:1:1:1"},          // edge run of two saves one
		{"1:1:1:1:1:1:0:0", "1:1:1:1:1:1::"},          // at the end
		{"::ffff:192.0.2.1", "::ffff:c000:201"},       // IPv4-mapped in hex
		{"64:ff9b::192.0.2.1", "64:ff9b::c000:201"},   // embedded IPv4 in hex
		{"fd00:abcd:ef01:2345:6789:0:0:0", "fd00:abcd:ef01:2345:6789::"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, err := altsvc.Format(list(alt("h2", tt.host, 1)))
			if want := `h2="[` + tt.want + `]:1"`; err != nil || got != want {
				t.Errorf("Format = %q, %v; want %q", got, err, want)
			}
		})
	}
}

// TestFormatIPv6Shortest checks on many addresses with zero groups that the
// IPv6 form Format writes is no longer than RFC 5952 (netip) and parses back.
func TestFormatIPv6Shortest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b [16]byte
		for i := 0; i < 16; i += 2 {
			if r.IntN(2) == 0 { // half the groups zero, the rest of random size
				v := uint16(r.Uint32()) >> r.IntN(16)
				b[i], b[i+1] = byte(v>>8), byte(v)
			}
		}
		a := netip.AddrFrom16(b)
		v := list(alt("h2", a.String(), 1))
		out, err := altsvc.Format(v)
		if err != nil {
			t.Fatalf("Format(%s): %v", a, err)
		}
		if len(out) > len(`h2="[]:1"`)+len(a.String()) {
			t.Errorf("Format(%s) = %s, longer than RFC 5952", a, out)
		}
		if back, err := altsvc.Parse(out); err != nil || !reflect.DeepEqual(back, v) {
			t.Fatalf("Parse(%s) = %+v, %v; want %+v", out, back, err, v)
		}
	}
}

func TestFormatErrors(t *testing.T) {
	many := make([]altsvc.Alternative, altsvc.MaxAlternatives+1)
	for i := range many {
		many[i] = alt("h2", "", i+1)
	}
	long := make([]altsvc.Alternative, altsvc.MaxAlternatives)
	for i := range long {
		long[i] = alt(strings.Repeat("p", 255), "", 1)
	}
	tests := []struct {
		name string
		in   altsvc.Value
		err  error
	}{
		{"empty", altsvc.Value{}, altsvc.ErrSyntax},
		{"clear with alternatives", altsvc.Value{Clear: true, Alternatives: []altsvc.Alternative{alt("h2", "", 1)}}, altsvc.ErrSyntax},
		{"too many", list(many...), altsvc.ErrTooMany},
		{"too long", list(long...), altsvc.ErrTooLong},
		{"empty protocol", list(alt("", "", 443)), altsvc.ErrSyntax},
		{"protocol too long", list(alt(strings.Repeat("p", 256), "", 443)), altsvc.ErrSyntax},
		{"port zero", list(alt("h2", "", 0)), altsvc.ErrSyntax},
		{"port too big", list(alt("h2", "", 65536)), altsvc.ErrSyntax},
		{"negative ma", list(ma(alt("h2", "", 443), -1)), altsvc.ErrSyntax},
		{"host with space", list(alt("h2", "a b", 443)), altsvc.ErrSyntax},
		{"host with quote", list(alt("h2", `a"b`, 443)), altsvc.ErrSyntax},
		{"host bracketed", list(alt("h2", "[::1]", 443)), altsvc.ErrSyntax},
		{"host with port", list(alt("h2", "a.example:443", 443)), altsvc.ErrSyntax},
		{"host IPv6 zone", list(alt("h2", "fe80::1%eth0", 443)), altsvc.ErrSyntax},
		{"host trailing dot", list(alt("h2", "a.example.", 443)), altsvc.ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := altsvc.Format(tt.in)
			if err == nil {
				t.Fatalf("Format(%+v) = %q, want error", tt.in, got)
			}
			if !errors.Is(err, tt.err) {
				t.Errorf("Format error %v is not %v", err, tt.err)
			}
			if !strings.HasPrefix(err.Error(), "altsvc: ") {
				t.Errorf("Format error %q lacks the package prefix", err)
			}
		})
	}
}

// TestFormatRoundTrip formats every valid parser test value and parses it
// back: the value must survive, the output must be canonical (formatting it
// again changes nothing) and no longer than the input.
func TestFormatRoundTrip(t *testing.T) {
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := altsvc.Format(tt.want)
			if err != nil {
				t.Fatalf("Format(%+v): %v", tt.want, err)
			}
			back, err := altsvc.Parse(out)
			if err != nil {
				t.Fatalf("Parse(Format(%+v)) = Parse(%q): %v", tt.want, out, err)
			}
			if !reflect.DeepEqual(back, tt.want) {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", out, back, tt.want)
			}
			again, err := altsvc.Format(back)
			if err != nil || again != out {
				t.Errorf("Format not canonical: %q, then %q (%v)", out, again, err)
			}
			if len(out) > len(tt.in) {
				t.Errorf("Format output %q longer than input %q", out, tt.in)
			}
		})
	}
}
