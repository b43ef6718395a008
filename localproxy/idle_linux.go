//go:build linux

package localproxy

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// idleSupported: the kernel tells how long a socket carried no data.
const idleSupported = true

// idleFor returns how long the socket has neither sent nor received data,
// from TCP_INFO; ok is false when that cannot be read.
func idleFor(nc net.Conn) (d time.Duration, ok bool) {
	tc, isTCP := nc.(*net.TCPConn)
	if !isTCP {
		return 0, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	ms := min(info.Last_data_recv, info.Last_data_sent)
	return time.Duration(ms) * time.Millisecond, true
}
