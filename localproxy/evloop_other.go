//go:build !linux

package localproxy

import (
	"net"
	"syscall"
)

// evConn: elsewhere than on Linux there is no event loop, and goroutines
// copy. Never set: its upID is what finish reads on Linux.
type evConn struct{ upID uint64 }

func (c *conn) toLoop() bool            { return false }
func (c *conn) onEvent(int, uint32)     {}
func (c *conn) closeLoop(*evConn, bool) {}
func (c *conn) loopFDs() [2]int         { return [2]int{-1, -1} }

// loopDial and loopListener: no dial or accept on a loop here.
type (
	loopDial     struct{}
	loopListener struct{}
)

func (p *Proxy) acceptOnLoop(ln net.Listener) (net.Listener, bool) { return ln, false }
func (p *Proxy) unloopListeners()                                  {}
func (c *conn) closeDial(*loopDial)                                {}

// setNoDelay: the listener's sockets are accepted by Go, which sets
// TCP_NODELAY on each.
func setNoDelay(syscall.RawConn) error { return nil }
