package localproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Accepting and connecting on the loop: the proxy's own listeners are
// registered with the poller, and the poller's goroutine accepts their
// connections, connects each to its API server with a non-blocking
// socket of its own and copies, HAProxy's way: a new connection wakes
// that thread, for the accept and again for the connect, and no
// goroutine. The listening socket is taken out of Go's network poller
// (loopSocket), whose thread would otherwise wake at each accept's edge
// too. On Go's network
// poller instead (acceptLoop, serve and the dialer's attempts), the
// accept, the dial, its attempt and the copies run on several
// goroutines, each hand-off a wakeup of another thread, and the other
// P's work lets Go's sysmon take the poller's P from its wait again and
// again (then sysmon itself polls every 20µs): in make bench, 1.36-1.42x
// HAProxy's CPU per short connection that way, 0.94-0.96x on the loop
// (README, Benchmarks).
//
// The dial keeps what endpoint.Dialer.DialAny does: candidates in the
// pool's order, the next one started when an attempt fails or has not
// connected after the stagger delay, the first to connect wins and the
// others are closed, each attempt bounded by AttemptTimeout and the whole
// by DialTimeout, failures reported to the pool, the race to the pool's
// ranking, every attempt to the dial metrics. Its deadlines are the
// poller's timers (loopTimer), which bound its wait.
//
// Connections still go through the goroutines where the loop cannot take
// them: a listener of the caller's (Config.Listen: its owner may close
// it under the proxy) unless given to the proxy (ListenersOwned), one P (the poller then waits through Go's network
// poller, without timers), and a candidate that is a host name, which
// needs resolving (serveFromLoop).

// loopListener is one of the proxy's own listeners, accepted on by the
// poller's goroutine.
type loopListener struct {
	p  *Proxy
	ln net.Listener
	// fd is ln's descriptor, used only under mu while !removed: Run
	// takes the listener off the loop (unloopListeners) before it
	// closes ln, so the number is never one reused.
	fd int
	id uint64
	// tuned: ln hands the client connections' socket options to the
	// sockets it accepts.
	tuned bool
	// local is ln's address; nil when its IP is unspecified, and each
	// connection's own is asked for (getsockname).
	local *net.TCPAddr

	mu      sync.Mutex
	removed bool

	// The poller's goroutine only: the accept backoff (acceptLoop's)
	// and when accepting resumes after a failure.
	delay   time.Duration
	retryAt time.Time
	timer   loopTimer
}

// acceptOnLoop hands ln to the poller's goroutine, if ln is a TCP
// listener of the proxy's own (or the caller's, given to it:
// Config.ListenersOwned) and the poller waits by itself, and returns the
// listener that stands for it from then on: a loopSocket, ln closed.
// false: ln keeps its accept loop.
func (p *Proxy) acceptOnLoop(ln net.Listener) (net.Listener, bool) {
	tl, ok := ln.(*net.TCPListener)
	if !ok || (p.cfg.Listen != nil && !p.cfg.ListenersOwned) {
		return ln, false
	}
	poll := p.parker()
	if poll == nil || !poll.blocking {
		return ln, false
	}
	s, err := newLoopSocket(tl)
	if err != nil {
		p.log.V(2).Info("accepting on a goroutine: the listener's socket was not duplicated", "addr", ln.Addr().String(), "err", err.Error())
		return ln, false
	}
	l := &loopListener{p: p, ln: s, fd: s.fd, tuned: p.tunedListeners[ln]}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
		l.local = a
	}
	l.timer.fire = l.resume
	if err := poll.addListener(l); err != nil {
		s.Close()
		p.log.V(2).Info("accepting on a goroutine: the poller refused the listener", "addr", ln.Addr().String(), "err", err.Error())
		return ln, false
	}
	// The socket stays open through s; closing ln takes it out of Go's
	// poller.
	ln.Close()
	p.mu.Lock()
	p.loopLns = append(p.loopLns, l)
	p.mu.Unlock()
	return s, true
}

