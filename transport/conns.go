package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// maxIdlePerEndpoint bounds idle HTTP/1.1 connections kept per endpoint
// (HTTP/2 needs one).
const maxIdlePerEndpoint = 4

// errClosed is returned for requests after Close.
var errClosed = errors.New("transport: failover transport closed")

// connPool keeps HTTP client connections (HTTP/2, or HTTP/1.1 when the
// server or the configuration allows nothing else) per endpoint. Requests go
// to the pool's first candidate; the connections of an endpoint that goes
// down or is removed are closed at once; when another endpoint becomes
// preferred, the old connections take no new requests and close once their
// requests are done.
type connPool struct {
	pool   *upstream.Pool
	dialer *endpoint.Dialer
	// t creates connections (NewClientConn) with our dialer and its TLS,
	// HTTP/2 and keepalive settings. It never pools connections itself.
	t      *http.Transport
	origin string // host:port of the origin, as in request URLs
	ctx    context.Context
	log    logr.Logger
	m      *metrics

	mu      sync.Mutex // guards the fields below
	conns   map[string][]*clientConn
	dialing map[string]*dialCall // in-flight dials by first candidate
	closed  bool
	// gen counts EventDown and EventRemoved events; goneAt holds, per
	// endpoint, the count at its latest one. A dial that started before
	// its endpoint went down or was removed discards its connection
	// (onEvent closed the others, and would not see this one). Cleared
	// when no dial is in flight.
	gen    uint64
	goneAt map[string]uint64
	// hold makes new requests fail at once for a while after a dial that
	// tried every endpoint failed.
	hold endpoint.Holdoff
}

// clientConn is one connection to one endpoint.
type clientConn struct {
	cc   *http.ClientConn
	addr string
	conn net.Conn // for httptrace.GotConnInfo
	used atomic.Bool
	p    *connPool
	// Guarded by p.mu.
	retiring     bool
	closedByPool bool
	lastInFlight int
	// drain closes the connection if its requests are still running when
	// the drain of its endpoint times out; stopped if the endpoint recovers.
	drain *time.Timer
	// keepAlone: the drain is for an endpoint that went down (not one that
	// was removed): at the deadline the connection stays while no other
	// endpoint is healthy.
	keepAlone bool
}

type dialCall struct {
	done chan struct{}
	// Set before done is closed: the connection the dial opened (nil if
	// it was discarded) or the error.
	c   *clientConn
	err error
}

type dialPlanKey struct{}

// dialPlan passes the candidates of one NewClientConn to the dial hook and
// brings back the endpoint that answered.
type dialPlan struct {
	candidates []string
	addr       string
	conn       net.Conn
}

func newConnPool(ctx context.Context, pool *upstream.Pool, d *endpoint.Dialer, t *http.Transport, origin string, log logr.Logger, m *metrics) *connPool {
	p := &connPool{
		pool:    pool,
		dialer:  d,
		t:       t,
		origin:  origin,
		ctx:     ctx,
		log:     log,
		m:       m,
		conns:   make(map[string][]*clientConn),
		dialing: make(map[string]*dialCall),
		goneAt:  make(map[string]uint64),
	}
	t.DialTLSContext = p.dialTLS
	return p
}

// dialTLS is http.Transport.DialTLSContext: it ignores addr (the origin) and
// dials the candidates carried by ctx.
func (p *connPool) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	plan, ok := ctx.Value(dialPlanKey{}).(*dialPlan)
	if !ok {
		return nil, fmt.Errorf("transport: dial %s outside the connection pool", addr)
	}
	conn, ep, err := p.dialer.DialAny(ctx, plan.candidates)
	if err != nil {
		return nil, err
	}
	plan.addr, plan.conn = ep, conn
	return conn, nil
}

