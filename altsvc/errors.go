package altsvc

import (
	"errors"
	"strconv"
)

// Sentinel errors wrapped by [*ParseError] (and by [Format] errors), for
// callers that branch with errors.Is.
var (
	// ErrSyntax reports a field value that does not follow the grammar or
	// names an invalid host, port or protocol.
	ErrSyntax = errors.New("altsvc: malformed field value")
	// ErrTooLong reports a field value longer than [MaxFieldLength] bytes.
	ErrTooLong = errors.New("altsvc: field value too long")
	// ErrTooMany reports more than [MaxAlternatives] alternatives.
	ErrTooMany = errors.New("altsvc: too many alternatives")
)

const (
	// errInputMax is how much of the input an error message quotes.
	errInputMax = 64
	// errNearMax is how much of the text at the error position it quotes.
	errNearMax = 16
)

// ParseError describes why an Alt-Svc field value was rejected.
type ParseError struct {
	// Input is the field line that was rejected.
	Input string
	// Pos is the byte offset in Input at which the problem was found,
	// 0 to len(Input).
	Pos int
	// Msg explains the problem.
	Msg string
	// Err is the sentinel for the class of problem: [ErrSyntax],
	// [ErrTooLong] or [ErrTooMany].
	Err error
}

// Error returns a message naming the input (shortened when long), the
// problem and its position, e.g.
//
//	altsvc: parsing "h2=:443": expected '"' at offset 3 (at ":443")
func (e *ParseError) Error() string {
	b := make([]byte, 0, 64+len(e.Msg))
	b = append(b, "altsvc: parsing "...)
	b = appendQuoteShort(b, e.Input, errInputMax)
	b = append(b, ": "...)
	b = append(b, e.Msg...)
	b = append(b, " at offset "...)
	b = strconv.AppendInt(b, int64(e.Pos), 10)
	if e.Pos >= 0 && e.Pos < len(e.Input) {
		b = append(b, " (at "...)
		b = appendQuoteShort(b, e.Input[e.Pos:], errNearMax)
		b = append(b, ')')
	}
	return string(b)
}

// Unwrap returns e.Err, so that errors.Is(err, ErrTooLong) and the like work.
func (e *ParseError) Unwrap() error { return e.Err }

// appendQuoteShort appends s as a Go string literal, cut to at most limit bytes
// of s and marked with "..." when cut.
func appendQuoteShort(b []byte, s string, limit int) []byte {
	if len(s) <= limit {
		return strconv.AppendQuote(b, s)
	}
	b = strconv.AppendQuote(b, s[:limit])
	return append(b, "..."...)
}