// loopSocket is a listening socket the poller's goroutine accepts on,
// held by a descriptor of its own that Go's network poller does not
// watch: acceptOnLoop duplicates a listener's and closes the listener.
// Go's poller watches every socket Go made, edge-triggered; with the
// listener in it, each accept's edge woke a thread of Go's that had
// nothing to do (a context switch per connection: 5.1 in all against
// HAProxy's 3.6-3.8, 3.9 without, on a plain TCP harness of one short
// request per connection).
//
// It is a net.Listener for Run and the hand-over (Addr, Close, and the
// descriptor through SyscallConn); Accept fails, since the loop accepts.
type loopSocket struct {
	addr net.Addr
	// fd is the descriptor, valid until Close; mu guards closed, so that
	// Control never runs on a descriptor number closed and reused.
	fd     int
	mu     sync.Mutex
	closed bool
}

// newLoopSocket duplicates tl's descriptor (close-on-exec, and
// non-blocking as tl's socket is) into a loopSocket; tl stays open.
func newLoopSocket(tl *net.TCPListener) (*loopSocket, error) {
	rc, err := tl.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
	}
	return &loopSocket{addr: tl.Addr(), fd: fd}, nil
}

// errAcceptOnLoop is what loopSocket.Accept returns.
var errAcceptOnLoop = errors.New("localproxy: the listener's connections are accepted on the proxy's event loop")

// Accept fails: the poller's goroutine accepts the socket's connections.
func (s *loopSocket) Accept() (net.Conn, error) {
	return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: s.addr, Err: errAcceptOnLoop}
}

// Close closes the descriptor; a second Close fails, as a net.Listener's.
func (s *loopSocket) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &net.OpError{Op: "close", Net: "tcp", Addr: s.addr, Err: net.ErrClosed}
	}
	s.closed = true
	if err := unix.Close(s.fd); err != nil {
		return &net.OpError{Op: "close", Net: "tcp", Addr: s.addr, Err: os.NewSyscallError("close", err)}
	}
	return nil
}

// Addr is the address the socket is bound to.
func (s *loopSocket) Addr() net.Addr { return s.addr }

// SyscallConn gives the descriptor to Control (withFD); Read and Write
// are not supported.
func (s *loopSocket) SyscallConn() (syscall.RawConn, error) { return loopSocketRaw{s}, nil }

// loopSocketRaw is loopSocket's syscall.RawConn.
type loopSocketRaw struct{ s *loopSocket }

func (r loopSocketRaw) Control(f func(fd uintptr)) error {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.s.closed {
		return net.ErrClosed
	}
	f(uintptr(r.s.fd))
	return nil
}

func (r loopSocketRaw) Read(func(fd uintptr) bool) error  { return errAcceptOnLoop }
func (r loopSocketRaw) Write(func(fd uintptr) bool) error { return errAcceptOnLoop }

// unloopListeners takes the listeners off the loop, for Run before it
// closes them: once it returns, the poller's goroutine accepts on none.
func (p *Proxy) unloopListeners() {
	p.mu.Lock()
	lns := p.loopLns
	p.loopLns = nil
	p.mu.Unlock()
	for _, l := range lns {
		p.poll.removeListener(l)
		p.acceptFailing.Delete(l.ln)
		p.accepting.Add(-1)
	}
}

// ready: the listener has connections queued (an edge).
func (l *loopListener) ready() {
	if !l.retryAt.IsZero() {
		return // backing off; the timer accepts
	}
	l.acceptAll()
}

// resume is the backoff's timer.
func (l *loopListener) resume(time.Time) {
	l.retryAt = time.Time{}
	l.acceptAll()
}