// get returns a connection with a reserved request slot on the best
// endpoint not in exclude, dialing one if needed. The dial runs on the
// pool's context, not the request's: a request that gives up does not waste
// a connection others will use. A request waiting for a dial is served by
// the connection the dial opened, whichever endpoint won the race: a slow
// first candidate may lose every race, and the pool demotes it only after
// a few (see upstream.Pool.ReportDialRace).
func (p *connPool) get(ctx context.Context, exclude map[string]bool) (*clientConn, error) {
	for {
		cands := p.pool.Candidates()
		if len(exclude) > 0 {
			kept := cands[:0]
			for _, a := range cands {
				if !exclude[a] {
					kept = append(kept, a)
				}
			}
			cands = kept
		}
		if len(cands) == 0 {
			return nil, fmt.Errorf("%w: every endpoint was tried", endpoint.ErrUnreachable)
		}
		first := cands[0]
		if c := p.reserve(first); c != nil {
			return c, nil
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errClosed
		}
		call := p.dialing[first]
		if call == nil {
			if err := p.hold.Err(); err != nil && len(exclude) == 0 {
				p.mu.Unlock()
				return nil, err
			}
			call = &dialCall{done: make(chan struct{})}
			p.dialing[first] = call
			go p.dial(first, cands, len(exclude) == 0, p.hold.Round(), call)
		}
		p.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil {
				return nil, call.err
			}
			if call.c != nil && p.reserveConn(call.c) {
				return call.c, nil
			}
			// Taken (HTTP/1.1 serves one request at a time) or discarded:
			// look again.
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// gotConn reports the connection a request is about to be sent on to the
// request's httptrace.ClientTrace, as http.Transport does: its RemoteAddr
// is the endpoint serving the request.
func (c *clientConn) gotConn(req *http.Request) {
	reused := c.used.Swap(true)
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.GotConn != nil && c.conn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c.conn, Reused: reused})
	}
}

