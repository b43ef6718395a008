// Package leakcheck is the TestMain of apifailover's packages: after the
// tests pass it fails the run if a goroutine they started is still running
// or a file descriptor they opened is still open.
package leakcheck

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main runs the tests, then checks for leaked goroutines and (on Linux)
// file descriptors, and exits.
func Main(m *testing.M, opts ...goleak.Option) {
	// The runtime's poller descriptors appear with the first network use;
	// open them before counting.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	before, fdsOK := openFDs()
	code := m.Run()
	if code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running after the tests: %v\n", err)
		os.Exit(1)
	}
	if fdsOK {
		// Descriptors close when their goroutines are gone, or soon
		// after (finalizers); give them a moment.
		var leaked []string
		for deadline := time.Now().Add(5 * time.Second); ; {
			runtime.GC()
			after, _ := openFDs()
			leaked = leaked[:0]
			for fd, target := range after {
				if _, ok := before[fd]; !ok {
					leaked = append(leaked, fd+" -> "+target)
				}
			}
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(leaked) > 0 {
			slices.Sort(leaked)
			fmt.Fprintf(os.Stderr, "leakcheck: %d file descriptors opened by the tests are still open: %v\n", len(leaked), leaked)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// openFDs maps this process's open descriptors to what they point at; ok is
// false where /proc/self/fd is not available.
func openFDs() (map[string]string, bool) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, false
	}
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the descriptor ReadDir itself used
		}
		out[e.Name()] = target
	}
	return out, true
}