// acceptAll accepts until the queue is empty (the listener is edge
// triggered) or accepting fails, then backs off as acceptLoop does: the
// connections wait in the backlog. After acceptBatch connections it goes
// on after the loop's other events (its timer, due at once), so that a
// storm of new connections does not hold up those already open, nor
// Run's removal of the listener for long.
func (l *loopListener) acceptAll() {
	p := l.p
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := 0; !l.removed; n++ {
		if n == acceptBatch {
			p.poll.at(&l.timer, time.Now())
			return
		}
		if at := p.acceptPaused(); !at.IsZero() {
			l.retryAt = at // as after a failed accept; resume accepts
			p.poll.at(&l.timer, at)
			return
		}
		fd, remote, err := acceptRaw(l.fd)
		switch err {
		case nil:
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue // as Go's Accept does
		default:
			l.delay = p.acceptFailed(l.ln, os.NewSyscallError("accept4", err), l.delay)
			l.retryAt = time.Now().Add(l.delay)
			p.poll.at(&l.timer, l.retryAt)
			return
		}
		if l.delay != 0 {
			p.acceptFailing.Delete(l.ln)
			l.delay = 0
		}
		p.takeLoopConn(l, fd, remote)
	}
}

// acceptBatch is how many connections the loop accepts on a listener
// before it turns to its other events.
var acceptBatch = 64

// takeLoopConn starts serving fd, a client connection from remote
// accepted on l.
func (p *Proxy) takeLoopConn(l *loopListener, fd int, remote *net.TCPAddr) {
	if !p.admit(remote) {
		unix.Close(fd)
		return
	}
	c := &conn{p: p, tuned: true, raddr: remote, laddr: l.local}
	if c.laddr == nil {
		c.laddr = localAddrRaw(fd)
	}
	if !l.tuned {
		if err := tuneClientFD(fd, p.clientOptsFor(ipOf(c.clientLocal()))); err != nil {
			p.log.V(2).Info("tuning a client connection failed", "client", c.clientName(), "err", err.Error())
		}
	}
	// Nothing closes c before its dial holds fd: it has no upstream for
	// the registry, the idle reaper cannot read how long a connection
	// without a socket idled, and Run's drain waits for this accept
	// (unloopListeners).
	p.track(c)
	p.dialOnLoop(c, fd)
}

// tuneClientFD is tuneClient of an accepted socket the loop holds, with
// TCP_NODELAY, which Go's accept would have set.
func tuneClientFD(fd int, o clientOpts) error {
	if err := setNoDelayFD(fd); err != nil {
		return err
	}
	if o.timeouts {
		if err := endpoint.TuneTCPFD(fd, o.keepAlive, o.userTimeout); err != nil {
			return err
		}
	}
	if o.cc == "" {
		return nil
	}
	return setCongestionFD(fd, o.cc)
}

// setNoDelayFD sets TCP_NODELAY on the socket fd, as Go does on the
// connections it accepts and dials.
func setNoDelayFD(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return os.NewSyscallError("setsockopt TCP_NODELAY", err)
	}
	return nil
}

// acceptRaw accepts a connection on the listening socket fd,
// non-blocking and close-on-exec, and gives its peer's address. Not
// unix.Accept4: its address conversion asks the listener's protocol
// (getsockopt SO_PROTOCOL, to tell L2TP sockets apart) at every accept,
// a system call per connection.
func acceptRaw(fd int) (int, *net.TCPAddr, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	nfd, _, errno := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if errno != 0 {
		return -1, nil, errno
	}
	return int(nfd), tcpAddrOf(&rsa), nil
}

// localAddrRaw is the local address of the socket fd (getsockname), nil
// if unknown; unix.Getsockname asks the protocol too (acceptRaw).
func localAddrRaw(fd int) *net.TCPAddr {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	if _, _, errno := unix.Syscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n))); errno != 0 {
		return nil
	}
	return tcpAddrOf(&rsa)
}

