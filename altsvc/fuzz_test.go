package altsvc_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

// FuzzParse checks, for any input: Parse does not panic; an error is a
// *ParseError with a position inside the input and a known class; a value
// is well formed, formats, is no longer when formatted than the input, and
// parses back to itself (parse → format → parse is stable); and ParseHeader
// agrees with Parse.
func FuzzParse(f *testing.F) {
	for _, tt := range parseTests {
		f.Add(tt.in)
		f.Add(tt.in[:len(tt.in)/2]) // truncated
	}
	for _, tt := range parseErrorTests {
		if len(tt.in) <= 2*altsvc.MaxFieldLength {
			f.Add(tt.in)
		}
	}
	for _, s := range []string{
		`h2=":443"; ma=3600; persist=1, h3="[2001:db8::1]:8443"; ma=60, http%2F1.1="Alt.Example:80"`,
		`h2="\[::ffff:192.0.2.1\]:443"; foo="\"\\"; ma="007"`,
		`clear, clear`,
		"\xff\xfe=\"\x80:1\"",
		strings.Repeat(`h2=":1",`, 600), // too long
		strings.Repeat(`a=":1",`, 17),   // too many
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := altsvc.Parse(s)
		if err != nil {
			checkFuzzError(t, s, v, err)
			return
		}
		if len(s) > altsvc.MaxFieldLength {
			t.Fatalf("Parse accepted %d bytes", len(s))
		}
		checkValue(t, v)

		out, err := altsvc.Format(v)
		if err != nil {
			t.Fatalf("Format(Parse(%q)) = %v", s, err)
		}
		if len(out) > len(s) {
			t.Fatalf("Format output %q longer than input %q", out, s)
		}
		back, err := altsvc.Parse(out)
		if err != nil {
			t.Fatalf("Parse(Format(Parse(%q))) = Parse(%q): %v", s, out, err)
		}
		if !reflect.DeepEqual(back, v) {
			t.Fatalf("round trip of %q via %q:\n got %+v\nwant %+v", s, out, back, v)
		}
		if again, err := altsvc.Format(back); err != nil || again != out {
			t.Fatalf("Format not stable: %q then %q (%v)", out, again, err)
		}

		h, err := altsvc.ParseHeader([]string{s})
		if err != nil || !reflect.DeepEqual(h, v) {
			t.Fatalf("ParseHeader([%q]) = %+v, %v; Parse gave %+v", s, h, err, v)
		}
	})
}

// checkFuzzError checks an error from Parse(s). Its message quotes at most
// 64+16 input bytes, each at most 4 bytes long when escaped.
func checkFuzzError(t *testing.T, s string, v altsvc.Value, err error) {
	t.Helper()
	if !reflect.DeepEqual(v, altsvc.Value{}) {
		t.Fatalf("Parse(%q) returned %+v with error %v", s, v, err)
	}
	var pe *altsvc.ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse(%q) error %v (%T) is not a *ParseError", s, err, err)
	}
	if pe.Input != s || pe.Pos < 0 || pe.Pos > len(s) {
		t.Fatalf("Parse(%q): ParseError input %q pos %d", s, pe.Input, pe.Pos)
	}
	if !errors.Is(err, altsvc.ErrSyntax) && !errors.Is(err, altsvc.ErrTooLong) && !errors.Is(err, altsvc.ErrTooMany) {
		t.Fatalf("Parse(%q) error %v has no known class", s, err)
	}
	if (len(s) > altsvc.MaxFieldLength) != errors.Is(err, altsvc.ErrTooLong) {
		t.Fatalf("Parse of %d bytes: %v", len(s), err)
	}
	if msg := err.Error(); len(msg) > 400+len(pe.Msg) {
		t.Fatalf("error message of %d bytes: %s", len(msg), msg)
	}
}

// checkValue checks the invariants of a Value returned by Parse.
func checkValue(t *testing.T, v altsvc.Value) {
	t.Helper()
	if v.Clear {
		if v.Alternatives != nil {
			t.Fatalf("clear with alternatives: %+v", v)
		}
		return
	}
	if n := len(v.Alternatives); n == 0 || n > altsvc.MaxAlternatives {
		t.Fatalf("%d alternatives", n)
	}
	for _, a := range v.Alternatives {
		switch {
		case len(a.Protocol) < 1 || len(a.Protocol) > 255:
			t.Fatalf("protocol of %d octets: %+v", len(a.Protocol), a)
		case a.Port < 1 || a.Port > 65535:
			t.Fatalf("port out of range: %+v", a)
		case a.MaxAge < 0 || a.MaxAge > (1<<31)*time.Second || a.MaxAge%time.Second != 0:
			t.Fatalf("max age %v: %+v", a.MaxAge, a)
		case strings.ContainsAny(a.Host, " \t\r\n\"\\[]/@%") || strings.ToLower(a.Host) != a.Host:
			t.Fatalf("host %q not canonical", a.Host)
		}
	}
}
