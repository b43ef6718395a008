package altsvc_test

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/altsvc"
)

// alt returns an Alternative with the default max age.
func alt(proto, host string, port int) altsvc.Alternative {
	return altsvc.Alternative{Protocol: proto, Host: host, Port: port, MaxAge: altsvc.DefaultMaxAge}
}

// ma returns a with MaxAge set to secs seconds.
func ma(a altsvc.Alternative, secs int64) altsvc.Alternative {
	a.MaxAge = time.Duration(secs) * time.Second
	return a
}

// persist returns a with Persist set.
func persist(a altsvc.Alternative) altsvc.Alternative {
	a.Persist = true
	return a
}

func list(alts ...altsvc.Alternative) altsvc.Value {
	return altsvc.Value{Alternatives: alts}
}

// nAlts returns n alternatives h2=":1" ... h2=":n", joined by ", ", and their
// parsed value.
func nAlts(n int) (string, altsvc.Value) {
	var parts []string
	var v altsvc.Value
	for i := 1; i <= n; i++ {
		parts = append(parts, `h2=":`+strconv.Itoa(i)+`"`)
		v.Alternatives = append(v.Alternatives, alt("h2", "", i))
	}
	return strings.Join(parts, ", "), v
}

// splitAt splits s into two field lines before sep.
func splitAt(s, sep string) []string {
	i := strings.Index(s, sep)
	return []string{s[:i], s[i:]}
}

// maxLengthValue returns a valid field value of exactly MaxFieldLength bytes.
func maxLengthValue() string {
	s := `h2=":443"; x=`
	return s + strings.Repeat("a", altsvc.MaxFieldLength-len(s))
}

var (
	sixteen, sixteenValue = nAlts(altsvc.MaxAlternatives)
	seventeen, _          = nAlts(altsvc.MaxAlternatives + 1)
	label63               = strings.Repeat("a", 63)
	name253               = strings.Repeat(label63+".", 3) + strings.Repeat("b", 61)
)

