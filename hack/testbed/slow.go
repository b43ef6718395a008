package testbed

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Default delays of Slow.
const (
	DefaultSlowHandshake = 300 * time.Millisecond
	DefaultSlowResponse  = 2 * time.Second
)

// relayMark is the socket mark (SO_MARK) of a shim's own connections to
// its apiserver: the nat rule that sends clients to the shim skips them.
const relayMark = "0x2000/0x2000"

const relayMarkValue = 0x2000

// Slowness configures Slow.
type Slowness struct {
	// Handshake holds the first bytes the server sends on a connection
	// (in TLS: ServerHello to Finished) this long. If zero,
	// DefaultSlowHandshake (300ms). If negative, not held.
	Handshake time.Duration
	// Response holds every later chunk the server sends this long: a
	// constant added latency, not a bandwidth limit (chunks read meanwhile
	// follow, each held from the moment it was read). If zero,
	// DefaultSlowResponse (2s). If negative, not held.
	Response time.Duration
	// ResetExisting resets, on their next packet, the connections to the
	// apiserver made before Slow (TCP RST, as Reject), so that every
	// client meets the shim when it reconnects, as with a server that is
	// slow itself. If false they keep their speed.
	ResetExisting bool
}

func (s Slowness) withDefaults() Slowness {
	switch {
	case s.Handshake == 0:
		s.Handshake = DefaultSlowHandshake
	case s.Handshake < 0:
		s.Handshake = 0
	}
	switch {
	case s.Response == 0:
		s.Response = DefaultSlowResponse
	case s.Response < 0:
		s.Response = 0
	}
	return s
}

// Slow puts a latency shim in front of the apiserver: a TCP relay in this
// process, on the apiserver's address and a port of its own, and an
// iptables nat OUTPUT DNAT rule that sends new client connections to
// host:6443 there. The relay passes the client's bytes on at once and
// holds the server's (see Slowness): handshakes, probes and requests all
// answer late while traffic keeps flowing. The apiservers' own connections
// (see LoopbackExempt) and the relay's connections to the apiserver are
// not redirected.
//
// Only new connections are slowed: a DNAT rule does not capture
// connections established before it, which keep their speed until they
// close (so a client's long-lived HTTP/2 connection stays fast; its fresh
// probe connections do not), unless Slowness.ResetExisting resets them.
// A second Slow changes the delays for connections accepted from then on
// (not ResetExisting). Undo with Fast.
func (s *APIServer) Slow(d Slowness) error {
	d = d.withDefaults()
	s.mu.Lock()
	sh := s.shim
	s.mu.Unlock()
	if sh != nil {
		sh.setDelays(d)
		return nil
	}
	sh, err := startShim(s.host, s.Addr(), d)
	if err != nil {
		return fmt.Errorf("%s: slow: %w", s.name, err)
	}
	if err := s.bed.fw.set(slowOwner(s.host), slowRules(s.host, APIServerPort, sh.addr(), d.ResetExisting)); err != nil {
		sh.close()
		return fmt.Errorf("%s: slow: %w", s.name, err)
	}
	s.mu.Lock()
	s.shim = sh
	s.mu.Unlock()
	return nil
}

// Fast removes the shim of Slow: the DNAT rule goes, so new connections
// reach the apiserver directly, and the shim stops accepting and stops
// holding bytes: connections through it go on at full speed until their
// ends close them (or Bed.Close). No-op when not slow.
func (s *APIServer) Fast() error {
	s.mu.Lock()
	sh := s.shim
	s.shim = nil
	if sh != nil {
		s.oldShims = append(s.oldShims, sh)
	}
	s.mu.Unlock()
	if sh == nil {
		return nil
	}
	err := s.bed.fw.set(slowOwner(s.host), nil)
	sh.goFast()
	if err != nil {
		return fmt.Errorf("%s: fast: %w", s.name, err)
	}
	return nil
}

// closeShims closes the shims Fast left running, and their connections.
func (s *APIServer) closeShims() {
	s.mu.Lock()
	old := s.oldShims
	s.oldShims = nil
	s.mu.Unlock()
	for _, sh := range old {
		sh.close()
	}
}

// Slowed reports whether the apiserver is behind a Slow shim.
func (s *APIServer) Slowed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shim != nil
}

func slowOwner(host string) string { return "slow " + host }

