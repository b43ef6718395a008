package localproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/transport/endpoint"
)

// copyChunk is how much one splice call may move before the byte counters
// are updated.
const copyChunk = 256 << 10

// conn is one client connection and, once dialed, its upstream.
type conn struct {
	p      *Proxy
	client net.Conn
	// Set once dialed, before the conn is registered per upstream.
	addr string
	up   *endpoint.TrackedConn
	// upRaw is up's underlying connection: copying between two
	// *net.TCPConn takes the kernel splice path. Closing goes through up so
	// the pool stops counting it.
	upRaw net.Conn

	once   sync.Once
	halves atomic.Int32 // directions that ended with EOF
	// mu guards the fields below and the upstream fields. Nothing else is
	// locked while it is held.
	mu sync.Mutex
	// closeAt is the earliest close deadline (half-open, shutdown), set
	// on both sides.
	closeAt time.Time
	closed  bool
}

// attach sets c's upstream. It returns false, closing tc, when c was closed
// during the dial.
func (c *conn) attach(addr string, tc *endpoint.TrackedConn) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		tc.Close()
		return false
	}
	c.addr, c.up, c.upRaw = addr, tc, tc.NetConn()
	if !c.closeAt.IsZero() {
		c.upRaw.SetDeadline(c.closeAt)
	}
	c.mu.Unlock()
	return true
}

// serve dials an upstream for c and copies in both directions until both
// sides are done.
func (p *Proxy) serve(ctx context.Context, c *conn) {
	defer p.forget(c)
	defer c.close()
	tuneClient(c.client, p.cfg.KeepAlive, p.cfg.UserTimeout, p.log)
	if err := p.hold.Err(); err != nil {
		// Every endpoint refused a moment ago: do not dial them all again
		// for each client that reconnects.
		p.m.rejected.WithLabelValues("holdoff").Inc()
		p.log.V(2).Info("closing the connection without dialing", "client", c.client.RemoteAddr().String(), "err", err.Error())
		return
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
		p.m.rejected.WithLabelValues("no_endpoint").Inc()
		p.log.Info("no endpoint accepted the connection", "client", c.client.RemoteAddr().String(), "err", err.Error())
		return
	}
	p.hold.End()
	if len(cands) > 0 && addr != cands[0] {
		p.m.failovers.WithLabelValues("dial").Inc()
	}
	tc, ok := up.(*endpoint.TrackedConn)
	if !ok { // the dialer has no TLSConfig, so this does not happen
		up.Close()
		return
	}
	if !c.attach(addr, tc) {
		return
	}
	if !p.upstreams.Add(addr, c, mark) {
		p.log.V(2).Info("endpoint went down while dialing", "endpoint", addr)
		return
	}
	endMark()
	p.log.V(4).Info("connected", "client", c.client.RemoteAddr().String(), "endpoint", addr)
	if p.cfg.ProxyProtocol != ProxyProtocolNone {
		hdr, err := proxyHeader(p.cfg.ProxyProtocol, c.client.RemoteAddr(), c.client.LocalAddr())
		if err == nil {
			err = writeHeader(c.upRaw, hdr, time.Now().Add(endpoint.OrDefault(p.cfg.AttemptTimeout, endpoint.DefaultAttemptTimeout)))
		}
		if err != nil {
			p.log.Info("sending the PROXY protocol header failed", "endpoint", addr, "err", err.Error())
			return
		}
	}
	fb := p.fb.watch(addr)
	defer fb.stop()
	c.pipe(fb)
}

// pipe copies in both directions, passing each EOF on with a half-close,
// one direction on this goroutine and one on another. fb, if not nil,
// watches for the upstream's first byte after the client's first bytes.
func (c *conn) pipe(fb *firstByte) {
	done := make(chan struct{})
	var sent, got func(int, error)
	if fb != nil {
		sent = func(n int, err error) {
			if n > 0 && err == nil {
				fb.sent()
			}
		}
		got = func(n int, err error) {
			switch {
			case n > 0:
				fb.received()
			case err != nil:
				fb.failed(err, c.isClosed())
			}
		}
	}
	// Bytes sent upstream are a request, or part of one: the held
	// connection of its server is PINGed soon and while it waits.
	wake := func() { c.p.upstreams.Wake(c.addr) }
	go c.proxyCopy(c.upRaw, c.client, c.p.m.bytes.WithLabelValues("in"), done, sent, wake)
	c.proxyCopy(c.client, c.upRaw, c.p.m.bytes.WithLabelValues("out"), nil, got, nil)
	<-done
}