// parseTests are valid field values; format_test.go round-trips them too.
var parseTests = []struct {
	name string
	in   string
	want altsvc.Value
}{
	// RFC 7838 examples.
	{"rfc/same host", `h2=":8000"`, list(alt("h2", "", 8000))},
	{"rfc/other host", `h2="new.example.org:80"`, list(alt("h2", "new.example.org", 80))},
	{"rfc/ma and persist", `h2=":443"; ma=3600; persist=1`, list(persist(ma(alt("h2", "", 443), 3600)))},
	{"rfc/clear", `clear`, altsvc.Value{Clear: true}},
	{"rfc/two alternatives", `h2="alt.example.com:8000", h2=":443"`,
		list(alt("h2", "alt.example.com", 8000), alt("h2", "", 443))},
	{"rfc/ma 30 days persist", `h2=":443"; ma=2592000; persist=1`, list(persist(ma(alt("h2", "", 443), 2592000)))},
	{"rfc/percent-encoded slash", `http%2F1.1=":80"`, list(alt("http/1.1", "", 80))},
	{"rfc/percent-encoded w=x:y#z", `w%3Dx%3Ay#z="alt.example:443"`, list(alt("w=x:y#z", "alt.example", 443))},

	// protocol-id
	{"protocol/h3", `h3=":443"`, list(alt("h3", "", 443))},
	{"protocol/lower-case hex", `http%2f1.1=":80"`, list(alt("http/1.1", "", 80))},
	{"protocol/needless encoding", `h%32=":443"`, list(alt("h2", "", 443))},
	{"protocol/encoded percent", `a%25b=":443"`, list(alt("a%b", "", 443))},
	{"protocol/encoded non-ASCII", `%FF%00=":443"`, list(alt("\xff\x00", "", 443))},
	{"protocol/all tchars", "!#$&'*+-.^_`|~09azAZ=\":443\"", list(alt("!#$&'*+-.^_`|~09azAZ", "", 443))},
	{"protocol/named clear", `clear=":443"`, list(alt("clear", "", 443))},
	{"protocol/255 octets", strings.Repeat("p", 255) + `=":1"`, list(alt(strings.Repeat("p", 255), "", 1))},

	// alt-authority
	{"host/IPv4", `h2="192.0.2.1:6443"`, list(alt("h2", "192.0.2.1", 6443))},
	{"host/IPv6", `h2="[2001:db8::1]:443"`, list(alt("h2", "2001:db8::1", 443))},
	{"host/IPv6 canonicalised", `h2="[2001:DB8:0:0:0:0:0:1]:443"`, list(alt("h2", "2001:db8::1", 443))},
	{"host/IPv6 loopback", `h2="[::1]:443"`, list(alt("h2", "::1", 443))},
	{"host/IPv4-mapped IPv6", `h2="[::ffff:192.0.2.1]:443"`, list(alt("h2", "::ffff:192.0.2.1", 443))},
	{"host/IPv4-mapped IPv6 in hex", `h2="[::ffff:c000:201]:443"`, list(alt("h2", "::ffff:192.0.2.1", 443))},
	{"host/IPv6 single zero group compressed", `h2="[1:0:1:0:1:1::1]:443"`, list(alt("h2", "1:0:1:0:1:1:0:1", 443))},
	{"host/upper case name", `h2="Alt.Example.COM:443"`, list(alt("h2", "alt.example.com", 443))},
	{"host/single label", `h2="apiserver:6443"`, list(alt("h2", "apiserver", 6443))},
	{"host/digits and hyphens", `h2="10-0-0-1.k8s-api.example:443"`, list(alt("h2", "10-0-0-1.k8s-api.example", 443))},
	{"host/numeric label not last", `h2="1.example:443"`, list(alt("h2", "1.example", 443))},
	{"host/63-byte label", `h2="` + label63 + `.example:443"`, list(alt("h2", label63+".example", 443))},
	{"host/253-byte name", `h2="` + name253 + `:443"`, list(alt("h2", name253, 443))},
	{"port/1", `h2=":1"`, list(alt("h2", "", 1))},
	{"port/65535", `h2=":65535"`, list(alt("h2", "", 65535))},
	{"port/leading zeros", `h2=":00443"`, list(alt("h2", "", 443))},

	// quoted-string
	{"quoted/escaped letters", `h2="\a\l\t.example:4\43"`, list(alt("h2", "alt.example", 443))},
	{"quoted/escaped colon", `h2="alt.example\:443"`, list(alt("h2", "alt.example", 443))},
	{"quoted/escaped IPv6", `h2="\[::1\]:443"`, list(alt("h2", "::1", 443))},

	// parameters
	{"ma/zero", `h2=":443"; ma=0`, list(ma(alt("h2", "", 443), 0))},
	{"ma/leading zeros", `h2=":443"; ma=0060`, list(ma(alt("h2", "", 443), 60))},
	{"ma/quoted", `h2=":443"; ma="60"`, list(ma(alt("h2", "", 443), 60))},
	{"ma/upper-case name", `h2=":443"; MA=60`, list(ma(alt("h2", "", 443), 60))},
	{"ma/clamped at 2^31", `h2=":443"; ma=99999999999999999999999`, list(ma(alt("h2", "", 443), 1<<31))},
	{"ma/exactly 2^31", `h2=":443"; ma=2147483648`, list(ma(alt("h2", "", 443), 1<<31))},
	{"ma/default explicit", `h2=":443"; ma=86400`, list(alt("h2", "", 443))},
	{"ma/last wins", `h2=":443"; ma=10; ma=20`, list(ma(alt("h2", "", 443), 20))},
	{"persist/quoted", `h2=":443"; persist="1"`, list(persist(alt("h2", "", 443)))},
	{"persist/zero ignored", `h2=":443"; persist=0`, list(alt("h2", "", 443))},
	{"persist/other ignored", `h2=":443"; persist=yes`, list(alt("h2", "", 443))},
	{"persist/last wins", `h2=":443"; persist=1; persist=2`, list(alt("h2", "", 443))},
	{"param/unknown token", `h2=":443"; foo=bar`, list(alt("h2", "", 443))},
	{"param/unknown quoted", `h2=":443"; foo="b a;r, \"q\""; ma=5`, list(ma(alt("h2", "", 443), 5))},
	{"param/unknown empty quoted", `h2=":443"; v=""`, list(alt("h2", "", 443))},
	{"param/no white space", `h2=":443";ma=5;persist=1`, list(persist(ma(alt("h2", "", 443), 5)))},

	// white space and list syntax
	{"ows/around everything", "  h2=\":443\" ;\tma=5 \t,\th3=\":443\"  ", list(ma(alt("h2", "", 443), 5), alt("h3", "", 443))},
	{"ows/no space after comma", `h2=":1",h3=":2"`, list(alt("h2", "", 1), alt("h3", "", 2))},
	{"list/leading comma", `, h2=":443"`, list(alt("h2", "", 443))},
	{"list/trailing comma", `h2=":443",`, list(alt("h2", "", 443))},
	{"list/empty elements", `,, h2=":1" , ,, h3=":2" ,,`, list(alt("h2", "", 1), alt("h3", "", 2))},
	{"list/duplicates kept", `h2=":1", h2=":1"`, list(alt("h2", "", 1), alt("h2", "", 1))},
	{"list/16 alternatives", sixteen, sixteenValue},
	{"list/max length", maxLengthValue(), list(alt("h2", "", 443))},

	// clear
	{"clear/with white space", " \tclear ", altsvc.Value{Clear: true}},
	{"clear/in list with empty elements", `, clear ,`, altsvc.Value{Clear: true}},
	{"clear/after alternatives", `h2=":443", clear`, altsvc.Value{Clear: true}},
	{"clear/before alternatives", `clear, h2=":443"`, altsvc.Value{Clear: true}},
}

