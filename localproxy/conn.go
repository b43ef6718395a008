package localproxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// conn is one client connection and, once dialed, its upstream.
type conn struct {
	p *Proxy
	// client is the client's connection; nil for one the loop accepted
	// (evaccept_linux.go), whose socket is c.ev's, and whose addresses are
	// raddr and laddr (nil if unknown).
	client       net.Conn
	raddr, laddr *net.TCPAddr
	// tuned: client has the socket options tuneClient sets, from its
	// listener.
	tuned bool
	// Set once dialed, before the conn is registered per upstream.
	addr string
	// up counts the upstream connection in the pool until closed: an
	// *endpoint.TrackedConn, or endpoint.Dialer.Opened's for one dialed
	// on the loop, whose socket is c.ev's and its address upAddr.
	up     io.Closer
	upAddr *net.TCPAddr
	// upRaw is up's underlying connection: copying between two
	// *net.TCPConn takes the kernel splice path. Closing goes through up so
	// the pool stops counting it.
	upRaw net.Conn
	// dial is c's dial on the loop while it runs, and dialing says so to
	// the poller's goroutine without c.mu.
	dial    *loopDial
	dialing atomic.Bool
	// fb, if not nil, watches for the upstream's first byte after the
	// client's first bytes: set before the copies start, cleared once the
	// watch is settled.
	fb *firstByte

	halves atomic.Int32 // directions that ended with EOF
	// mu guards the fields below, the upstream fields and the
	// directions' states. Nothing else is locked while it is held.
	mu sync.Mutex
	// dirs are the two copies, indexed by toUpstream and toClient, and
	// raw the client's and the upstream's syscall.RawConn (nil: not a
	// socket), set before the copies start.
	dirs [2]direction
	raw  [2]syscall.RawConn
	// closeAt is the earliest close deadline (half-open, shutdown);
	// closeTimer closes c then.
	closeAt    time.Time
	closeTimer *time.Timer
	closed     bool
	// id names c in the poller's keys once a direction parked or c went
	// on the loop; 0: none.
	id uint64
	// ev, once set, holds c's sockets on the poller's loop (toLoop): the
	// net.Conns are closed, and the loop copies; nil: goroutines copy.
	ev *evConn
}

// attach sets c's upstream. It returns false, closing tc, when c was closed
// during the dial.
func (c *conn) attach(addr string, tc *endpoint.TrackedConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		tc.Close()
		return false
	}
	c.addr, c.up, c.upRaw = addr, tc, tc.NetConn()
	return true
}

// clientAddr is the client's address.
func (c *conn) clientAddr() net.Addr { return addrOf(c.client, false, c.raddr) }

// clientLocal is the address the client connected to; nil if unknown.
func (c *conn) clientLocal() net.Addr { return addrOf(c.client, true, c.laddr) }

// upstreamAddr is the upstream's address once dialed; nil before.
func (c *conn) upstreamAddr() net.Addr { return addrOf(c.upRaw, false, c.upAddr) }

// addrOf is nc's remote address (local: its local one), or, without nc
// (a socket of the loop's own), a; nil if neither is known.
func addrOf(nc net.Conn, local bool, a *net.TCPAddr) net.Addr {
	switch {
	case nc != nil && local:
		return nc.LocalAddr()
	case nc != nil:
		return nc.RemoteAddr()
	case a != nil:
		return a
	}
	return nil
}

// clientName is the client's address for logs.
func (c *conn) clientName() string {
	if a := c.clientAddr(); a != nil {
		return a.String()
	}
	return "unknown"
}

// serve dials an upstream for c and starts the copies in both directions
// (pipe); the connection finishes when both are done.
func (p *Proxy) serve(ctx context.Context, c *conn) {
	if !c.tuned {
		tuneClient(c.client, p.clientOptsFor(ipOf(c.clientLocal())), p.log)
	}
	if !p.connect(ctx, c) {
		c.close()
		p.forget(c)
		return
	}
	c.pipe(p.fb.watch(c.addr))
}

