//go:build !linux

package localproxy

import (
	"net"
	"time"
)

// idleSupported: without TCP_INFO the idle timeout is not enforced.
const idleSupported = false

func idleFor(net.Conn) (time.Duration, bool) { return 0, false }