// reserve reserves a slot on an open connection to addr that is not
// retiring, and closes connections found unusable. The connections' methods
// run outside p.mu: Reserve may call the state hook (onState), which takes
// p.mu.
func (p *connPool) reserve(addr string) *clientConn {
	p.mu.Lock()
	var cands []*clientConn
	for _, c := range p.conns[addr] {
		if !c.retiring {
			cands = append(cands, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cands {
		if p.reserveConn(c) {
			return c
		}
	}
	return nil
}

// reserveConn reserves a request slot on c unless it is retiring or
// closed; it closes c if it is found unusable while idle.
func (p *connPool) reserveConn(c *clientConn) bool {
	if err := c.cc.Reserve(); err == nil {
		p.mu.Lock()
		ok := !c.retiring && !c.closedByPool && !p.closed
		if ok {
			// A request is in flight: a loss from now on is news.
			c.lastInFlight = max(c.lastInFlight, 1)
		}
		p.mu.Unlock()
		if !ok {
			c.cc.Release()
		}
		return ok
	}
	if c.cc.Err() != nil || c.cc.InFlight() == 0 {
		// Closed, or unusable while idle (GOAWAY): drop it.
		p.mu.Lock()
		c.closedByPool = true
		p.removeLocked(c)
		p.mu.Unlock()
		c.cc.Close()
	}
	return false
}

func closeAll(cs []*clientConn) {
	for _, c := range cs {
		c.cc.Close()
	}
}

// dial opens a connection to the first answering candidate and adds it to
// the pool. all says whether cands is every endpoint of the pool; round
// is the holdoff round it belongs to (endpoint.Holdoff.Round).
func (p *connPool) dial(first string, cands []string, all bool, round uint64, call *dialCall) {
	plan := &dialPlan{candidates: cands}
	ctx := context.WithValue(p.ctx, dialPlanKey{}, plan)
	p.mu.Lock()
	began := p.gen
	p.mu.Unlock()
	cc, err := p.t.NewClientConn(ctx, "https", p.origin)
	p.mu.Lock()
	delete(p.dialing, first)
	if err == nil && p.closed {
		err = errClosed
		cc.Close()
	}
	gone := err == nil && p.goneAt[plan.addr] > began
	if len(p.dialing) == 0 {
		clear(p.goneAt)
	}
	switch {
	case err == nil:
		p.hold.End()
	case all && !errors.Is(err, errClosed):
		p.hold.Failed(round, err)
	}
	var c *clientConn
	switch {
	case gone:
		// Its endpoint went down or was removed while it connected; the
		// waiters look again.
		p.log.V(2).Info("discarding a connection whose endpoint went away while it was dialed", "endpoint", plan.addr)
	case err == nil:
		c = &clientConn{cc: cc, addr: plan.addr, conn: plan.conn, p: p}
		p.conns[plan.addr] = append(p.conns[plan.addr], c)
		if plan.addr != first {
			p.m.failover("dial")
		}
		p.log.V(3).Info("connected", "endpoint", plan.addr, "wanted", first)
	}
	call.c, call.err = c, err
	p.mu.Unlock()
	if gone {
		cc.Close()
	}
	if c != nil {
		// Outside p.mu: SetStateHook may run the hook at once.
		cc.SetStateHook(c.onState)
	}
	close(call.done)
}

// onState runs when the connection's state changes: it forgets closed
// connections (reporting a loss the pool did not cause while requests were
// running), closes retiring connections once idle, and trims idle HTTP/1.1
// connections.
func (c *clientConn) onState(cc *http.ClientConn) {
	p := c.p
	err := cc.Err()
	inflight := cc.InFlight()
	p.mu.Lock()
	var lost bool
	closeNow := false
	switch {
	case err != nil:
		lost = !c.closedByPool && c.lastInFlight > 0
		p.removeLocked(c)
	case inflight == 0 && (c.retiring || p.idleLocked(c.addr) > maxIdlePerEndpoint):
		c.closedByPool = true
		closeNow = true
		p.removeLocked(c)
	}
	c.lastInFlight = inflight
	p.mu.Unlock()
	if closeNow {
		cc.Close()
	}
	if lost {
		p.pool.ReportFailure(c.addr, upstream.FailureConnLost, fmt.Errorf("connection lost: %w", err))
	}
}

func (p *connPool) idleLocked(addr string) int {
	n := 0
	for _, c := range p.conns[addr] {
		if c.cc.InFlight() == 0 {
			n++
		}
	}
	return n
}

func (p *connPool) removeLocked(c *clientConn) {
	c.stopDrainLocked()
	cs := p.conns[c.addr]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(p.conns, c.addr)
	} else {
		p.conns[c.addr] = cs
	}
}

// closeEndpoint closes every connection to addr at once.
func (p *connPool) closeEndpoint(addr string) int {
	p.mu.Lock()
	cs := p.conns[addr]
	delete(p.conns, addr)
	for _, c := range cs {
		c.closedByPool = true
		c.stopDrainLocked()
	}
	p.mu.Unlock()
	closeAll(cs)
	return len(cs)
}

// retireExcept stops new requests on connections to endpoints other than
// keep; each closes when its running requests are done.
func (p *connPool) retireExcept(keep string) {
	p.retire(func(addr string) bool { return addr != keep })
}

// retire stops new requests on the connections to the endpoints which
// matches; each closes when its running requests are done. It returns the
// connections that are still busy.
func (p *connPool) retire(which func(addr string) bool) []*clientConn {
	var idle, busy []*clientConn
	p.mu.Lock()
	for addr, cs := range p.conns {
		if !which(addr) {
			continue
		}
		// A copy: removeLocked shifts p.conns[addr] under the loop.
		for _, c := range slices.Clone(cs) {
			if c.retiring {
				continue
			}
			c.retiring = true
			if c.cc.InFlight() == 0 {
				c.closedByPool = true
				idle = append(idle, c)
				p.removeLocked(c)
			} else {
				busy = append(busy, c)
			}
		}
	}
	p.mu.Unlock()
	closeAll(idle)
	return busy
}

// gracefulDrain bounds how long requests may go on on the connections to an
// endpoint that fails /readyz but still answers (a graceful shutdown: the
// server finishes them and closes the connections itself).
var gracefulDrain = 10 * time.Second

// drainEndpoint retires the connections to addr and closes those still busy
// after gracefulDrain, connections retired before included (when another
// endpoint became preferred, or by a drain lifted when addr recovered). If
// addr went down (rather than being removed) a connection whose deadline
// comes while no other endpoint is healthy stays, checked again every
// drainRecheck: every server failing /readyz at once (etcd unavailable)
// leaves nowhere better to go, and cutting every client's watches then
// only adds a reconnection storm. It returns how many are busy.
func (p *connPool) drainEndpoint(addr string, removed bool) int {
	p.retire(func(a string) bool { return a == addr })
	p.mu.Lock()
	defer p.mu.Unlock()
	busy := p.conns[addr] // retire closed the idle ones
	for _, c := range busy {
		if c.closedByPool {
			continue
		}
		if c.drain == nil {
			c.keepAlone = !removed
			p.armDrainLocked(c, gracefulDrain)
		} else if removed {
			c.keepAlone = false
		}
	}
	return len(busy)
}

// drainRecheck is how often a drained connection kept because no other
// endpoint was healthy is looked at again.
const drainRecheck = time.Second

func (p *connPool) armDrainLocked(c *clientConn, d time.Duration) {
	// The callback takes p.mu, so it sees t assigned.
	var t *time.Timer
	t = time.AfterFunc(d, func() { p.closeDrained(c, t) })
	c.drain = t
}

// closeDrained closes c when t, its drain timer, fired.
func (p *connPool) closeDrained(c *clientConn, t *time.Timer) {
	alone := !p.pool.Healthy() // before p.mu: the pool has its own lock
	p.mu.Lock()
	if c.drain != t || c.closedByPool { // stopped (and maybe drained again) meanwhile
		p.mu.Unlock()
		return
	}
	if c.keepAlone && alone && !p.closed {
		p.armDrainLocked(c, drainRecheck)
		p.mu.Unlock()
		p.log.V(2).Info("keeping a drained connection: no other endpoint is healthy", "endpoint", c.addr)
		return
	}
	c.drain = nil
	c.closedByPool = true
	p.removeLocked(c)
	p.mu.Unlock()
	c.cc.Close()
}

func (c *clientConn) stopDrainLocked() {
	if c.drain != nil {
		c.drain.Stop()
		c.drain = nil
	}
}

// undrain lets the busy connections of a drained endpoint that is healthy
// again finish in their own time: they still take no new requests, but a
// watch on them is not cut. An etcd hiccup fails every server's /readyz at
// once; it must not cost every client its watches. A later drain of addr
// gives them a deadline again.
func (p *connPool) undrain(addr string) {
	p.mu.Lock()
	n := 0
	for _, c := range p.conns[addr] {
		if c.drain != nil {
			c.stopDrainLocked()
			n++
		}
	}
	p.mu.Unlock()
	if n > 0 {
		p.log.Info("endpoint healthy again; its retired connections may finish", "endpoint", addr, "conns", n)
	}
}

// onEvent reacts to pool changes.
func (p *connPool) onEvent(ev upstream.Event) {
	switch ev.Kind {
	case upstream.EventDown, upstream.EventRemoved:
		p.mu.Lock()
		p.gen++
		if len(p.dialing) > 0 {
			p.goneAt[ev.Addr] = p.gen
		}
		p.mu.Unlock()
		if endpoint.Graceful(ev) {
			// The server still answers, typically shutting down
			// gracefully: no new requests go there, running ones finish
			// (a POST cut here could not be retried).
			if n := p.drainEndpoint(ev.Addr, ev.Kind == upstream.EventRemoved); n > 0 {
				p.m.failover("endpoint_draining")
				p.log.Info("draining connections to endpoint", "endpoint", ev.Addr, "conns", n, "timeout", gracefulDrain)
			}
			return
		}
		if n := p.closeEndpoint(ev.Addr); n > 0 {
			p.m.failover("endpoint_" + ev.Kind.String())
			p.log.Info("closed connections to endpoint", "endpoint", ev.Addr, "reason", ev.Kind.String(), "conns", n)
		}
		// Connections that bypass the HTTP pool (rest.Config.Dial users).
		p.dialer.CloseEndpoint(ev.Addr)
	case upstream.EventPreferred:
		if ev.Prev != "" && p.pool.Usable(ev.Prev) {
			p.retireExcept(ev.Addr)
		}
	case upstream.EventUp, upstream.EventAdded:
		p.hold.OnEvent(ev)
		if ev.Kind == upstream.EventUp {
			p.undrain(ev.Addr)
		}
	}
}

// close closes every connection; later requests fail.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	var all []*clientConn
	for _, cs := range p.conns {
		for _, c := range cs {
			c.closedByPool = true
			c.stopDrainLocked()
		}
		all = append(all, cs...)
	}
	p.conns = make(map[string][]*clientConn)
	p.mu.Unlock()
	closeAll(all)
}

// conns returns the number of open connections per endpoint.
func (p *connPool) openConns() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.conns))
	for addr, cs := range p.conns {
		out[addr] = len(cs)
	}
	return out
}

// newHTTPTransport returns the http.Transport that creates our connections:
// HTTP/2 when the server offers it (HTTP/1.1 otherwise), with the HTTP/2
// health check tightened.
func newHTTPTransport(tlsConfig *tls.Config, ping, pingTimeout time.Duration, disableCompression bool) *http.Transport {
	t := &http.Transport{
		TLSClientConfig:    tlsConfig,
		DisableCompression: disableCompression,
		Protocols:          new(http.Protocols),
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: ping,
			PingTimeout:     pingTimeout,
		},
	}
	t.Protocols.SetHTTP1(true)
	if slices.Contains(tlsConfig.NextProtos, "h2") {
		t.Protocols.SetHTTP2(true)
	}
	return t
}