// notDialed counts and logs c's dial that failed on every candidate, err
// joining the attempts' errors: for no_endpoint, or, if one of them is,
// as this host's own shortage (shortOf).
func (p *Proxy) notDialed(c *conn, err error) {
	if upstream.IsLocalError(err) {
		p.shortOf(c, err)
		return
	}
	p.dialed() // its sockets could be opened
	p.m.rejected.WithLabelValues("no_endpoint").Inc()
	p.log.Info("no endpoint accepted the connection", "client", c.clientName(), "err", err.Error())
}

// connect dials an upstream for c, registers it and sends the PROXY
// protocol header. It returns false when c is to be closed.
func (p *Proxy) connect(ctx context.Context, c *conn) bool {
	if err := p.hold.Err(); err != nil {
		// Every endpoint refused a moment ago: do not dial them all again
		// for each client that reconnects.
		p.m.rejected.WithLabelValues("holdoff").Inc()
		p.log.V(2).Info("closing the connection without dialing", "client", c.clientName(), "err", err.Error())
		return false
	}
	// The registry refuses the connection if its endpoint goes away
	// after this mark (its event would not see it).
	mark := p.upstreams.Begin()
	endMark := sync.OnceFunc(p.upstreams.End)
	defer endMark()
	round := p.hold.Round()
	cands := p.pool.Candidates()
	up, addr, err := p.dialer.DialAny(ctx, cands)
	if err != nil {
		if ctx.Err() == nil {
			p.hold.Failed(round, err)
		}
		p.notDialed(c, err)
		return false
	}
	p.hold.End()
	p.dialed()
	if len(cands) > 0 && addr != cands[0] {
		p.m.failovers.WithLabelValues("dial").Inc()
	}
	tc, ok := up.(*endpoint.TrackedConn)
	if !ok { // the dialer has no TLSConfig, so this does not happen
		up.Close()
		return false
	}
	if !c.attach(addr, tc) {
		return false
	}
	if !p.upstreams.Add(addr, c, mark) {
		p.log.V(2).Info("endpoint went down while dialing", "endpoint", addr)
		return false
	}
	endMark()
	if l := p.log.V(4); l.Enabled() { // clientName formats an address
		l.Info("connected", "client", c.clientName(), "endpoint", addr)
	}
	if p.cfg.ProxyProtocol != ProxyProtocolNone {
		hdr, err := proxyHeader(p.cfg.ProxyProtocol, c.client.RemoteAddr(), c.client.LocalAddr())
		if err == nil {
			attempt, _ := p.dialer.Timeouts()
			err = writeHeader(c.upRaw, hdr, time.Now().Add(attempt))
		}
		if err != nil {
			p.log.Info("sending the PROXY protocol header failed", "endpoint", addr, "err", err.Error())
			return false
		}
	}
	return true
}

// pipe copies in both directions, passing each EOF on with a half-close:
// on the poller's loop (toLoop), else one direction on this goroutine and
// one on another, until each ends or parks (see direction). fb, if not nil, watches for the upstream's first
// byte after the client's first bytes. The connection finishes when both
// directions are done, on whichever goroutine ends the last one.
func (c *conn) pipe(fb *firstByte) {
	c.mu.Lock()
	c.fb = fb
	c.raw = [2]syscall.RawConn{rawConnOf(c.client), rawConnOf(c.upRaw)}
	for side := range c.dirs {
		c.dirs[side].c, c.dirs[side].side = c, side
	}
	c.mu.Unlock()
	c.p.pipes.Add(1)
	if c.toLoop() {
		return
	}
	go c.dirs[toUpstream].run()
	c.dirs[toClient].run()
}

// ended marks d done; the last direction to end finishes the connection.
func (c *conn) ended(d *direction) {
	c.mu.Lock()
	d.state = dirDone
	last := c.doneLocked()
	c.mu.Unlock()
	if last {
		c.close()
		c.finish()
	}
}