// tcpAddrOf is a socket address as Go's accept reports it: an IPv4
// address in its 16-byte form, an IPv6 one with its zone's name; empty
// for another family.
func tcpAddrOf(rsa *unix.RawSockaddrAny) *net.TCPAddr {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]).To16(), Port: netPort(sa.Port)}
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		a := &net.TCPAddr{IP: slices.Clone(net.IP(sa.Addr[:])), Port: netPort(sa.Port)}
		if sa.Scope_id != 0 {
			if ifi, err := net.InterfaceByIndex(int(sa.Scope_id)); err == nil {
				a.Zone = ifi.Name
			}
		}
		return a
	}
	return &net.TCPAddr{}
}

// netPort is a port in network byte order, as a sockaddr holds it.
func netPort(p uint16) int {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return int(b[0])<<8 | int(b[1])
}

// loopDial is a connection's dial on the loop, guarded by conn.mu: set
// from the accept until one attempt connects or all failed, or close
// took it.
type loopDial struct {
	cands []string
	addrs []netip.AddrPort
	// next is the next candidate to try; tries the attempts in flight.
	next  int
	tries []loopTry
	errs  []error
	// firstFailed: the first candidate's attempt failed (not lost);
	// started: an attempt got a socket (and c's own id for its key).
	firstFailed, started bool
	// mark is the registry's (Begin), round the hold-off's.
	mark, round uint64
	// attempt bounds each attempt (Dialer.Timeouts).
	attempt time.Duration
	// deadline ends the whole dial; staggerAt starts the next candidate
	// (zero: none to start).
	deadline, staggerAt time.Time
	// bars are the candidates' (upstream.Pool.HedgeBars): how healthy a
	// candidate must be to start while theirs are in flight
	// (startOneLocked).
	bars  []upstream.HedgeBar
	timer loopTimer
}

// loopTry is one attempt of a loopDial.
type loopTry struct {
	addr  string
	ap    netip.AddrPort
	fd    int
	id    uint64 // its key's id: the conn's own for the first
	start time.Time
	bar   upstream.HedgeBar // the candidate's (loopDial.bars)
}

// dialReport is an attempt's end, reported once conn.mu is released:
// OnDial always, the pool too for a failure (not for a loser).
type dialReport struct {
	addr   string
	took   time.Duration
	err    error
	failed bool
}

// dialEnd is what a step of a loopDial leaves to do once conn.mu is
// released.
type dialEnd struct {
	reports []dialReport
	// won: the attempt that connected (fd set); failed: every candidate
	// failed (err joins theirs). Neither: the dial goes on.
	won    *loopTry
	failed error
	dial   *loopDial
	// firstWon is the pool's dial race to record (upstream.ReportDialRace):
	// race false when there is none to record.
	race, firstWon bool
}

// dialOnLoop connects c, whose client socket is fd, to the best
// endpoint, on the poller's goroutine.
func (p *Proxy) dialOnLoop(c *conn, fd int) {
	if err := p.hold.Err(); err != nil {
		p.m.rejected.WithLabelValues("holdoff").Inc()
		p.log.V(2).Info("closing the connection without dialing", "client", c.clientName(), "err", err.Error())
		unix.Close(fd)
		p.forget(c)
		return
	}
	cands := p.pool.Candidates()
	addrs := make([]netip.AddrPort, len(cands))
	for i, a := range cands {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			p.serveFromLoop(c, fd) // a host name: the dialer resolves it
			return
		}
		addrs[i] = ap
	}
	now := time.Now()
	attempt, timeout := p.dialer.Timeouts()
	d := &loopDial{
		cands: cands, addrs: addrs,
		mark: p.upstreams.Begin(), round: p.hold.Round(),
		attempt: attempt, deadline: now.Add(timeout),
	}
	d.bars = p.pool.HedgeBars(cands)
	d.timer.fire = c.dialTimer
	p.pipes.Add(1) // done by finish, as for a connection that pipes
	c.mu.Lock()
	c.ev = &evConn{fds: [2]int{fd, -1}}
	c.id = p.poll.add(c)
	c.dial = d
	c.dialing.Store(true)
	var end dialEnd
	c.advanceLocked(now, 1, &end)
	c.mu.Unlock()
	c.dialEnded(end)
}

