package localproxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// awaitData waits until src has bytes to read, has ended or has failed,
// without reading and without holding a splice pipe, and returns how much
// the next copy should take: the bytes queued on the socket (SIOCINQ, at
// most copyChunk), or 1 when src has ended or failed, so that the copy
// finds out which. For a connection it cannot ask (not a socket), copyChunk.
// The error is that of the wait itself: src closed, or its deadline
// passed.
func awaitData(src net.Conn) (int64, error) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return copyChunk, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return copyChunk, nil
	}
	queued := 0
	err = rc.Read(func(fd uintptr) bool {
		q, qerr := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		switch {
		case qerr != nil:
			return true // the copy finds out what is wrong
		case q > 0:
			queued = q
			return true
		}
		// Nothing queued: ended or failed (the copy finds out which),
		// or nothing yet, which waits until readable. An end counts no
		// bytes in SIOCINQ, so ask the socket.
		var b [1]byte
		_, _, perr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return perr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	return min(max(int64(queued), 1), copyChunk), nil
}