// doneLocked reports whether both directions are done.
func (c *conn) doneLocked() bool {
	return c.dirs[toUpstream].state == dirDone && c.dirs[toClient].state == dirDone
}

// finish ends a connection whose copies are done: the first-byte watch
// stops, the proxy forgets it.
func (c *conn) finish() {
	c.mu.Lock()
	fb := c.fb
	c.fb = nil
	var upID uint64
	if c.ev != nil {
		upID = c.ev.upID
	}
	c.mu.Unlock()
	fb.stop()
	if c.id != 0 { // no direction parks any more: c.id is set for good
		c.p.parker().remove(c.id)
	}
	if upID != 0 && upID != c.id {
		c.p.parker().remove(upID)
	}
	c.p.forget(c)
	c.p.pipes.Done()
}

// SinceData tells how long ago the upstream connection last sent and
// received data (endpoint.Registry.Busy).
func (c *conn) SinceData() (sent, recv time.Duration, ok bool) { return c.sinceData(1) }

// sinceData is endpoint.SinceData of c's client socket (sock 0) or its
// upstream's (1).
func (c *conn) sinceData(sock int) (sent, recv time.Duration, ok bool) {
	c.onSocket(sock, func(fd int) { sent, recv, ok = endpoint.SinceDataFD(fd) },
		func(nc net.Conn) { sent, recv, ok = endpoint.SinceData(nc) })
	return sent, recv, ok
}

// SinceHeard tells how long ago the upstream connection last received
// data, false if it never did (endpoint.Registry.Heard): a connection
// is registered once connected, before its server said anything.
func (c *conn) SinceHeard() (recv time.Duration, ok bool) {
	c.onSocket(1, func(fd int) { recv, ok = endpoint.SinceHeardFD(fd) },
		func(nc net.Conn) { recv, ok = endpoint.SinceHeard(nc) })
	return recv, ok
}

// onSocket calls onFD with the loop's descriptor of c's client socket
// (sock 0) or its upstream's (1) once c is on the loop, under c.mu so
// that it stays open (not at all once c is closed), or onConn with its
// net.Conn before, if it has one.
func (c *conn) onSocket(sock int, onFD func(fd int), onConn func(net.Conn)) {
	c.mu.Lock()
	if c.ev != nil {
		defer c.mu.Unlock()
		if !c.closed {
			onFD(c.loopFDs()[sock])
		}
		return
	}
	nc := c.client
	if sock == 1 {
		nc = c.upRaw
	}
	c.mu.Unlock()
	if nc != nil {
		onConn(nc)
	}
}

// isClosed reports whether the proxy closed c.
func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// closeBy closes c at t, if not earlier already: the copies end, parked
// or not.
func (c *conn) closeBy(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || (!c.closeAt.IsZero() && !t.Before(c.closeAt)) {
		return
	}
	c.closeAt = t
	if c.closeTimer == nil {
		c.closeTimer = time.AfterFunc(time.Until(t), c.close)
	} else {
		c.closeTimer.Reset(time.Until(t))
	}
}

// Retire does nothing: a spliced connection takes no new requests to stop
// (endpoint.Conn).
func (c *conn) Retire() {}

// Close closes both sides, for the registry (endpoint.Conn): its server
// went down or left the pool, a drain ended, or fail-back moves it. An
// answer still arriving from the server (data received less than
// endpoint.QuietFor ago: a lossy server whose probes time out still
// answers, late) is let finish: the close waits until the server has
// been quiet that long, at most answerGrace. A server that sends
// nothing, hung or cut off, is cut at once.
func (c *conn) Close() { c.closeWhenAnswered(time.Now().Add(answerGrace)) }

// answerGrace bounds how long Close waits for an answer arriving.
const answerGrace = 2 * time.Second