// serveFromLoop serves a connection the loop accepted on a goroutine
// (serve), as acceptLoop does.
func (p *Proxy) serveFromLoop(c *conn, fd int) {
	f := os.NewFile(uintptr(fd), "client")
	nc, err := net.FileConn(f) // a duplicate, registered with Go's poller
	f.Close()
	if err != nil {
		if upstream.IsLocalError(err) {
			p.shortOf(c, err)
		} else {
			p.log.Info("closing a client connection: it cannot be handed to a goroutine", "client", c.clientName(), "err", err.Error())
		}
		p.forget(c)
		return
	}
	c.mu.Lock()
	c.client = nc
	c.mu.Unlock()
	p.serveConn(c)
}

// advanceLocked starts the next start candidates (an attempt that
// failed or timed out starts one, the stagger one), or one if none is in
// flight, then arms the dial's timer; past the dial's deadline it starts
// none. With none in flight and none left, the dial failed.
func (c *conn) advanceLocked(now time.Time, start int, end *dialEnd) {
	d := c.dial
	if len(d.tries) == 0 {
		start = max(start, 1)
	}
	if !now.Before(d.deadline) {
		start = 0 // as DialAny's context: nothing starts after its end
	}
	for ; start > 0 && d.next < len(d.cands); start-- {
		c.startOneLocked(now, end)
	}
	if len(d.tries) == 0 {
		c.dialFailedLocked(end)
		return
	}
	c.armDialLocked(now)
}

// startOneLocked starts candidates in order until one connects or is
// connecting; the stagger delay runs from then. While attempts are in
// flight, it starts only a candidate as healthy as the healthiest of
// them was when the dial began (upstream.HedgeBar): a less healthy one,
// such as an API server that fails /readyz but connects at once, would
// win the race against a slow healthy one; it starts once the attempts
// in flight failed (advanceLocked). The first attempt's key is c's own
// id, later ones get their own.
func (c *conn) startOneLocked(now time.Time, end *dialEnd) {
	d := c.dial
	d.staggerAt = time.Time{}
	for d.next < len(d.cands) {
		if len(d.tries) > 0 {
			var bar upstream.HedgeBar
			for _, t := range d.tries {
				bar = bar.Stricter(t.bar)
			}
			if !c.p.pool.MayHedge(bar, d.cands[d.next]) {
				return
			}
		}
		i := d.next
		d.next++
		t := loopTry{addr: d.cands[i], ap: d.addrs[i], fd: -1, start: now}
		if i < len(d.bars) {
			t.bar = d.bars[i]
		}
		fd, err := c.p.openTry(t.ap)
		if err != nil {
			c.tryFailedLocked(d, t, err, now, end)
			continue
		}
		t.fd, t.id = fd, c.id
		if d.started {
			t.id = c.p.poll.add(c)
		}
		d.started = true
		if err := c.p.poll.addFD(fd, t.id<<1|1, loopEvents); err != nil {
			c.closeTry(t)
			c.tryFailedLocked(d, t, err, now, end)
			continue
		}
		d.tries = append(d.tries, t)
		if d.next < len(d.cands) {
			d.staggerAt = now.Add(c.p.dialer.Stagger())
		}
		return
	}
}

// armDialLocked sets the dial's timer to its next deadline: the whole
// dial's, an attempt's, or the stagger's.
func (c *conn) armDialLocked(now time.Time) {
	d := c.dial
	at := d.deadline
	for _, t := range d.tries {
		if e := t.start.Add(d.attempt); e.Before(at) {
			at = e
		}
	}
	if !d.staggerAt.IsZero() && d.staggerAt.Before(at) {
		at = d.staggerAt
	}
	c.p.poll.at(&d.timer, at)
}

