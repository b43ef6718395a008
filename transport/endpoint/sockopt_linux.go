//go:build linux

package endpoint

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT: the kernel aborts the connection
// when sent data stays unacknowledged this long, so a blackholed peer is
// noticed even by traffic that has no application-level ping. d <= 0
// leaves the system default.
func setUserTimeout(c syscall.RawConn, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}

// SinceData returns how long ago the TCP connection under nc (unwrapped
// through NetConn methods, as *tls.Conn and TrackedConn have) last sent
// and last received data, from the kernel's TCP_INFO (millisecond
// resolution; ACKs and keepalives are not data). ok is false when nc is
// not over TCP or the kernel does not tell.
func SinceData(nc net.Conn) (sent, recv time.Duration, ok bool) {
	tc := tcpUnder(nc)
	if tc == nil {
		return 0, 0, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	if err := rc.Control(func(fd uintptr) { sent, recv, ok = SinceDataFD(int(fd)) }); err != nil {
		return 0, 0, false
	}
	return sent, recv, ok
}

// SinceDataFD is SinceData of the TCP socket fd.
func SinceDataFD(fd int) (sent, recv time.Duration, ok bool) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, false
	}
	return time.Duration(info.Last_data_sent) * time.Millisecond, time.Duration(info.Last_data_recv) * time.Millisecond, true
}
