package endpoint_test

import (
	"testing"

	"github.com/apifailover/apifailover/internal/leakcheck"
)

// TestMain fails the package's tests if a goroutine they started is still
// running, or a descriptor they opened still open, once they are done.
func TestMain(m *testing.M) { leakcheck.Main(m) }