// openTry makes a non-blocking TCP socket with the upstream options and
// starts its connect to ap.
func (p *Proxy) openTry(ap netip.AddrPort) (int, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if a := ap.Addr().Unmap(); a.Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	} else {
		family = unix.AF_INET6
		sa6 := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
		if z := a.Zone(); z != "" {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return -1, dialError(ap, err)
			}
			sa6.ZoneId = uint32(ifi.Index)
		}
		sa = sa6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, dialError(ap, os.NewSyscallError("socket", err))
	}
	if err := p.dialer.TuneFD(fd); err != nil {
		p.log.V(2).Info("setting keepalive failed", "endpoint", ap.String(), "err", err.Error())
	}
	if err := setNoDelayFD(fd); err != nil {
		p.log.V(2).Info("setting TCP_NODELAY failed", "endpoint", ap.String(), "err", err.Error())
	}
	switch err := unix.Connect(fd, sa); err {
	case nil, unix.EINPROGRESS, unix.EINTR: // EINTR: the connect goes on
		return fd, nil
	default:
		unix.Close(fd)
		return -1, dialError(ap, os.NewSyscallError("connect", err))
	}
}

// dialError is a failed connect as Go's dialer reports it.
func dialError(ap netip.AddrPort, err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
}

// onKey handles an event of one of c's sockets: an attempt's while c
// dials, a copy's once it is on the loop.
func (c *conn) onKey(key uint64, events uint32) {
	if key&1 == 1 {
		switch {
		case c.dialing.Load():
			c.onDialEvent(key>>1, events)
			return
		case c.ev.upID != 0 && key>>1 != c.ev.upID:
			// A lost attempt's last event, in the batch of the win
			// (set and read on the poller's goroutine only).
			return
		}
	}
	if f := loopEvent.Load(); f != nil {
		(*f)(c, int(key&1), events)
	}
	c.onEvent(int(key&1), events)
}

// loopEvent, if set (tests), sees each event of a copying connection's
// sockets, on the poller's goroutine.
var loopEvent atomic.Pointer[func(c *conn, sock int, events uint32)]

// onDialEvent handles an event of the attempt keyed id: it connected,
// unless the event says it failed.
func (c *conn) onDialEvent(id uint64, events uint32) {
	var end dialEnd
	c.mu.Lock()
	d := c.dial
	i := -1
	if d != nil && !c.closed {
		for j := range d.tries {
			if d.tries[j].id == id {
				i = j
				break
			}
		}
	}
	if i < 0 {
		c.mu.Unlock()
		return // a loser's last event, or c closed
	}
	now := time.Now()
	t := d.tries[i]
	if events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		err := unix.ECONNRESET // ended as it opened, if the socket does not say
		if v, gerr := unix.GetsockoptInt(t.fd, unix.SOL_SOCKET, unix.SO_ERROR); gerr == nil && v != 0 {
			err = unix.Errno(v)
		}
		d.tries = append(d.tries[:i], d.tries[i+1:]...)
		c.closeTry(t)
		c.tryFailedLocked(d, t, dialError(t.ap, os.NewSyscallError("connect", err)), now, &end)
		// A failed attempt starts the next at once, if it may hedge the
		// attempts still in flight (startOneLocked).
		c.advanceLocked(now, 1, &end)
		c.mu.Unlock()
		c.dialEnded(end)
		return
	}
	c.wonLocked(i, now, &end)
	c.mu.Unlock()
	if !c.dialEnded(end) {
		return
	}
	if events&^unix.EPOLLOUT != 0 {
		// The same edge may carry data or the upstream's end.
		c.onEvent(1, events)
	}
	// The client's first bytes (a TLS ClientHello) most likely came
	// while the upstream connected: read at once, as the edge of its
	// registration would have the loop do after one more wait.
	c.step(toUpstream, stepReadable)
}

