//go:build linux

package transport

import (
	"syscall"
	"time"
)

// setUserTimeout sets TCP_USER_TIMEOUT: the kernel aborts the connection
// when sent data stays unacknowledged this long, so a blackholed server is
// noticed even by traffic that has no application-level ping.
func setUserTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if d <= 0 {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// tcpUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h.
const tcpUserTimeout = 0x12