// SinceData tells how long ago the upstream connection last sent and
// received data (endpoint.Registry.Busy).
func (c *conn) SinceData() (sent, recv time.Duration, ok bool) {
	c.mu.Lock()
	up := c.upRaw
	c.mu.Unlock()
	if up == nil {
		return 0, 0, false
	}
	return endpoint.SinceData(up)
}

// firstBufs holds the buffers of copyFirst: a TLS ClientHello or a
// server's first flight mostly fits.
var firstBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

// copyFirst copies what one Read of src returns to dst, so that the first
// bytes of a direction can be seen; the rest goes the splice path. It
// returns the bytes copied, whether src reached EOF, and the read or write
// error (not io.EOF).
func copyFirst(dst, src net.Conn) (int, bool, error) {
	bp := firstBufs.Get().(*[]byte)
	defer firstBufs.Put(bp)
	n, err := src.Read(*bp)
	if n > 0 {
		if _, werr := dst.Write((*bp)[:n]); werr != nil {
			return n, false, werr
		}
	}
	if errors.Is(err, io.EOF) {
		return n, true, nil
	}
	return n, false, err
}

// proxyCopy copies src to dst until EOF, which it passes on with
// CloseWrite, or an error, which closes both sides; after an EOF the other
// direction gets HalfOpenTimeout to finish. Between two *net.TCPConn the
// copy is a kernel splice; it runs in chunks so that the byte counter
// moves. If first is set, the first read goes through a buffer (copyFirst)
// and first is told its byte count and error. wrote, if set, is called
// after each chunk of bytes written to dst. It closes done, if not nil,
// when it returns.
func (c *conn) proxyCopy(dst, src net.Conn, bytes prometheus.Counter, done chan<- struct{}, first func(n int, err error), wrote func()) {
	if done != nil {
		defer close(done)
	}
	var err error
	eof := false
	if first != nil {
		var n int
		n, eof, err = copyFirst(dst, src)
		bytes.Add(float64(n))
		first(n, err)
		if n > 0 && wrote != nil {
			wrote()
		}
	}
	for err == nil && !eof {
		// Splice only what has arrived: a splice waiting for data would
		// hold a kernel pipe (two descriptors) for as long as the
		// connection idles.
		var n int64
		if n, err = awaitData(src); err != nil {
			break
		}
		lr := &io.LimitedReader{R: src, N: n}
		n, err = io.Copy(dst, lr)
		bytes.Add(float64(n))
		if n > 0 && wrote != nil {
			wrote()
		}
		eof = err == nil && lr.N > 0 // src reached EOF
	}
	if eof {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			err = cw.CloseWrite()
		}
	}
	switch {
	case err != nil:
		c.close()
	case c.halves.Add(1) == 1 && c.p.cfg.HalfOpenTimeout > 0:
		c.closeBy(time.Now().Add(c.p.cfg.HalfOpenTimeout))
	}
}

// isClosed reports whether the proxy closed c.
func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// closeBy makes both sides' I/O fail at t (if not earlier already), which
// ends the copies and closes the connection.
func (c *conn) closeBy(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeAt = earliest(c.closeAt, t)
	c.applyDeadlineLocked()
}

// Retire does nothing: a spliced connection takes no new requests to stop
// (endpoint.Conn).
func (c *conn) Retire() {}

// Close closes both sides, for the registry (endpoint.Conn).
func (c *conn) Close() { c.close() }

// applyDeadlineLocked sets the deadline on both sides; the zero time
// clears it.
func (c *conn) applyDeadlineLocked() {
	d := c.closeAt
	c.client.SetDeadline(d)
	if c.upRaw != nil {
		c.upRaw.SetDeadline(d)
	}
}

// earliest returns the earlier of two deadlines, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// close closes both sides. The upstream is closed through the
// TrackedConn, so that the pool stops counting it.
func (c *conn) close() {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		up := c.up
		c.mu.Unlock()
		c.client.Close()
		if up != nil {
			up.Close()
		}
	})
}

// tuneClient enables keepalive and TCP_USER_TIMEOUT on an accepted client
// connection. Failures leave the connection working with the system
// defaults, so they are only logged.
func tuneClient(nc net.Conn, keepAlive, userTimeout time.Duration, log logr.Logger) {
	if err := endpoint.TuneTCP(nc, keepAlive, userTimeout); err != nil {
		log.V(2).Info("tuning a client connection failed", "client", nc.RemoteAddr().String(), "err", err.Error())
	}
}