// dialTimer is the dial's timer: attempts past AttemptTimeout fail and
// start the next candidate, as failed ones do, the next candidate starts
// at the stagger (if it may hedge: startOneLocked), and at the whole
// dial's deadline every attempt fails and nothing starts (advanceLocked),
// which fails the dial.
func (c *conn) dialTimer(now time.Time) {
	var end dialEnd
	c.mu.Lock()
	d := c.dial
	if d == nil || c.closed {
		c.mu.Unlock()
		return
	}
	over := !now.Before(d.deadline)
	kept := d.tries[:0]
	start := 0
	for _, t := range d.tries {
		err := os.ErrDeadlineExceeded
		switch {
		case over:
			err = context.DeadlineExceeded
		case now.Sub(t.start) < d.attempt:
			kept = append(kept, t)
			continue
		}
		c.closeTry(t)
		c.tryFailedLocked(d, t, dialError(t.ap, err), now, &end)
		start++ // as a failed attempt
	}
	d.tries = kept
	if !d.staggerAt.IsZero() && !now.Before(d.staggerAt) {
		start++
	}
	c.advanceLocked(now, start, &end)
	c.mu.Unlock()
	c.dialEnded(end)
}

// closeTry closes an attempt's socket and drops its key.
func (c *conn) closeTry(t loopTry) {
	unix.Close(t.fd)
	if t.id != c.id {
		c.p.poll.remove(t.id)
	}
}

// tryFailedLocked records a failed attempt.
func (c *conn) tryFailedLocked(d *loopDial, t loopTry, err error, now time.Time, end *dialEnd) {
	if t.addr == d.cands[0] {
		d.firstFailed = true
	}
	d.errs = append(d.errs, fmt.Errorf("%s: %w", t.addr, err))
	end.reports = append(end.reports, dialReport{addr: t.addr, took: now.Sub(t.start), err: err, failed: true})
}

// dialFailedLocked ends a dial every candidate failed.
func (c *conn) dialFailedLocked(end *dialEnd) {
	d := c.dial
	c.dial = nil
	c.dialing.Store(false)
	c.p.poll.timers.stop(&d.timer)
	if len(d.cands) == 0 {
		end.failed = fmt.Errorf("%w: %w", endpoint.ErrUnreachable, upstream.ErrNoEndpoints)
	} else {
		end.failed = errors.Join(append([]error{endpoint.ErrUnreachable}, d.errs...)...)
	}
	end.dial = d
}

// wonLocked ends c's dial with attempt i connected: the others are
// closed, and c has its upstream.
func (c *conn) wonLocked(i int, now time.Time, end *dialEnd) {
	d := c.dial
	c.dial = nil
	c.dialing.Store(false)
	c.p.poll.timers.stop(&d.timer)
	w := d.tries[i]
	for j, t := range d.tries {
		if j != i {
			c.closeTry(t)
			end.reports = append(end.reports, dialReport{addr: t.addr, took: now.Sub(t.start), err: context.Canceled})
		}
	}
	// As DialAny: a first candidate that keeps losing races is slow.
	if won := w.addr == d.cands[0]; won || !d.firstFailed {
		end.race, end.firstWon = true, won
	}
	end.reports = append(end.reports, dialReport{addr: w.addr, took: now.Sub(w.start)})
	end.won, end.dial = &w, d
	c.ev.fds[1] = w.fd
	c.ev.upID = w.id
	c.addr, c.upAddr = w.addr, net.TCPAddrFromAddrPort(w.ap)
	c.up = c.p.dialer.Opened(w.addr)
}