func TestParse(t *testing.T) {
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := altsvc.Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

// parseErrorTests are invalid field values with the error class and position.
var parseErrorTests = []struct {
	name string
	in   string
	err  error
	pos  int
	msg  string // substring of ParseError.Msg
}{
	// list level
	{"empty", "", altsvc.ErrSyntax, 0, "no alternatives"},
	{"only white space", " \t ", altsvc.ErrSyntax, 3, "no alternatives"},
	{"only commas", " , ,", altsvc.ErrSyntax, 4, "no alternatives"},
	{"missing comma", `h2=":1" h3=":2"`, altsvc.ErrSyntax, 8, "expected ','"},
	{"semicolon as separator", `h2=":1"; h3`, altsvc.ErrSyntax, 11, "expected '='"},
	{"control char after value", "h2=\":1\"\x00", altsvc.ErrSyntax, 7, "expected ','"},
	{"CR LF in value", "h2=\":1\"\r\n, h3=\":2\"", altsvc.ErrSyntax, 7, "expected ','"},

	// clear
	{"clear/upper case", "CLEAR", altsvc.ErrSyntax, 5, "expected '='"},
	{"clear/with parameter", "clear; ma=1", altsvc.ErrSyntax, 5, "parameters not allowed"},
	{"clear/with trailing junk", "clear x", altsvc.ErrSyntax, 6, "expected ','"},

	// protocol-id
	{"protocol/missing", `=":443"`, altsvc.ErrSyntax, 0, "expected protocol-id"},
	{"protocol/no equals", `h2`, altsvc.ErrSyntax, 2, "expected '='"},
	{"protocol/space before equals", `h2 =":443"`, altsvc.ErrSyntax, 2, "expected '='"},
	{"protocol/non-token char", `h/2=":443"`, altsvc.ErrSyntax, 1, "expected '='"},
	{"protocol/non-ASCII", "h\xc3\xa42=\":443\"", altsvc.ErrSyntax, 1, "expected '='"},
	{"protocol/short percent", `h%2=":443"`, altsvc.ErrSyntax, 1, "percent-encoding"},
	{"protocol/percent at end", `h2%=":443"`, altsvc.ErrSyntax, 2, "percent-encoding"},
	{"protocol/bad hex", `h%ZZ=":443"`, altsvc.ErrSyntax, 1, "percent-encoding"},
	{"protocol/256 octets", strings.Repeat("p", 256) + `=":1"`, altsvc.ErrSyntax, 0, "protocol-id too long"},
	{"protocol/256 decoded octets", strings.Repeat("%41", 256) + `=":1"`, altsvc.ErrSyntax, 0, "protocol-id too long"},

	// alt-authority syntax
	{"authority/unquoted", `h2=:443`, altsvc.ErrSyntax, 3, "expected '\"'"},
	{"authority/space after equals", `h2= ":443"`, altsvc.ErrSyntax, 3, "expected '\"'"},
	{"authority/missing", `h2=`, altsvc.ErrSyntax, 3, "expected '\"'"},
	{"authority/unterminated", `h2=":443`, altsvc.ErrSyntax, 3, "unterminated"},
	{"authority/unterminated escape", `h2=":443\`, altsvc.ErrSyntax, 3, "unterminated"},
	{"authority/control char", "h2=\"\x01:443\"", altsvc.ErrSyntax, 4, "invalid character in quoted-string"},
	{"authority/DEL", "h2=\"\x7f:443\"", altsvc.ErrSyntax, 4, "invalid character in quoted-string"},
	{"authority/escaped control char", "h2=\"\\\x01:443\"", altsvc.ErrSyntax, 5, "quoted-pair"},
	{"authority/empty", `h2=""`, altsvc.ErrSyntax, 4, "empty alt-authority"},
	{"authority/no port", `h2="example.org"`, altsvc.ErrSyntax, 15, "missing ':'"},

	// host
	{"host/space", `h2="a b:443"`, altsvc.ErrSyntax, 5, "invalid character in host"},
	{"host/tab", "h2=\"a\tb:443\"", altsvc.ErrSyntax, 5, "invalid character in host"},
	{"host/non-ASCII", "h2=\"ex\xc3\xa4mple:443\"", altsvc.ErrSyntax, 6, "invalid character in host"},
	{"host/underscore", `h2="a_b:443"`, altsvc.ErrSyntax, 5, "invalid character in host"},
	{"host/percent-encoded", `h2="ex%41mple:443"`, altsvc.ErrSyntax, 6, "invalid character in host"},
	{"host/userinfo", `h2="user@host:443"`, altsvc.ErrSyntax, 8, "invalid character in host"},
	{"host/leading hyphen", `h2="-a.example:443"`, altsvc.ErrSyntax, 4, "starts with '-'"},
	{"host/trailing hyphen", `h2="a-.example:443"`, altsvc.ErrSyntax, 5, "ends with '-'"},
	{"host/trailing hyphen last label", `h2="example-:443"`, altsvc.ErrSyntax, 11, "ends with '-'"},
	{"host/empty label", `h2="a..example:443"`, altsvc.ErrSyntax, 6, "empty label"},
	{"host/leading dot", `h2=".example:443"`, altsvc.ErrSyntax, 4, "empty label"},
	{"host/trailing dot", `h2="example.:443"`, altsvc.ErrSyntax, 12, "ends with '.'"},
	{"host/64-byte label", `h2="` + label63 + `a.example:443"`, altsvc.ErrSyntax, 4 + 63, "label too long"},
	{"host/254-byte name", `h2="a` + name253 + `:443"`, altsvc.ErrSyntax, 4 + 253, "host name too long"},
	{"host/IPv4 octet > 255", `h2="192.0.2.256:443"`, altsvc.ErrSyntax, 12, "invalid IPv4"},
	{"host/IPv4 leading zero", `h2="192.0.2.01:443"`, altsvc.ErrSyntax, 12, "invalid IPv4"},
	{"host/IPv4 three octets", `h2="192.0.2:443"`, altsvc.ErrSyntax, 10, "invalid IPv4"},
	{"host/all digits", `h2="1234:443"`, altsvc.ErrSyntax, 4, "invalid IPv4"},
	{"host/IPv6 without brackets", `h2="::1:443"`, altsvc.ErrSyntax, 4, "must be in brackets"},
	{"host/IPv6 missing bracket", `h2="[::1:443"`, altsvc.ErrSyntax, 4, "missing ']'"},
	{"host/IPv6 no colon after bracket", `h2="[::1]443"`, altsvc.ErrSyntax, 9, "expected ':'"},
	{"host/IPv6 no port", `h2="[::1]"`, altsvc.ErrSyntax, 9, "expected ':'"},
	{"host/IPv6 invalid", `h2="[2001:db8::zz]:443"`, altsvc.ErrSyntax, 5, "invalid IPv6"},
	{"host/IPv6 empty", `h2="[]:443"`, altsvc.ErrSyntax, 5, "invalid IPv6"},
	{"host/IPv4 in brackets", `h2="[192.0.2.1]:443"`, altsvc.ErrSyntax, 5, "not IPv6"},
	{"host/IPv6 zone", `h2="[fe80::1%25eth0]:443"`, altsvc.ErrSyntax, 5, "zone"},

	// port
	{"port/empty", `h2="example.org:"`, altsvc.ErrSyntax, 16, "missing port"},
	{"port/zero", `h2=":0"`, altsvc.ErrSyntax, 5, "port out of range"},
	{"port/65536", `h2=":65536"`, altsvc.ErrSyntax, 5, "port out of range"},
	{"port/huge", `h2=":99999999999999999999999"`, altsvc.ErrSyntax, 5, "port out of range"},
	{"port/negative", `h2=":-1"`, altsvc.ErrSyntax, 5, "invalid character in port"},
	{"port/letters", `h2=":44a"`, altsvc.ErrSyntax, 7, "invalid character in port"},
	{"port/space", `h2=": 443"`, altsvc.ErrSyntax, 5, "invalid character in port"},
	{"port/second colon", `h2="a:b:443"`, altsvc.ErrSyntax, 5, "must be in brackets"},

	// parameters
	{"param/trailing semicolon", `h2=":443";`, altsvc.ErrSyntax, 10, "expected parameter name"},
	{"param/empty", `h2=":443"; ; ma=5`, altsvc.ErrSyntax, 11, "expected parameter name"},
	{"param/no value", `h2=":443"; ma`, altsvc.ErrSyntax, 13, "expected '='"},
	{"param/space before equals", `h2=":443"; ma =5`, altsvc.ErrSyntax, 13, "expected '='"},
	{"param/empty value", `h2=":443"; ma=`, altsvc.ErrSyntax, 14, "expected parameter value"},
	{"param/space after equals", `h2=":443"; ma= 5`, altsvc.ErrSyntax, 14, "expected parameter value"},
	{"param/unterminated quoted value", `h2=":443"; foo="bar`, altsvc.ErrSyntax, 15, "unterminated"},
	{"ma/negative", `h2=":443"; ma=-1`, altsvc.ErrSyntax, 14, "delta-seconds"},
	{"ma/fraction", `h2=":443"; ma=1.5`, altsvc.ErrSyntax, 14, "delta-seconds"},
	{"ma/empty quoted", `h2=":443"; ma=""`, altsvc.ErrSyntax, 14, "delta-seconds"},
	{"ma/quoted with space", `h2=":443"; ma=" 5"`, altsvc.ErrSyntax, 14, "delta-seconds"},

	// limits
	{"limit/too long", maxLengthValue() + "a", altsvc.ErrTooLong, altsvc.MaxFieldLength, "longer than 4096"},
	{"limit/way too long", strings.Repeat(",", 1<<20), altsvc.ErrTooLong, altsvc.MaxFieldLength, "longer than 4096"},
	{"limit/too many", seventeen, altsvc.ErrTooMany, len(sixteen) + 2, "more than 16"},
	{"limit/too many with clear", "clear, " + seventeen, altsvc.ErrTooMany, 7 + len(sixteen) + 2, "more than 16"},
	{"limit/error after clear", `clear, h2=":0"`, altsvc.ErrSyntax, 12, "port out of range"},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := altsvc.Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want error", tt.in, v)
			}
			if !reflect.DeepEqual(v, altsvc.Value{}) {
				t.Errorf("Parse(%q) returned %+v with the error, want zero Value", tt.in, v)
			}
			checkParseError(t, err, tt.in, tt.err, tt.pos, tt.msg)
		})
	}
}

