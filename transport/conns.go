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

	// conns holds the open connections by endpoint and drains or closes
	// those of an endpoint that goes down or is removed.
	conns *endpoint.Registry[*clientConn]
	// hold makes new requests fail at once for a while after a dial that
	// tried every endpoint failed.
	hold endpoint.Holdoff
	// wakes: the prober holds a connection to each endpoint, whose PINGs
	// each request wakes (clientConn.wake).
	wakes bool

	// mu guards the fields below and the clientConns' fields it names.
	// Lock order: mu, then the registry's lock; mu is not held while
	// calling the pool or a connection's methods (Reserve may run the
	// state hook, which takes mu).
	mu      sync.Mutex
	dialing map[string]*dialCall // in-flight dials by first candidate
	closed  bool
}

// clientConn is one connection to one endpoint.
type clientConn struct {
	cc   *http.ClientConn
	addr string
	conn net.Conn // for httptrace.GotConnInfo
	used atomic.Bool
	p    *connPool
	// wake, if set, is the trace whose WroteHeaders each request calls
	// once its header block was written (see traceWrites): the held
	// connection of its server is PINGed soon and while it waits
	// (endpoint.Registry.Wake). Nil unless the prober holds connections
	// (endpoint.ProbeHeld).
	wake *httptrace.ClientTrace
	// Guarded by p.mu.
	retiring     bool
	closedByPool bool
	lastInFlight int
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

// newConnPool returns the connection pool; gracefulDrain bounds the drain
// of a server that fails /readyz but still answers (see endpoint.Registry).
// prober's held probe connections follow which endpoints carry
// connections (see RegistryConfig.Prober).
func newConnPool(ctx context.Context, pool *upstream.Pool, d *endpoint.Dialer, t *http.Transport, origin string, gracefulDrain time.Duration, log logr.Logger, m *metrics, prober *endpoint.Prober) *connPool {
	p := &connPool{
		pool:    pool,
		dialer:  d,
		t:       t,
		origin:  origin,
		ctx:     ctx,
		log:     log,
		m:       m,
		dialing: make(map[string]*dialCall),
		wakes:   prober != nil && prober.Mode == endpoint.ProbeHeld,
	}
	p.conns = endpoint.NewRegistry[*clientConn](endpoint.RegistryConfig{
		Healthy:       pool.Healthy,
		GracefulDrain: gracefulDrain,
		Logger:        log,
		Prober:        prober,
	})
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
// the connection the dial opened, whichever endpoint won the race but one
// it excludes (a dial another request started has its candidates): a slow
// first candidate may lose every race, and the pool demotes it only after
// a few (see upstream.Pool.ReportDialRace).
func (p *connPool) get(ctx context.Context, exclude map[string]bool) (*clientConn, error) {
	for {
		// A dial started below refuses its connection if its endpoint
		// goes away after this mark.
		mark := p.conns.Begin()
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
			p.conns.End()
			return nil, fmt.Errorf("%w: every endpoint was tried", endpoint.ErrUnreachable)
		}
		first := cands[0]
		if c := p.reserve(first); c != nil {
			p.conns.End()
			return c, nil
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			p.conns.End()
			return nil, errClosed
		}
		call := p.dialing[first]
		if call == nil {
			if err := p.hold.Err(); err != nil && len(exclude) == 0 {
				p.mu.Unlock()
				p.conns.End()
				return nil, err
			}
			call = &dialCall{done: make(chan struct{})}
			p.dialing[first] = call
			go p.dial(first, cands, len(exclude) == 0, p.hold.Round(), mark, call) // ends mark
		} else {
			p.conns.End()
		}
		p.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil {
				return nil, call.err
			}
			// Another request's dial, with its own candidates, may have
			// connected to an endpoint this one excludes.
			if call.c != nil && !exclude[call.c.addr] && p.reserveConn(call.c) {
				return call.c, nil
			}
			// Taken (HTTP/1.1 serves one request at a time), discarded,
			// or excluded: look again.
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// SinceData tells how long ago the connection last sent and received
// data (endpoint.Registry.Busy).
func (c *clientConn) SinceData() (sent, recv time.Duration, ok bool) {
	if c.conn == nil {
		return 0, 0, false
	}
	return endpoint.SinceData(c.conn)
}

// SinceHeard tells how long ago the server last sent the connection
// data, false if it never did (endpoint.Registry.Heard).
func (c *clientConn) SinceHeard() (time.Duration, bool) {
	if c.conn == nil {
		return 0, false
	}
	return endpoint.SinceHeard(c.conn)
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
	for _, c := range p.conns.Conns(addr) {
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
			return false
		}
		return true
	}
	if c.cc.Err() != nil || c.cc.InFlight() == 0 {
		// Closed, or unusable while idle (GOAWAY): drop it.
		p.mu.Lock()
		c.closedByPool = true
		p.mu.Unlock()
		p.conns.Remove(c.addr, c)
		c.cc.Close()
	}
	return false
}

// dial opens a connection to the first answering candidate and adds it to
// the pool. all says whether cands is every endpoint of the pool; round
// is the holdoff round it belongs to (endpoint.Holdoff.Round); mark is the
// registry's (Registry.Begin), which dial ends.
func (p *connPool) dial(first string, cands []string, all bool, round, mark uint64, call *dialCall) {
	defer p.conns.End()
	plan := &dialPlan{candidates: cands}
	ctx := context.WithValue(p.ctx, dialPlanKey{}, plan)
	cc, err := p.t.NewClientConn(ctx, "https", p.origin)
	p.mu.Lock()
	delete(p.dialing, first)
	if err == nil && p.closed {
		err = errClosed
		cc.Close()
	}
	var c *clientConn
	gone := false
	if err == nil {
		c = &clientConn{cc: cc, addr: plan.addr, conn: plan.conn, p: p}
		if p.wakes {
			addr := plan.addr
			c.wake = &httptrace.ClientTrace{WroteHeaders: func() { p.conns.Wake(addr) }}
		}
		gone = !p.conns.Add(plan.addr, c, mark)
	}
	switch {
	case err == nil:
		p.hold.End()
	case all && !errors.Is(err, errClosed):
		p.hold.Failed(round, err)
	}
	switch {
	case gone:
		// Its endpoint went down or was removed while it connected; the
		// waiters look again.
		c = nil
		p.log.V(2).Info("discarding a connection whose endpoint went away while it was dialed", "endpoint", plan.addr)
	case err == nil:
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
	forget, closeNow := false, false
	switch {
	case err != nil:
		lost = !c.closedByPool && c.lastInFlight > 0
		forget = true
	case inflight == 0 && (c.retiring || p.idleLocked(c.addr) > maxIdlePerEndpoint):
		c.closedByPool = true
		forget, closeNow = true, true
	}
	c.lastInFlight = inflight
	p.mu.Unlock()
	if forget {
		p.conns.Remove(c.addr, c)
	}
	if closeNow {
		cc.Close()
	}
	if lost {
		p.pool.ReportFailure(c.addr, upstream.FailureConnLost, fmt.Errorf("connection lost: %w", err))
	}
}

func (p *connPool) idleLocked(addr string) int {
	n := 0
	for _, c := range p.conns.Conns(addr) {
		if c.cc.InFlight() == 0 {
			n++
		}
	}
	return n
}

// Retire makes c take no new requests; it closes once its running requests
// are done, at once if there are none (endpoint.Conn).
func (c *clientConn) Retire() {
	p := c.p
	p.mu.Lock()
	if c.retiring || c.closedByPool {
		p.mu.Unlock()
		return
	}
	c.retiring = true
	idle := c.cc.InFlight() == 0
	if idle {
		c.closedByPool = true
	}
	p.mu.Unlock()
	if idle {
		p.conns.Remove(c.addr, c)
		c.cc.Close()
	}
}

// Close closes c now, for the pool (endpoint.Conn): its loss is not
// reported as a failure.
func (c *clientConn) Close() {
	c.p.mu.Lock()
	c.closedByPool = true
	c.p.mu.Unlock()
	c.cc.Close()
}

// retire stops new requests on the connections to the endpoints which
// matches; each closes when its running requests are done.
func (p *connPool) retire(which func(addr string) bool) int {
	return p.conns.Retire(which)
}

// onEvent reacts to pool changes.
func (p *connPool) onEvent(ev upstream.Event) {
	switch ev.Kind {
	case upstream.EventDown, upstream.EventRemoved:
		// A server that still answers (typically shutting down
		// gracefully) is drained: no new requests go there, running
		// ones finish (a POST cut here could not be retried). The
		// others' connections are closed at once.
		out := p.conns.OnEvent(ev)
		if out.Drained > 0 {
			p.m.failover("endpoint_draining")
		}
		if out.Closed > 0 {
			p.m.failover("endpoint_" + ev.Kind.String())
		}
	case upstream.EventPreferred:
		if ev.Prev != "" && p.pool.Usable(ev.Prev) {
			p.retire(func(addr string) bool { return addr != ev.Addr })
		}
	case upstream.EventUp, upstream.EventAdded:
		p.hold.OnEvent(ev)
		p.conns.OnEvent(ev)
	}
}

// close closes every connection; later requests fail.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.conns.Close()
}

// openConns returns the number of open connections per endpoint.
func (p *connPool) openConns() map[string]int { return p.conns.Counts() }

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
