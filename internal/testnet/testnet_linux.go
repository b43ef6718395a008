// Package testnet makes network peers that misbehave at the socket level
// for apifailover's unit tests. For tests only.
package testnet

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// HungListener returns the address of a listener on 127.0.0.1 that never
// accepts and whose accept queue is full: the kernel drops the SYNs of a
// connect to it, which hangs, as with a blackholed API server. The test
// is skipped where a full queue does not drop SYNs.
func HungListener(t testing.TB) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(fd, 0); err != nil { // room for one connection
		t.Fatalf("listen: %v", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*unix.SockaddrInet4).Port}).String()
	first, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("the connection that fills the accept queue: %v", err)
	}
	t.Cleanup(func() { first.Close() })
	if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Skip("a full accept queue does not drop SYNs here")
	}
	return addr
}