// checkParseError checks that err is a *ParseError for input in, at pos, of
// class want, whose Msg contains msg.
func checkParseError(t *testing.T, err error, in string, want error, pos int, msg string) {
	t.Helper()
	var pe *altsvc.ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *ParseError", err, err)
	}
	if !errors.Is(err, want) {
		t.Errorf("error %v is not %v", err, want)
	}
	if pe.Input != in {
		t.Errorf("ParseError.Input = %.40q, want %.40q", pe.Input, in)
	}
	if pe.Pos != pos {
		t.Errorf("ParseError.Pos = %d, want %d (%v)", pe.Pos, pos, err)
	}
	if !strings.Contains(pe.Msg, msg) {
		t.Errorf("ParseError.Msg = %q, want it to contain %q", pe.Msg, msg)
	}
}

func TestParseErrorMessage(t *testing.T) {
	tests := []struct {
		name string
		err  altsvc.ParseError
		want string
	}{
		{"short", altsvc.ParseError{Input: `h2=:443`, Pos: 3, Msg: "expected '\"' before alt-authority"},
			`altsvc: parsing "h2=:443": expected '"' before alt-authority at offset 3 (at ":443")`},
		{"at end", altsvc.ParseError{Input: `h2`, Pos: 2, Msg: "expected '=' after protocol-id"},
			`altsvc: parsing "h2": expected '=' after protocol-id at offset 2`},
		{"long input and rest truncated", altsvc.ParseError{Input: strings.Repeat("a", 100), Pos: 50, Msg: "m"},
			`altsvc: parsing "` + strings.Repeat("a", 64) + `"...: m at offset 50 (at "` + strings.Repeat("a", 16) + `"...)`},
		{"control chars quoted", altsvc.ParseError{Input: "h2=\"\x01\"", Pos: 4, Msg: "m"},
			`altsvc: parsing "h2=\"\x01\"": m at offset 4 (at "\x01\"")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error()\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestParseHeader(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  altsvc.Value
	}{
		{"one line", []string{`h2=":443"`}, list(alt("h2", "", 443))},
		{"two lines in order", []string{`h2="a.example:443", h2=":1"`, `h3=":2"`},
			list(alt("h2", "a.example", 443), alt("h2", "", 1), alt("h3", "", 2))},
		{"empty lines skipped", []string{"", `h2=":443"`, " , "}, list(alt("h2", "", 443))},
		{"clear on a later line", []string{`h2=":443"`, "clear"}, altsvc.Value{Clear: true}},
		{"clear on an earlier line", []string{"clear", `h2=":443"`}, altsvc.Value{Clear: true}},
		{"16 alternatives over two lines", splitAt(sixteen, `, h2=":9"`), sixteenValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := altsvc.ParseHeader(tt.lines)
			if err != nil {
				t.Fatalf("ParseHeader(%q): %v", tt.lines, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseHeader(%q)\n got %+v\nwant %+v", tt.lines, got, tt.want)
			}
		})
	}
}

func TestParseHeaderErrors(t *testing.T) {
	half := strings.Repeat(" ", altsvc.MaxFieldLength/2)
	nine, _ := nAlts(9)
	tests := []struct {
		name  string
		lines []string
		input string // ParseError.Input
		err   error
		pos   int
	}{
		{"no lines", nil, "", altsvc.ErrSyntax, 0},
		{"only empty lines", []string{"", " ,"}, " ,", altsvc.ErrSyntax, 2},
		{"error on second line", []string{`h2=":443"`, `h3=":0"`}, `h3=":0"`, altsvc.ErrSyntax, 5},
		// Two halves of 2048 bytes make 4098 with the ", " between them.
		{"combined too long", []string{half, half}, half, altsvc.ErrTooLong, altsvc.MaxFieldLength/2 - 2},
		{"many empty lines too long", make([]string, altsvc.MaxFieldLength), "", altsvc.ErrTooLong, 0},
		{"combined too many", []string{nine, nine}, nine, altsvc.ErrTooMany, strings.Index(nine, `h2=":8"`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := altsvc.ParseHeader(tt.lines)
			if err == nil {
				t.Fatalf("ParseHeader = %+v, want error", v)
			}
			checkParseError(t, err, tt.input, tt.err, tt.pos, "")
		})
	}
}

// TestParseTruncated parses every prefix of some valid values:
// truncated input must give an error or a value, never a panic.
func TestParseTruncated(t *testing.T) {
	for _, tt := range parseTests {
		for i := range len(tt.in) {
			v, err := altsvc.Parse(tt.in[:i])
			var pe *altsvc.ParseError
			if err != nil && (!errors.As(err, &pe) || pe.Pos < 0 || pe.Pos > len(pe.Input)) {
				t.Errorf("Parse(%q): bad error %#v", tt.in[:i], err)
			}
			if err == nil && !v.Clear && len(v.Alternatives) == 0 {
				t.Errorf("Parse(%q) = empty value without error", tt.in[:i])
			}
		}
	}
}
