//go:build !linux

package localproxy

import "time"

// evConn: elsewhere than on Linux there is no event loop, and goroutines
// copy.
type evConn struct{}

func (c *conn) toLoop() bool                                            { return false }
func (c *conn) onEvent(int, uint32)                                     {}
func (c *conn) closeLoop(*evConn, bool)                                 {}
func (c *conn) sinceDataLocked(int) (sent, recv time.Duration, ok bool) { return 0, 0, false }
func (c *conn) loopFDs() [2]int                                         { return [2]int{-1, -1} }
