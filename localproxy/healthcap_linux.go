package localproxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// queuedBytes returns how many bytes c's client has sent that wait in the
// kernel's receive queue (SIOCINQ); 0 if it cannot tell.
func queuedBytes(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}