// dialEnded does, without conn.mu, what a step of the dial left: the
// reports, and for a dial that ended, its outcome. It returns true when
// c is now on the loop, copying.
func (c *conn) dialEnded(end dialEnd) bool {
	p := c.p
	for _, r := range end.reports {
		if p.dialer.OnDial != nil {
			p.dialer.OnDial(r.addr, r.took, r.err)
		}
		if r.failed {
			p.dialer.ReportDialFailure(r.addr, r.err)
		}
	}
	d := end.dial
	switch {
	case end.failed != nil:
		p.hold.Failed(d.round, end.failed)
		p.upstreams.End()
		p.notDialed(c, end.failed)
		c.close()
		c.finish()
		return false
	case end.won == nil:
		return false
	}
	if end.race {
		p.pool.ReportDialRace(d.cands[0], end.firstWon)
	}
	p.hold.End()
	p.dialed()
	if end.won.addr != d.cands[0] {
		p.m.failovers.WithLabelValues("dial").Inc()
	}
	added := p.upstreams.Add(end.won.addr, c, d.mark)
	p.upstreams.End()
	if !added {
		p.log.V(2).Info("endpoint went down while dialing", "endpoint", end.won.addr)
		c.close()
		c.finish()
		return false
	}
	if l := p.log.V(4); l.Enabled() { // clientName formats an address
		l.Info("connected", "client", c.clientName(), "endpoint", end.won.addr)
	}
	return c.startLoop()
}

// startLoop sends the PROXY protocol header, if configured, and puts a
// connection dialed on the loop to copying: its client socket joins the
// poller. It returns false when c ended instead.
func (c *conn) startLoop() bool {
	p := c.p
	var hdr []byte
	if p.cfg.ProxyProtocol != ProxyProtocolNone {
		var err error
		if hdr, err = proxyHeader(p.cfg.ProxyProtocol, c.clientAddr(), c.clientLocal()); err != nil {
			p.log.Info("sending the PROXY protocol header failed", "endpoint", c.addr, "err", err.Error())
			c.close()
			c.finish()
			return false
		}
	}
	c.mu.Lock()
	if c.closed {
		// Closed while it connected: its dial was not close's to end.
		c.mu.Unlock()
		c.finish()
		return false
	}
	if len(hdr) > 0 {
		// A new socket's send buffer takes it whole.
		if n, errno := writeFD(c.ev.fds[1], hdr); errno != 0 || n < len(hdr) {
			err := error(errno)
			if errno == 0 || errno == unix.EAGAIN {
				err = fmt.Errorf("wrote %d of %d bytes", n, len(hdr))
			}
			c.mu.Unlock()
			p.log.Info("sending the PROXY protocol header failed", "endpoint", c.addr, "err", err.Error())
			c.close()
			c.finish()
			return false
		}
	}
	c.fb = p.fb.watch(c.addr)
	if c.fb != nil {
		c.fb.loop = p.poll
	}
	for side := range c.dirs {
		c.dirs[side].c, c.dirs[side].side = c, side
		c.dirs[side].state = dirParked
	}
	// Not watched for writes until a write fills its buffer (quietOut):
	// the client's first bytes, read at once (onDialEvent), or their
	// edge, wake the loop, not a new socket's room.
	c.ev.quietOut = true
	err := p.poll.addFD(c.ev.fds[0], c.id<<1, loopEvents&^unix.EPOLLOUT)
	c.mu.Unlock()
	if err != nil {
		p.log.V(2).Info("closing the connection: the poller refused it", "client", c.clientName(), "err", err.Error())
		c.close() // finishes c: its directions are parked
		return false
	}
	return true
}

// closeDial ends the dial close took from c: its attempts are closed
// and reported lost, as DialAny's are when its context ends.
func (c *conn) closeDial(d *loopDial) {
	now := time.Now()
	for _, t := range d.tries {
		c.closeTry(t)
		if c.p.dialer.OnDial != nil {
			c.p.dialer.OnDial(t.addr, now.Sub(t.start), context.Canceled)
		}
	}
	c.p.upstreams.End()
}

// setNoDelay sets TCP_NODELAY on a socket about to listen: Linux copies
// it into the sockets accepted from it, which the loop takes without
// Go's accept, which would set it on each.
func setNoDelay(rc syscall.RawConn) error { return onFD(rc, setNoDelayFD) }
