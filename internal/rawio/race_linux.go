//go:build linux && race

package rawio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// connIO is IO for a Conn, in a build with the race detector: the
// syscall package's read and write, which tell the detector that what a
// peer received was written before (its own annotations), so that tests
// synchronised through the network see no race. The scheduler sees
// these calls, as it does those of Go's own connections.
func connIO(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		var (
			n   int
			err error
		)
		if trap == unix.SYS_READ {
			n, err = syscall.Read(int(fd), b)
		} else {
			n, err = syscall.Write(int(fd), b)
		}
		errno, _ := err.(syscall.Errno)
		if errno != unix.EINTR {
			return max(n, 0), errno
		}
	}
}
