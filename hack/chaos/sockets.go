package chaos

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// The TCP sockets of this network namespace, from /proc/net/tcp and
// tcp6, and those of a process, through the inodes its descriptors point
// at: what ss -tp shows.

// tcpSocket is one line of /proc/net/tcp.
type tcpSocket struct {
	localPort, remotePort int
	// remote is the peer as /proc writes it: the address as a 32-bit
	// word in host byte order (little-endian here), the port, in hex;
	// localIP and remoteIP the addresses alone.
	remote            string
	localIP, remoteIP string
	state             string // "01" ESTABLISHED, "08" CLOSE_WAIT, ...
}

// connected: ESTABLISHED or CLOSE_WAIT (the peer closed, the owner has
// not yet).
func (s tcpSocket) connected() bool { return s.state == "01" || s.state == "08" }

// tcpTable maps socket inodes to their sockets.
type tcpTable map[string]tcpSocket

// readTCPTable reads the namespace's TCP sockets; empty if unreadable.
func readTCPTable() tcpTable {
	t := tcpTable{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 10 {
				continue
			}
			lip, port, _ := strings.Cut(fs[1], ":")
			lp, _ := strconv.ParseInt(port, 16, 32)
			rip, port, _ := strings.Cut(fs[2], ":")
			rp, _ := strconv.ParseInt(port, 16, 32)
			t[fs[9]] = tcpSocket{localPort: int(lp), remotePort: int(rp), remote: fs[2], localIP: lip, remoteIP: rip, state: fs[3]}
		}
	}
	return t
}

// sockets returns pid's TCP sockets.
func (t tcpTable) sockets(pid int) []tcpSocket {
	var out []tcpSocket
	for _, l := range fdLinks(pid) {
		inode, found := strings.CutPrefix(l, "socket:[")
		if !found {
			continue
		}
		if s, in := t[strings.TrimSuffix(inode, "]")]; in {
			out = append(out, s)
		}
	}
	return out
}

// count counts pid's TCP sockets for which ok holds.
func (t tcpTable) count(pid int, ok func(tcpSocket) bool) int {
	n := 0
	for _, s := range t.sockets(pid) {
		if ok(s) {
			n++
		}
	}
	return n
}

// procAddr is addr (an IPv4 "a.b.c.d:port") as /proc/net/tcp writes it,
// "" if it is not one.
func procAddr(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return ""
	}
	return fmt.Sprintf("%s:%04X", procIP(ap.Addr().String()), ap.Port())
}

// procIP is an IPv4 address as /proc/net/tcp writes it: a 32-bit word
// in host byte order (little-endian here), in hex; "" if ip is not one.
func procIP(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return ""
	}
	b := a.As4()
	return fmt.Sprintf("%02X%02X%02X%02X", b[3], b[2], b[1], b[0])
}

// connectedSockets counts the TCP sockets in this network namespace
// connected to addr (an IPv4 "a.b.c.d:port") in state ESTABLISHED or
// CLOSE_WAIT, from /proc/net/tcp; -1 if it cannot be read.
func connectedSockets(addr string) int {
	want := procAddr(addr)
	if want == "" {
		return -1
	}
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		return -1
	}
	n := 0
	for _, s := range readTCPTable() {
		if s.remote == want && s.connected() {
			n++
		}
	}
	return n
}

// socketsTo counts pid's sockets connected to addr.
func (t tcpTable) socketsTo(pid int, addr string) int {
	want := procAddr(addr)
	return t.count(pid, func(s tcpSocket) bool { return s.remote == want && s.connected() })
}

// countFDKinds counts the descriptors of pids: all, sockets, pipes.
func countFDKinds(pids ...int) (all, sockets, pipes int) {
	for _, pid := range pids {
		for _, l := range fdLinks(pid) {
			all++
			switch {
			case strings.HasPrefix(l, "socket:"):
				sockets++
			case strings.HasPrefix(l, "pipe:"):
				pipes++
			}
		}
	}
	return all, sockets, pipes
}