// closeWhenAnswered closes c once its server has sent nothing for
// endpoint.QuietFor, or at deadline.
func (c *conn) closeWhenAnswered(deadline time.Time) {
	_, recv, ok := c.SinceData()
	now := time.Now()
	if !ok || recv >= endpoint.QuietFor || !now.Before(deadline) || c.isClosed() {
		c.close()
		return
	}
	wait := min(endpoint.QuietFor-recv, deadline.Sub(now))
	time.AfterFunc(max(wait, time.Millisecond), func() { c.closeWhenAnswered(deadline) })
}

// close closes both sides; the copies then end, and a parked direction is
// done at once. The upstream is closed through the TrackedConn, so that
// the pool stops counting it.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	// Counted before any finish of c can let Run's wait for these closes
	// begin; closeClient ends it.
	c.p.closing.Add(1)
	parked := false
	for i := range c.dirs {
		if c.dirs[i].state == dirParked {
			c.dirs[i].state = dirDone
			parked = true
		}
	}
	// Only a direction made done here can be the last: a running one
	// finishes c itself when it ends.
	last := parked && c.doneLocked()
	up, t, ev, dial := c.up, c.closeTimer, c.ev, c.dial
	if dial != nil {
		// Its dial is close's to end, and c its to finish.
		c.dial = nil
		c.dialing.Store(false)
		last = true
	}
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if dial != nil {
		c.closeDial(dial)
	}
	// Only a connection that reached its API server carries streams to
	// fail retryably; one whose both sides ended with an EOF gave the
	// client its FIN already.
	gently := up != nil && c.halves.Load() < 2
	if ev != nil {
		// The loop does not touch a closed c's descriptors.
		c.closeLoop(ev, gently)
	} else {
		c.p.closeClient(c.client, gently)
	}
	if up != nil {
		up.Close() // on the loop: closed already; the pool stops counting it
	}
	if last {
		c.finish()
	}
}

// clientCloseGrace is how long a client connection the proxy closes stays
// open for reading after its FIN (closeClient).
const clientCloseGrace = time.Second

// closeClient closes a client connection, FIN first if gently: its write
// side at once, the rest clientCloseGrace later, with nothing read from
// it meanwhile. An HTTP/2 client then sees an EOF and fails its streams
// in flight with "unexpected EOF", which client-go sends a GET again
// after. Closed at once, with the client's bytes unread, the socket would
// send a reset: a write the client makes before its read loop sees it
// fails, and Go's HTTP/2 client then fails every stream of the connection
// with "client connection force closed", which client-go does not retry.
// The descriptor held meanwhile counts against MaxConnections (accept).
// The caller counted the close in closing; Run waits for them all.
func (p *Proxy) closeClient(nc io.Closer, gently bool) {
	cw, ok := nc.(interface{ CloseWrite() error })
	if !gently || !ok {
		nc.Close()
		p.closing.Done()
		return
	}
	p.lingering.Add(1)
	done := func() {
		nc.Close()
		p.lingering.Add(-1)
		p.closing.Done()
	}
	if cw.CloseWrite() != nil {
		done()
		return
	}
	time.AfterFunc(endpoint.OrDefault(p.cfg.clientCloseGrace, clientCloseGrace), done)
}

// tuneClient sets o on an accepted client connection: keepalive and
// TCP_USER_TIMEOUT if o.timeouts, the congestion control unless o.cc is
// "". Failures leave the connection working with the system defaults, so
// they are only logged.
func tuneClient(nc net.Conn, o clientOpts, log logr.Logger) {
	var err error
	if o.timeouts {
		err = endpoint.TuneTCP(nc, o.keepAlive, o.userTimeout)
	}
	if sc, ok := nc.(syscall.Conn); ok && err == nil && o.cc != "" {
		var rc syscall.RawConn
		if rc, err = sc.SyscallConn(); err == nil {
			err = setCongestion(rc, o.cc)
		}
	}
	if err != nil {
		log.V(2).Info("tuning a client connection failed", "client", nc.RemoteAddr().String(), "err", err.Error())
	}
}

// ipOf returns the IP address of a, a *net.TCPAddr; the zero Addr for
// anything else.
func ipOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr()
	}
	return netip.Addr{}
}
