package altsvc

import (
	"strconv"
	"strings"
	"time"
)

// Parse parses one Alt-Svc field value. See the package documentation for
// the grammar and how this package reads it. Errors are [*ParseError]s that
// wrap [ErrSyntax], [ErrTooLong] or [ErrTooMany].
func Parse(s string) (Value, error) {
	lines := [1]string{s}
	return ParseHeader(lines[:])
}

// ParseHeader parses the Alt-Svc field lines of one response, e.g.
// resp.Header.Values("Alt-Svc"), as the single field value they combine to
// (RFC 9110 section 5.3: the lines joined with ", "). A "clear" on any line
// makes the result [Value.Clear]. The limits [MaxFieldLength] and
// [MaxAlternatives] apply to the combined value. Zero lines, or lines with
// only empty list elements, are an [ErrSyntax] error: callers that want to
// tell "no Alt-Svc field" apart check len(lines) first.
//
// The returned Value may share memory with lines.
func ParseHeader(lines []string) (Value, error) {
	var p parser
	total := 0
	for i, line := range lines {
		if i > 0 {
			total += len(", ")
		}
		if total+len(line) > MaxFieldLength {
			return Value{}, &ParseError{
				Input: line,
				Pos:   max(MaxFieldLength-total, 0),
				Msg:   "field value longer than " + strconv.Itoa(MaxFieldLength) + " bytes",
				Err:   ErrTooLong,
			}
		}
		total += len(line)
	}
	for _, line := range lines {
		if err := p.parseLine(line); err != nil {
			return Value{}, err
		}
	}
	if p.clear {
		return Value{Clear: true}, nil
	}
	if len(p.alts) == 0 {
		var last string
		if len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		return Value{}, &ParseError{Input: last, Pos: len(last), Msg: "no alternatives", Err: ErrSyntax}
	}
	return Value{Alternatives: p.alts}, nil
}

// parser holds the state of [ParseHeader] across field lines.
type parser struct {
	in    string        // the field line being parsed
	pos   int           // offset of the next byte of in
	alts  []Alternative // alternatives parsed so far
	clear bool          // whether a "clear" element was seen
}

// parseLine parses one field line: a list of alt-values or "clear", with
// empty elements allowed.
func (p *parser) parseLine(in string) error {
	p.in, p.pos = in, 0
	for {
		p.skipOWS()
		if p.pos == len(p.in) {
			return nil
		}
		if p.in[p.pos] == ',' {
			p.pos++ // empty element
			continue
		}
		if err := p.element(); err != nil {
			return err
		}
		p.skipOWS()
		if p.pos == len(p.in) {
			return nil
		}
		if p.in[p.pos] != ',' {
			return p.syntaxError(p.pos, "expected ',' or ';'")
		}
		p.pos++
	}
}

// element parses one list element: "clear" or an alt-value.
func (p *parser) element() error {
	start := p.pos
	tok := p.token()
	if tok == "" {
		return p.syntaxError(start, "expected protocol-id")
	}
	if p.pos == len(p.in) || p.in[p.pos] != '=' {
		if tok != "clear" {
			return p.syntaxError(p.pos, "expected '=' after protocol-id")
		}
		end := p.pos
		p.skipOWS()
		if p.pos < len(p.in) && p.in[p.pos] == ';' {
			return p.syntaxError(p.pos, "parameters not allowed after clear")
		}
		p.pos = end
		p.clear = true
		return nil
	}
	p.pos++ // '='
	if len(p.alts) == MaxAlternatives {
		return &ParseError{
			Input: p.in,
			Pos:   start,
			Msg:   "more than " + strconv.Itoa(MaxAlternatives) + " alternatives",
			Err:   ErrTooMany,
		}
	}
	proto, off, msg := decodeProtocol(tok)
	if msg != "" {
		return p.syntaxError(start+off, msg)
	}
	if p.pos == len(p.in) || p.in[p.pos] != '"' {
		return p.syntaxError(p.pos, "expected '\"' before alt-authority")
	}
	qstart := p.pos
	auth, escaped, err := p.quoted()
	if err != nil {
		return err
	}
	host, port, off, msg := parseAuthority(auth)
	if msg != "" {
		pos := qstart + 1
		if !escaped {
			pos += off
		}
		return p.syntaxError(pos, msg)
	}
	alt := Alternative{Protocol: proto, Host: host, Port: port, MaxAge: DefaultMaxAge}
	if err := p.parameters(&alt); err != nil {
		return err
	}
	if p.alts == nil {
		p.alts = make([]Alternative, 0, p.capHint())
	}
	p.alts = append(p.alts, alt)
	return nil
}

