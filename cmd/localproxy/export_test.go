package main

import (
	"net/netip"
	"runtime"
	"sync/atomic"

	"github.com/apifailover/apifailover/localproxy"
)

// Run is run, for tests.
var Run = run

var ApplyGOMAXPROCS = applyGOMAXPROCS

// gomaxprocs stands for the runtime's GOMAXPROCS in the tests: run, inside
// the test process, must not change the process's own.
var gomaxprocs atomic.Int64

func init() {
	gomaxprocs.Store(int64(runtime.GOMAXPROCS(0)))
	setGOMAXPROCS = func(n int) int {
		if n > 0 {
			return int(gomaxprocs.Swap(int64(n)))
		}
		return int(gomaxprocs.Load())
	}
}

// SetGOMAXPROCS sets the tests' stand-in GOMAXPROCS and returns the
// previous one.
func SetGOMAXPROCS(n int) int { return int(gomaxprocs.Swap(int64(n))) }

// Exit codes, for tests.
const (
	ExitOK    = exitOK
	ExitUsage = exitUsage
	ExitError = exitError
)

// ParseConfig parses and validates args and the environment into the
// proxy configuration, as run does.
func ParseConfig(args []string, getenv func(string) string) (localproxy.Config, error) {
	var o options
	fs := newFlagSet(&o, discard{})
	if err := parseFlags(fs, &o, args, getenv); err != nil {
		return localproxy.Config{}, err
	}
	return o.config()
}

// ParseConfigWarnings is ParseConfig, with the warnings run would log.
func ParseConfigWarnings(args []string, getenv func(string) string) (localproxy.Config, []string, error) {
	var o options
	fs := newFlagSet(&o, discard{})
	if err := parseFlags(fs, &o, args, getenv); err != nil {
		return localproxy.Config{}, nil, err
	}
	cfg, err := o.config()
	return cfg, o.warnings, err
}

// SetLookupHost replaces the resolver of bind address host names and
// returns a function restoring it.
func SetLookupHost(f func(string) ([]netip.Addr, error)) (restore func()) {
	old := lookupHost
	lookupHost = f
	return func() { lookupHost = old }
}

// SetServiceAccount points the in-cluster service account files elsewhere
// and returns a function restoring them.
func SetServiceAccount(token, ca string) (restore func()) {
	oldToken, oldCA := serviceAccountToken, serviceAccountCA
	serviceAccountToken, serviceAccountCA = token, ca
	return func() { serviceAccountToken, serviceAccountCA = oldToken, oldCA }
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// The file limit check, for tests.
var (
	FileLimit      = fileLimit
	FileLimitError = fileLimitError
	MaxConnsFor    = maxConnsFor
)

// ReplaceFile is "localproxy kubeconfig --in-place"'s write, with the
// backup named after now.
var ReplaceFile = replaceFile
