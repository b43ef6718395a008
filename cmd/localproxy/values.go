package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	flag "github.com/spf13/pflag"
)

// printUsage prints the usage as pflag does.
func printUsage(fs *flag.FlagSet) {
	if fs.Usage != nil {
		fs.Usage()
		return
	}
	fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
	fs.PrintDefaults()
}

// checkedValue wraps a flag.Value while parsing: a value that does not
// parse as the flag's kind becomes a valueError saying what the kind
// allows, the one place these messages come from.
type checkedValue struct {
	flag.Value
	name string
}

func (v *checkedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err == nil {
		return nil
	}
	return &valueError{name: v.name, value: s, problem: problem(v.Value, s, err), want: allowed(v.Value, v.name)}
}

// valueError is a flag or environment value that does not parse.
type valueError struct {
	name, value   string
	problem, want string // want is empty for a kind not known here
}

func (e *valueError) Error() string {
	if e.want == "" {
		return e.problem
	}
	return e.problem + "; want " + e.want
}

// usage is the error as given by src, "--flag" or the variable's name.
func (e *valueError) usage(src string) error {
	return usagef("invalid %s: %v", input(src, e.name, e.value), e)
}

// problem says why s is no value of v's kind; err is v.Set's error.
func problem(v flag.Value, s string, err error) string {
	switch v.Type() {
	case "duration":
		return "not a duration"
	case "bool":
		return "not a boolean"
	case "float64":
		return "not a number"
	case "int", "int64":
		if _, err := strconv.ParseInt(s, 0, 64); errors.Is(err, strconv.ErrRange) {
			return "out of range"
		}
		return "not a whole number"
	}
	return err.Error()
}

// allowed says what values flag name of v's kind takes, "" for a kind not
// known here. For ints, config checks the same range.
func allowed(v flag.Value, name string) string {
	switch v.Type() {
	case "duration":
		return "a Go duration with a unit, such as 1s, 500ms or 2m"
	case "bool":
		return "true or false"
	case "float64":
		return "a number, such as 2 or 0.5"
	case "int", "int64":
		if r, ok := intRanges[name]; ok {
			return r.String()
		}
		return "a whole number"
	}
	return ""
}

// intRanges are the values the int flags allow.
var intRanges = map[string]intRange{
	"bind-port":       portRange,
	"health-port":     portRange,
	"rise":            {min: 1},
	"fall":            {min: 1},
	"max-connections": {min: 1},
	"gomaxprocs":      {0, maxGOMAXPROCS},
}

// intRange is min to max, or at least min if max is 0.
type intRange struct{ min, max int }

var portRange = intRange{1, 65535}

func (r intRange) contains(n int) bool { return n >= r.min && (r.max == 0 || n <= r.max) }

func (r intRange) String() string {
	switch {
	case r == portRange:
		return "a port number 1-65535"
	case r.max == 0:
		return fmt.Sprintf("a whole number, at least %d", r.min)
	}
	return fmt.Sprintf("a whole number %d-%d", r.min, r.max)
}

// oneOf lists the words a string flag allows: "a, b or c".
func oneOf(words ...string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
