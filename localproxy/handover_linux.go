package localproxy

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// reusePortControl sets SO_REUSEPORT (and SO_REUSEADDR, as Go does) on a
// listening socket before it binds.
func reusePortControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setting SO_REUSEPORT: %w", serr)
	}
	return nil
}

// withFD runs f with ln's socket, if ln is a socket listener.
func withFD(ln net.Listener, f func(fd int)) bool {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	return rc.Control(func(fd uintptr) { f(int(fd)) }) == nil
}

// steerToNewest attaches to ln's SO_REUSEPORT group a classic BPF program
// that picks the socket at index n-1, the newest of a group of n: the
// kernel appends a joining socket at the end and moves the last one into
// the place of one that leaves. When the group has shrunk below n the
// index is out of range and the kernel falls back to its hash, so a
// program left behind is harmless to a lone socket; the next proxy to
// bind removes it (clearSteering).
func steerToNewest(ln net.Listener, n int) error {
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: uint32(n - 1)}}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	var serr error
	if !withFD(ln, func(fd int) {
		serr = unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
	}) {
		return errors.New("not a socket listener")
	}
	return serr
}

// clearSteering removes the steering program of an earlier hand-over
// from ln's group, so that connections are spread by hash again until
// the next hand-over.
func clearSteering(ln net.Listener) {
	withFD(ln, func(fd int) {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
	})
}

// acceptQueued is the length of ln's accept queue (TCP_INFO's unacked
// field on a listening socket), 0 if unknown.
func acceptQueued(ln net.Listener) int {
	n := 0
	withFD(ln, func(fd int) {
		if ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = int(ti.Unacked)
		}
	})
	return n
}

// otherListeners counts the listening TCP sockets bound to ln's address
// other than ln's own (found by inode in /proc/net/tcp or tcp6 of this
// network namespace): successors bound with SO_REUSEPORT.
func otherListeners(ln net.Listener) int {
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0
	}
	var ino uint64
	if !withFD(ln, func(fd int) {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			ino = st.Ino
		}
	}) || ino == 0 {
		return 0
	}
	file := "/proc/net/tcp"
	if ta.IP.To4() == nil {
		file = "/proc/net/tcp6"
	}
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	inodes, err := listeningInodes(f, ta)
	if err != nil {
		return 0
	}
	n := 0
	for _, i := range inodes {
		if i != ino {
			n++
		}
	}
	return n
}

// listeningInodes returns the inodes of the sockets in LISTEN state bound
// to addr in a /proc/net/tcp or tcp6 table.
func listeningInodes(r io.Reader, addr *net.TCPAddr) ([]uint64, error) {
	var out []uint64
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		ip, port, err := parseProcAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("local address %q: %w", f[1], err)
		}
		if port != addr.Port || !ip.Equal(addr.IP) {
			continue
		}
		ino, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("inode %q: %w", f[9], err)
		}
		out = append(out, ino)
	}
	return out, sc.Err()
}

// parseProcAddr parses "0100007F:1D15" (IPv4) or 32 hex digits and a port
// (IPv6): the address as 32-bit words in host byte order (little-endian
// on the machines this runs on), the port in hex.
func parseProcAddr(s string) (net.IP, int, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, errors.New("no port")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, 0, fmt.Errorf("port: %w", err)
	}
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil, 0, errors.New("address is not 8 or 32 hex digits")
	}
	ip := make(net.IP, len(b))
	for w := 0; w < len(b); w += 4 {
		ip[w], ip[w+1], ip[w+2], ip[w+3] = b[w+3], b[w+2], b[w+1], b[w]
	}
	return ip, int(port), nil
}
