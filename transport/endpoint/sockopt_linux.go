//go:build linux

package endpoint

import (
	"fmt"
	"net"
	"syscall"
	"time"
	"unsafe"

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
	if err := c.Control(func(fd uintptr) { serr = setUserTimeoutFD(int(fd), d) }); err != nil {
		return err
	}
	return serr
}

// setUserTimeoutFD is setUserTimeout of the socket fd.
func setUserTimeoutFD(fd int, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
}

// SinceData returns how long ago the TCP connection under nc (unwrapped
// through NetConn methods, as *tls.Conn and TrackedConn have) last sent
// and last received data, from the kernel's TCP_INFO (millisecond
// resolution; ACKs and keepalives are not data). ok is false when nc is
// not over TCP or the kernel does not tell.
func SinceData(nc net.Conn) (sent, recv time.Duration, ok bool) {
	onFD(nc, func(fd int) { sent, recv, ok = SinceDataFD(fd) })
	return sent, recv, ok
}

// SinceHeard returns how long ago the TCP connection under nc (as
// SinceData) last received data; ok is false if it never received any,
// or cannot tell: the kernel's clock of received data starts at the
// handshake, which a stopped process's kernel still completes.
func SinceHeard(nc net.Conn) (recv time.Duration, ok bool) {
	onFD(nc, func(fd int) { recv, ok = SinceHeardFD(fd) })
	return recv, ok
}

// onFD calls f with the descriptor of the TCP connection under nc, if
// any.
func onFD(nc net.Conn, f func(fd int)) {
	tc := tcpUnder(nc)
	if tc == nil {
		return
	}
	if rc, err := tc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { f(int(fd)) })
	}
}

// SinceDataFD is SinceData of the TCP socket fd.
func SinceDataFD(fd int) (sent, recv time.Duration, ok bool) {
	info, ok := tcpInfo(fd)
	if !ok {
		return 0, 0, false
	}
	return time.Duration(info.Last_data_sent) * time.Millisecond, time.Duration(info.Last_data_recv) * time.Millisecond, true
}

// SinceHeardFD is SinceHeard of the TCP socket fd.
func SinceHeardFD(fd int) (recv time.Duration, ok bool) {
	info, ok := tcpInfo(fd)
	if !ok || info.Bytes_received == 0 {
		return 0, false
	}
	return time.Duration(info.Last_data_recv) * time.Millisecond, true
}

// tcpInfo reads the TCP socket fd's TCP_INFO. A raw call: it cannot
// block, and the scheduler does not see it. A system call the runtime
// sees wakes its monitor thread (sysmon) if every P was idle, and while
// the proxy's event loop then holds its P that thread polls every
// 20-90µs: the PING schedule asks this of every connection, at every
// request.
func tcpInfo(fd int) (unix.TCPInfo, bool) {
	var info unix.TCPInfo
	size := uint32(unix.SizeofTCPInfo)
	_, _, errno := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	return info, errno == 0
}

// TuneTCPListener sets on a TCP socket about to listen what TuneTCP sets
// on a connection (keepalive with keepAlive's idle time and interval and 3
// probes, or off; TCP_USER_TIMEOUT if userTimeout > 0, which makes the
// probes' count moot, and then it is not set), for
// net.ListenConfig.Control: Linux copies them into every socket accepted
// from it, which then needs no system call of its own (five per
// connection). Set later, on a listening socket, they would miss the
// connections already in its accept queue. That holds only where Go's
// accept leaves keepalive alone (net.ListenConfig.KeepAlive < 0).
func TuneTCPListener(rc syscall.RawConn, keepAlive, userTimeout time.Duration) error {
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = TuneTCPFD(int(fd), keepAlive, userTimeout) }); err != nil {
		return err
	}
	return serr
}

// TuneTCPFD sets what TuneTCPListener sets on the TCP socket fd, for a
// socket the caller made or accepted itself (a connection as well as a
// listener).
func TuneTCPFD(fd int, keepAlive, userTimeout time.Duration) error {
	var serr error
	set := func(level, opt, v int, name string) {
		if serr == nil {
			if err := unix.SetsockoptInt(fd, level, opt, v); err != nil {
				serr = fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	if keepAlive > 0 {
		// Whole seconds, rounded up as Go's SetKeepAliveConfig does.
		secs := int((keepAlive + time.Second - 1) / time.Second)
		set(unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE")
		set(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs, "TCP_KEEPIDLE")
		set(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs, "TCP_KEEPINTVL")
		if userTimeout <= 0 {
			// With TCP_USER_TIMEOUT set, that decides when unanswered
			// probes end the connection; the kernel does not read the
			// count then (tcp_keepalive_timer): a system call less per
			// connection.
			set(unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveProbes, "TCP_KEEPCNT")
		}
	} else {
		set(unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0, "SO_KEEPALIVE")
	}
	if serr != nil {
		return serr
	}
	if err := setUserTimeoutFD(fd, userTimeout); err != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}