// parameters parses *( OWS ";" OWS parameter ) into alt.
func (p *parser) parameters(alt *Alternative) error {
	for {
		end := p.pos
		p.skipOWS()
		if p.pos == len(p.in) || p.in[p.pos] != ';' {
			p.pos = end
			return nil
		}
		p.pos++
		p.skipOWS()
		nstart := p.pos
		name := p.token()
		if name == "" {
			return p.syntaxError(nstart, "expected parameter name")
		}
		if p.pos == len(p.in) || p.in[p.pos] != '=' {
			return p.syntaxError(p.pos, "expected '=' after parameter name")
		}
		p.pos++
		vstart := p.pos
		var val string
		if p.pos < len(p.in) && p.in[p.pos] == '"' {
			var err error
			if val, _, err = p.quoted(); err != nil {
				return err
			}
		} else if val = p.token(); val == "" {
			return p.syntaxError(vstart, "expected parameter value")
		}
		switch {
		case strings.EqualFold(name, "ma"):
			ma, ok := parseDeltaSeconds(val)
			if !ok {
				return p.syntaxError(vstart, "ma is not delta-seconds")
			}
			alt.MaxAge = ma
		case strings.EqualFold(name, "persist"):
			// RFC 7838 section 3.1: values other than "1" are ignored.
			alt.Persist = val == "1"
		}
	}
}

// quoted parses the quoted-string at p.pos and returns its unescaped
// content; escaped reports whether it contained a quoted-pair.
func (p *parser) quoted() (s string, escaped bool, err error) {
	start := p.pos
	p.pos++      // '"'
	var b []byte // unescaped content, only when there are quoted-pairs
	seg := p.pos
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			s = p.in[seg:p.pos]
			if b != nil {
				s = string(append(b, s...))
			}
			p.pos++
			return s, b != nil, nil
		case c == '\\':
			if p.pos+1 == len(p.in) {
				return "", false, p.syntaxError(start, "unterminated quoted-string")
			}
			if e := p.in[p.pos+1]; !isQuotedPairChar(e) {
				return "", false, p.syntaxError(p.pos+1, "invalid character in quoted-pair")
			}
			b = append(b, p.in[seg:p.pos]...)
			b = append(b, p.in[p.pos+1])
			p.pos += 2
			seg = p.pos
		case isQDText(c):
			p.pos++
		default:
			return "", false, p.syntaxError(p.pos, "invalid character in quoted-string")
		}
	}
	return "", false, p.syntaxError(start, "unterminated quoted-string")
}

// token scans a token at p.pos and returns it; empty when there is none.
func (p *parser) token() string {
	start := p.pos
	for p.pos < len(p.in) && isTChar(p.in[p.pos]) {
		p.pos++
	}
	return p.in[start:p.pos]
}

// skipOWS skips optional white space (SP and HTAB).
func (p *parser) skipOWS() {
	for p.pos < len(p.in) && (p.in[p.pos] == ' ' || p.in[p.pos] == '\t') {
		p.pos++
	}
}

// capHint guesses how many alternatives remain: one per comma, capped.
func (p *parser) capHint() int {
	return min(strings.Count(p.in[p.pos:], ",")+1, MaxAlternatives)
}

func (p *parser) syntaxError(pos int, msg string) error {
	return &ParseError{Input: p.in, Pos: pos, Msg: msg, Err: ErrSyntax}
}

// decodeProtocol percent-decodes a protocol-id into an ALPN protocol name of
// 1 to 255 octets. Lower-case hex digits are accepted.
func decodeProtocol(tok string) (name string, off int, msg string) {
	if strings.IndexByte(tok, '%') < 0 {
		if len(tok) > maxProtocolLength {
			return "", 0, "protocol-id too long"
		}
		return tok, 0, ""
	}
	b := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); {
		c := tok[i]
		if c != '%' {
			b = append(b, c)
			i++
			continue
		}
		if i+2 >= len(tok) || !isHex(tok[i+1]) || !isHex(tok[i+2]) {
			return "", i, "invalid percent-encoding in protocol-id"
		}
		b = append(b, unhex(tok[i+1])<<4|unhex(tok[i+2]))
		i += 3
	}
	if len(b) > maxProtocolLength {
		return "", 0, "protocol-id too long"
	}
	return string(b), 0, ""
}

// parseDeltaSeconds parses 1*DIGIT seconds, clamping at 2^31.
func parseDeltaSeconds(s string) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n = n*10 + int64(c-'0'); n > int64(maxMaxAge/time.Second) {
			n = int64(maxMaxAge / time.Second)
		}
	}
	return time.Duration(n) * time.Second, true
}

// tchars marks the token characters (RFC 9110 section 5.6.2).
var tchars = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// isTChar reports whether c is a token character.
func isTChar(c byte) bool { return tchars[c] }

// isQDText reports whether c may appear unescaped in a quoted-string.
func isQDText(c byte) bool {
	return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5B) || (c >= 0x5D && c <= 0x7E) || c >= 0x80
}

// isQuotedPairChar reports whether c may follow a backslash in a
// quoted-string.
func isQuotedPairChar(c byte) bool {
	return c == '\t' || (c >= 0x20 && c <= 0x7E) || c >= 0x80
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}
