//go:build linux

// Package rawio reads and writes sockets with system calls that Go's
// scheduler does not see. A system call it sees (every read and write of
// a net.Conn) wakes its monitor thread, sysmon, if every P was idle; and
// while a P stays busy afterwards, as localproxy's event loop keeps one
// between events, that thread polls every 20-90µs: about 50 wakeups of a
// thread for each such call, which made each health PING of an idle node
// agent's proxy cost a millisecond of CPU. A read or write of a
// non-blocking socket cannot block, so it need not be seen.
package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// IO is read(2) or write(2) (trap) of b on the non-blocking descriptor
// fd, as a raw system call, retried on EINTR.
func IO(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, _, errno := unix.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		if errno != unix.EINTR {
			return int(n), errno
		}
	}
}

// Wrap returns c with its Read and Write made of raw system calls (IO),
// waiting in Go's network poller as c's own do, with c's deadlines; the
// rest is c's. A c that is not a *net.TCPConn is returned as it is.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &conn{TCPConn: tc, rc: rc}
}

// conn is a TCP connection read and written with raw system calls.
type conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// NetConn is the connection under c, for those who unwrap (SinceData).
func (c *conn) NetConn() net.Conn { return c.TCPConn }

func (c *conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var (
		n     int
		errno syscall.Errno
	)
	if err := c.rc.Read(func(fd uintptr) bool {
		n, errno = connIO(unix.SYS_READ, fd, b)
		return errno != unix.EAGAIN
	}); err != nil {
		return 0, c.opError("read", err)
	}
	switch {
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *conn) Write(b []byte) (int, error) {
	w := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for w < len(b) {
			var n int
			n, errno = connIO(unix.SYS_WRITE, fd, b[w:])
			switch errno {
			case 0:
				if n == 0 {
					return true // as Go's: io.ErrUnexpectedEOF
				}
				w += n
			case unix.EAGAIN:
				errno = 0
				return false
			default:
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return w, c.opError("write", err)
	case errno != 0:
		return w, c.opError("write", os.NewSyscallError("write", errno))
	case w < len(b):
		return w, c.opError("write", io.ErrUnexpectedEOF)
	}
	return w, nil
}

// opError is err as c's own Read or Write (op) would report it: the
// poller's errors (a deadline, the connection closed) come as "raw-read"
// or "raw-write" *net.OpErrors, the system call's bare.
func (c *conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