// slowRules redirect new connections to host:port, except the apiservers'
// own and the relay's (both exempt, see relayExemptRule), to relay; with
// reset, connections made before are reset.
func slowRules(host string, port int, relay string, reset bool) []rule {
	rules := []rule{{"nat", "OUTPUT", concat(
		[]string{"-p", "tcp", "-d", host, "--dport", strconv.Itoa(port)},
		notExempt,
		[]string{"-j", "DNAT", "--to-destination", relay},
	)}}
	if reset {
		rules = append(rules, resetRules(host, port)...)
	}
	return rules
}

// shim is the relay of one slow apiserver.
type shim struct {
	ln       net.Listener
	upstream string
	dialer   net.Dialer

	mu     sync.Mutex // guards delays, conns, closed
	delays Slowness
	conns  map[net.Conn]struct{}
	closed bool

	fastOnce sync.Once
	fast     chan struct{} // closed by goFast: hold nothing any more

	wg sync.WaitGroup // the accept loop and every relayed connection
}

func startShim(host, upstream string, d Slowness) (*shim, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	sh := &shim{
		ln:       ln,
		upstream: upstream,
		delays:   d,
		conns:    make(map[net.Conn]struct{}),
		fast:     make(chan struct{}),
		dialer: net.Dialer{
			Timeout: 5 * time.Second,
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, relayMarkValue)
				})
				return errors.Join(err, serr)
			},
		},
	}
	sh.wg.Add(1)
	go sh.acceptLoop()
	return sh, nil
}

func (sh *shim) addr() string { return sh.ln.Addr().String() }

func (sh *shim) setDelays(d Slowness) {
	sh.mu.Lock()
	sh.delays = d
	sh.mu.Unlock()
}

// track registers c; false when the shim is closed (c is then closed).
func (sh *shim) track(c net.Conn) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		c.Close()
		return false
	}
	sh.conns[c] = struct{}{}
	return true
}

func (sh *shim) untrack(c net.Conn) {
	sh.mu.Lock()
	delete(sh.conns, c)
	sh.mu.Unlock()
	c.Close()
}

// goFast stops accepting and holding bytes; relayed connections go on.
func (sh *shim) goFast() {
	sh.fastOnce.Do(func() { close(sh.fast) })
	sh.ln.Close()
}

// close stops accepting, closes every relayed connection and waits.
func (sh *shim) close() {
	sh.goFast()
	sh.mu.Lock()
	sh.closed = true
	conns := make([]net.Conn, 0, len(sh.conns))
	for c := range sh.conns {
		conns = append(conns, c)
	}
	sh.mu.Unlock()
	sh.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	sh.wg.Wait()
}

func (sh *shim) acceptLoop() {
	defer sh.wg.Done()
	for {
		c, err := sh.ln.Accept()
		if err != nil {
			return // closed
		}
		if !sh.track(c) {
			return
		}
		sh.mu.Lock()
		d := sh.delays
		sh.mu.Unlock()
		sh.wg.Add(1)
		go sh.relay(c, d)
	}
}

// relay connects client to the apiserver and copies both ways: the
// client's bytes at once, the server's held as d says.
func (sh *shim) relay(client net.Conn, d Slowness) {
	defer sh.wg.Done()
	defer sh.untrack(client)
	server, err := sh.dialer.Dial("tcp", sh.upstream)
	if err != nil {
		return
	}
	if !sh.track(server) {
		return
	}
	defer sh.untrack(server)
	done := make(chan struct{}, 2)
	go func() {
		shimCopy(server, client)
		done <- struct{}{}
	}()
	go func() {
		delayedCopy(client, server, d, sh.fast)
		done <- struct{}{}
	}()
	<-done
	<-done
}

// shimCopy copies src to dst and passes EOF on as a half-close.
func shimCopy(dst, src net.Conn) {
	io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// chunk is what one read from the server returned, and when.
type chunk struct {
	data []byte
	at   time.Time
}

// delayedCopy copies src to dst, each chunk written d.Handshake (the
// first) or d.Response (the others) after it was read, until fast is
// closed: from then on at once.
func delayedCopy(dst, src net.Conn, d Slowness, fast <-chan struct{}) {
	chunks := make(chan chunk, 64)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(0)
	<-timer.C
	delay := d.Handshake
	for c := range chunks {
		if wait := time.Until(c.at.Add(delay)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-fast:
				timer.Stop()
			}
		}
		delay = d.Response
		if _, err := dst.Write(c.data); err != nil {
			src.Close() // ends the reader
			for range chunks {
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
