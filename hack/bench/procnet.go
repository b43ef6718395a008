package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The connections of a proxy process, read from /proc the same way for
// localproxy, HAProxy and nginx: which TCP sockets the processes hold
// (/proc/PID/fd) and where they lead (/proc/net/tcp of the bed's network
// namespace). IPv4 only: the bed's apiservers and the proxies' listeners
// are IPv4.

// TCP states of /proc/net/tcp (include/net/tcp_states.h).
const (
	tcpEstablished = 0x01
	tcpCloseWait   = 0x08
)

// sockConn is one TCP socket.
type sockConn struct {
	Local, Remote netip.AddrPort
	State         uint8
	Inode         uint64
}

// open reports whether the connection still carries (or can carry) data
// from the peer's point of view: established, or closed by the peer but
// not yet by this side.
func (c sockConn) open() bool { return c.State == tcpEstablished || c.State == tcpCloseWait }

// parseProcNetTCP parses /proc/net/tcp: one socket per line after the
// header, addresses as native-endian hex words.
func parseProcNetTCP(text string) ([]sockConn, error) {
	var out []sockConn
	sc := bufio.NewScanner(strings.NewReader(text))
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		local, err := parseHexAddrPort(f[1])
		if err != nil {
			return nil, err
		}
		remote, err := parseHexAddrPort(f[2])
		if err != nil {
			return nil, err
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("state %q: %w", f[3], err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("inode %q: %w", f[9], err)
		}
		out = append(out, sockConn{Local: local, Remote: remote, State: uint8(st), Inode: inode})
	}
	return out, sc.Err()
}

// parseHexAddrPort parses "0100007F:1F90" (127.0.0.1:8080 on a
// little-endian machine).
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok || len(a) != 8 {
		return netip.AddrPort{}, fmt.Errorf("address %q: want 8 hex digits:port", s)
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, err)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], binary.BigEndian.Uint32(raw))
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", s, err)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(port)), nil
}

// socketInodes returns the inodes of the sockets pid has open.
func socketInodes(pid int, into map[uint64]bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return // gone
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64); err == nil {
			into[n] = true
		}
	}
}

// tcpConnsOf returns the TCP sockets (IPv4) held by pids.
func tcpConnsOf(pids []int) ([]sockConn, error) {
	inodes := make(map[uint64]bool)
	for _, p := range pids {
		socketInodes(p, inodes)
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	all, err := parseProcNetTCP(string(b))
	if err != nil {
		return nil, fmt.Errorf("/proc/net/tcp: %w", err)
	}
	var out []sockConn
	for _, c := range all {
		if inodes[c.Inode] {
			out = append(out, c)
		}
	}
	return out, nil
}

// processTree returns pid and its descendants (nginx: the master and its
// workers).
func processTree(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pid}
	}
	children := make(map[int][]int)
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// machineBusy returns the CPU time all cores have spent busy since boot
// (/proc/stat: user, nice, system, irq and softirq; not idle, iowait or
// steal), 0 if it cannot be read.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseMachineBusy(line)
}

// parseMachineBusy reads /proc/stat's first line, "cpu  user nice system
// idle iowait irq softirq steal ...", in USER_HZ (100 per second).
func parseMachineBusy(line string) time.Duration {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}

// cpuTime returns the CPU time the processes' threads have used
// (/proc/PID/task/TID/schedstat, nanoseconds).
func cpuTime(pids []int) time.Duration {
	var total time.Duration
	for _, p := range pids {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(p), "task"))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "task", t.Name(), "schedstat"))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				continue
			}
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				total += time.Duration(ns)
			}
		}
	}
	return total
}

// connWatcher tells which apiserver a proxy process carries the client's
// traffic to: the one with the most open connections (on a tie, the one
// with the newest) that are older than minAge (health checks open and close theirs within milliseconds) and
// were not open at the baseline (connections the proxy itself uses, such
// as localproxy's EndpointSlice watch). Safe for concurrent use.
type connWatcher struct {
	pids    func() []int
	servers map[netip.AddrPort]bool // the apiservers

	mu        sync.Mutex // guards the fields below
	firstSeen map[uint64]time.Time
	baseline  map[uint64]bool
	lastAt    time.Time
	last      string
}

// watcherMinAge is how long a connection must have been open to count.
const watcherMinAge = 200 * time.Millisecond

func newConnWatcher(pids func() []int, servers []string) *connWatcher {
	w := &connWatcher{pids: pids, servers: make(map[netip.AddrPort]bool), firstSeen: make(map[uint64]time.Time), baseline: make(map[uint64]bool)}
	for _, s := range servers {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			w.servers[ap] = true
		}
	}
	return w
}

// conns returns the open connections to apiservers, recording when each
// was first seen.
func (w *connWatcher) conns() []sockConn {
	all, err := tcpConnsOf(w.pids())
	if err != nil {
		return nil
	}
	now := time.Now()
	live := make(map[uint64]bool)
	var out []sockConn
	for _, c := range all {
		if !c.open() || !w.servers[c.Remote] {
			continue
		}
		out = append(out, c)
		live[c.Inode] = true
		w.mu.Lock()
		if _, ok := w.firstSeen[c.Inode]; !ok {
			w.firstSeen[c.Inode] = now
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	for ino := range w.firstSeen {
		if !live[ino] {
			delete(w.firstSeen, ino)
		}
	}
	w.mu.Unlock()
	return out
}

// markBaseline excludes the connections open now from Serving.
func (w *connWatcher) markBaseline() {
	cs := w.conns()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range cs {
		w.baseline[c.Inode] = true
	}
}

// serving returns the apiserver carrying the most client connections, ""
// if none; recomputed at most every 50ms.
func (w *connWatcher) serving() string {
	w.mu.Lock()
	if time.Since(w.lastAt) < 50*time.Millisecond {
		defer w.mu.Unlock()
		return w.last
	}
	w.mu.Unlock()
	cs := w.conns()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	count := make(map[string]int)
	newest := make(map[string]time.Time)
	for _, c := range cs {
		seen := w.firstSeen[c.Inode]
		if w.baseline[c.Inode] || now.Sub(seen) < watcherMinAge {
			continue
		}
		addr := c.Remote.String()
		count[addr]++
		if seen.After(newest[addr]) {
			newest[addr] = seen
		}
	}
	// On a tie the newest connection wins: a client opens one when the
	// old one stops taking requests (HTTP/2 GOAWAY) while a watch may
	// still finish on the old one.
	best, most := "", 0
	for addr, n := range count {
		if n > most || (n == most && (newest[addr].After(newest[best]) || (newest[addr].Equal(newest[best]) && addr < best))) {
			best, most = addr, n
		}
	}
	w.lastAt, w.last = now, best
	return best
}

// openTo returns the socket inodes of every open connection to addr,
// baseline and health checks included.
func (w *connWatcher) openTo(addr string) map[uint64]bool {
	out := make(map[uint64]bool)
	for _, c := range w.conns() {
		if c.Remote.String() == addr {
			out[c.Inode] = true
		}
	}
	return out
}
