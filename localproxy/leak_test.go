package localproxy_test

import (
	"runtime"
	"testing"

	"github.com/apifailover/apifailover/internal/leakcheck"
)

// TestMain fails the package's tests if a goroutine they started is still
// running, or a descriptor they opened still open, once they are done. On
// a machine with one CPU it runs them with two Ps, as the proxy runs
// anywhere by default (--gomaxprocs=2): with one, its loop waits through
// Go's network poller and leaves accepting and dialing to Go, a mode
// TestLoopWithOneP and go test -cpu 1 test (tests of the loop's own
// sockets skip then: needLoopSockets).
func TestMain(m *testing.M) {
	if runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
	leakcheck.Main(m)
}
