//go:build linux && !race

package rawio

import "syscall"

// connIO is IO for a Conn.
func connIO(trap, fd uintptr, b []byte) (int, syscall.Errno) { return IO(trap, fd, b) }
