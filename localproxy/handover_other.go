//go:build !linux

package localproxy

import (
	"net"
	"syscall"
)

// Elsewhere than on Linux listeners are bound without SO_REUSEPORT and a
// stopping proxy has no successor to hand over to.

func reusePortControl(_, _ string, _ syscall.RawConn) error { return nil }
func clearSteering(net.Listener)                            {}
func steerToNewest(net.Listener, int) error                 { return nil }
func acceptQueued(net.Listener) int                         { return 0 }
func otherListeners(net.Listener) int                       { return 0 }
