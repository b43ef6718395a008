//lint:file-ignore SA1019 net/http's ClientConn (Go 1.26) has no Ping: x/net/http2's ClientConn is the one that can send a PING and wait for its answer.

package endpoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/apifailover/apifailover/internal/monotime"
	"github.com/apifailover/apifailover/internal/rawio"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Defaults of ProbeHeld's schedule, for Prober fields left zero.
const (
	// DefaultPingInterval is how often a held connection to an endpoint
	// in use (Prober.InUse) is PINGed.
	DefaultPingInterval = 250 * time.Millisecond
	// DefaultIdlePingInterval is how often a held connection to an
	// endpoint that carries connections, none of them waiting for an
	// answer, is PINGed.
	DefaultIdlePingInterval = 5 * time.Second
	// unusedPingFactor: the held connection of an endpoint that carries
	// no connection is PINGed this many times less often
	// (DefaultUnusedPingInterval, 15s, by default).
	unusedPingFactor = 3
	// DefaultUnusedPingInterval is how often a held connection to an
	// endpoint that carries no connection is PINGed, with the default
	// IdlePingInterval.
	DefaultUnusedPingInterval = unusedPingFactor * DefaultIdlePingInterval
	// DefaultReadyzInterval is how often GET /readyz is sent over a held
	// connection, whose PINGs are answered, to an endpoint in use.
	DefaultReadyzInterval = 10 * time.Second
	// idleReadyzFactor: an endpoint not in use is asked /readyz this many
	// times less often (DefaultIdleReadyzInterval, 30s, by default).
	idleReadyzFactor = 3
	// DefaultIdleReadyzInterval is how often GET /readyz is sent over the
	// held connection of an endpoint not in use, with the default
	// ReadyzInterval.
	DefaultIdleReadyzInterval = idleReadyzFactor * DefaultReadyzInterval
)

// The PING timeout's rule (see pingTimeout), the reconnect
// backoff (see heldEndpoint.failed) and when an endpoint no longer probed
// loses its connection (see heldEndpoint.idle).
const (
	pingTimeoutFloor     = 200 * time.Millisecond
	pingTimeoutCap       = 2 * time.Second
	pingConfirmMin       = 100 * time.Millisecond
	reconnectBackoffBase = 100 * time.Millisecond
	reconnectBackoffMax  = time.Second
	heldIdleMin          = 3 * time.Second
)

// ErrProberClosed is the error of a ProbeHeld probe by a Prober that was
// closed.
var ErrProberClosed = errors.New("prober closed")

// errForgotten is the error of a probe of an endpoint forgotten while it
// ran.
var errForgotten = errors.New("held connection: endpoint forgotten during the probe")

// errLost stands for a connection lost without an error of its own.
var errLost = errors.New("held connection lost")

// Reporter receives what a Prober sees between probes: failures, and the
// answer of a PING reported late. *upstream.Pool is one.
type Reporter interface {
	ReportFailure(addr string, f upstream.Failure, err error)
	ReportAnswered(addr string)
}

var _ Reporter = (*upstream.Pool)(nil)

// heldChannels are a Prober's held connections (ProbeHeld).
type heldChannels struct {
	// h2 makes the HTTP/2 client connections.
	h2 http2.Transport
	// wg counts the PING goroutines; Add only under mu while not closed.
	wg sync.WaitGroup
	// anonymousGoAway logs, once, that the servers close anonymous
	// probes' connections.
	anonymousGoAway sync.Once

	// mu guards the fields below. Lock order: heldChannels.mu, then
	// heldEndpoint.mu.
	mu     sync.Mutex
	eps    map[string]*heldEndpoint
	closed bool
}

// get returns addr's channel, a new one if it has none.
func (hc *heldChannels) get(addr string) (*heldEndpoint, error) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.closed {
		return nil, ErrProberClosed
	}
	h := hc.eps[addr]
	if h == nil {
		if hc.eps == nil {
			hc.eps = make(map[string]*heldEndpoint)
		}
		h = &heldEndpoint{addr: addr, w: newWaker()}
		hc.eps[addr] = h
	}
	return h, nil
}

// heldEndpoint is the held channel to one endpoint: its connection, if
// any, and the reconnect backoff.
type heldEndpoint struct {
	addr string
	// w is how requests reach the PING loop (Prober.Wake).
	w *waker
	// probing serializes the endpoint's probes.
	probing sync.Mutex

	// mu guards the fields below. It is never held across I/O.
	mu sync.Mutex
	// conn is the held connection, nil if none.
	conn *heldConn
	// gone: forgotten, or the Prober closed; no new connection.
	gone bool
	// fails counts connects that failed and connections lost since the
	// last successful probe; next is when the next connect may start and
	// lastErr the last failure.
	fails   int
	next    time.Time
	lastErr error
	// lastProbe and prevProbe are when the last two probes started.
	lastProbe, prevProbe time.Time
}

// probed records the start of a probe.
func (h *heldEndpoint) probed(now time.Time) {
	h.mu.Lock()
	h.prevProbe, h.lastProbe = h.lastProbe, now
	h.mu.Unlock()
}

// idle reports whether the endpoint went unprobed for 3 of its last probe
// intervals and 3 quiet intervals (the pool's interval between rounds
// while every endpoint is healthy), and at least heldIdleMin: it left the
// pool (or the pool stopped) without a Forget, and its connection is
// closed. The quiet interval counts whatever the last gap was: two probes
// a moment apart (a round a Kick brought forward, or the last fast round
// before the pool turned quiet) are followed by up to a quiet interval
// without one, and a connection closed in that gap would leave the server
// unwatched until the next round dials it again.
func (h *heldEndpoint) idle(now time.Time, quiet time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	limit := max(heldIdleMin, 3*quiet)
	if !h.prevProbe.IsZero() {
		limit = max(limit, 3*h.lastProbe.Sub(h.prevProbe))
	}
	return now.Sub(h.lastProbe) > limit
}

// failed records a failed connect, or the loss of a connection.
// Reconnects back off: the first one after a success starts at once, the
// n-th waits reconnectBackoffBase × 2^(n-2), at most reconnectBackoffMax,
// each wait spread over its upper half (equal jitter) so that the nodes
// that lost an API server do not all reconnect at the same moment. The
// pool's own probe interval paces reconnects too; the backoff keeps early
// probes (Kick) from dialing a dead server in a tight loop.
func (h *heldEndpoint) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fails++
	h.lastErr = err
	if h.fails < 2 {
		h.next = time.Time{}
		return
	}
	d := min(reconnectBackoffBase<<min(h.fails-2, 16), reconnectBackoffMax)
	h.next = time.Now().Add(d/2 + rand.N(d/2+1))
}

// succeeded records a successful probe: the backoff starts over.
func (h *heldEndpoint) succeeded() {
	h.mu.Lock()
	h.fails, h.next, h.lastErr = 0, time.Time{}, nil
	h.mu.Unlock()
}

// waitBackoff waits until the endpoint may be dialed again. If that is
// beyond half of what remains of ctx, it fails at once instead with the
// last failure, so that the probe reports what is known without dialing.
func (h *heldEndpoint) waitBackoff(ctx context.Context) error {
	h.mu.Lock()
	wait, last := time.Until(h.next), h.lastErr
	h.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok && wait > time.Until(deadline)/2 {
		return fmt.Errorf("held connection: reconnecting in %v after: %w", wait.Round(time.Millisecond), last)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dropped clears the endpoint's connection if it is c (closed); err, if
// not nil, is why it was lost.
func (h *heldEndpoint) dropped(c *heldConn, err error) {
	h.mu.Lock()
	if h.conn == c {
		h.conn = nil
	}
	h.mu.Unlock()
	if err != nil {
		h.failed(err)
	}
}

// forget closes the endpoint's connection and keeps it from opening
// another.
func (h *heldEndpoint) forget() {
	h.mu.Lock()
	h.gone = true
	c := h.conn
	h.conn = nil
	h.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// heldConn is one held HTTP/2 connection.
type heldConn struct {
	h   *heldEndpoint
	cc  *http2.ClientConn
	raw net.Conn
	w   *watchedConn
	// gen is the generation of the CA and client certificate files the
	// connection was verified with.
	gen uint64
	// connect is how long the TCP connect took: the first RTT sample.
	connect time.Duration
	// ctx is cancelled when the connection is closed.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
	// retired is closed (retire) when a probe found the connection
	// unusable and opens another.
	retired    chan struct{}
	retireOnce sync.Once
	// lastAck is when a PING was last answered (monotime).
	lastAck atomic.Int64
	// readyAt is when GET /readyz last answered 200 over the connection
	// (monotime); zero if never.
	readyAt atomic.Int64
	// late is set while a PING is unanswered past its timeout.
	late atomic.Bool
	// srtt is the PINGs' smoothed round trip, in nanoseconds.
	srtt atomic.Int64
}

// fresh reports whether c vouches for its server without a request: it
// is open, its PINGs are answered in time, and /readyz answered 200 on
// it less than every ago.
func (c *heldConn) fresh(now time.Time, every time.Duration) bool {
	ready := c.readyAt.Load()
	return c.ctx.Err() == nil && !c.late.Load() && ready != 0 && now.Sub(monotime.Time(ready)) < every
}

// usable reports whether c may still carry a probe, or vouch for its
// server without one (fresh): the Prober did not close it, it was not
// lost, and its HTTP/2 client takes new requests (no GOAWAY received, not
// closed). One that is not is left to watchHeld, which ends it and
// reports why, but may not have seen it yet: until then, a probe took it
// for fresh and answered for a server it no longer heard from (a
// kube-apiserver that closes each anonymous connection, or one that
// reset it). CanTakeNewRequest takes the client's lock only, not the
// write lock a write stuck on a frozen server holds, as State does.
func (c *heldConn) usable() bool {
	select {
	case <-c.w.lost:
		return false
	default:
	}
	return c.ctx.Err() == nil && c.cc.CanTakeNewRequest()
}

// retire ends c's watch (pingLoop.retired).
func (c *heldConn) retire() { c.retireOnce.Do(func() { close(c.retired) }) }

// close closes the connection; the TCP connection first, so that nothing
// waits on a peer that does not read.
func (c *heldConn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		c.raw.Close()
		c.cc.Close()
	})
}

// watchedConn is the TLS connection under a held HTTP/2 connection: its
// first read error (the HTTP/2 client always reads) closes lost.
type watchedConn struct {
	net.Conn
	tls  *tls.Conn
	once sync.Once
	lost chan struct{}
	err  error // why; set before lost is closed
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() {
			c.err = err
			close(c.lost)
		})
	}
	return n, err
}

// ConnectionState is the TLS state, for the HTTP/2 client.
func (c *watchedConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

func (c *watchedConn) lostErr() error {
	select {
	case <-c.lost:
		if c.err != nil {
			return c.err
		}
	default:
	}
	return errLost
}

// probeHeld is Probe for ProbeHeld over addr's held connection, opened
// first if there is none (or it was verified with CA or client
// certificate files that changed since): GET /readyz, unless /readyz
// answered 200 on the connection less than ReadyzInterval ago and its
// PINGs are answered in time, which then vouch for the server with no
// request at all. The round trip is the PINGs' (see ProbeRTT). A probe
// that fails other than by an answer of the server (a ReadyzError with a
// status) closes the connection; a new connection always gets a GET
// /readyz first. The probe of a suspect endpoint (upstream.Suspected)
// first checks a new connection as ProbeReadyz does: what made it suspect
// were new connections failing or staying silent, which the held one,
// still answering PINGs, cannot vouch against.
func (p *Prober) probeHeld(ctx context.Context, addr string) (time.Duration, error) {
	h, err := p.held.get(addr)
	if err != nil {
		return 0, err
	}
	if upstream.Suspected(ctx) {
		if err := p.probeFresh(ctx, addr); err != nil {
			return 0, err
		}
	}
	h.probing.Lock()
	defer h.probing.Unlock()
	now := time.Now()
	h.probed(now)
	c, err := p.heldConn(ctx, h)
	if c == nil {
		return 0, err
	}
	if c.fresh(now, p.readyzEvery(addr)) {
		return time.Duration(c.srtt.Load()), nil
	}
	err = p.readyzHeld(ctx, c)
	var re *ReadyzError
	switch {
	case err == nil:
		c.readyAt.Store(monotime.Now())
		h.succeeded()
		return time.Duration(c.srtt.Load()), nil
	case errors.As(err, &re) && !re.TimedOut:
		// The server answered over the connection: it works.
	default:
		c.close()
		h.dropped(c, err)
	}
	return 0, err
}

// DefaultQuietInterval is the pool's interval between probe rounds
// (upstream.Config.QuietInterval) while every endpoint is healthy, with
// held probes: their connections report failures as they happen, so a
// round every second would only confirm them, and wake the client.
const DefaultQuietInterval = 5 * time.Second

// QuietInterval is the upstream.Config.QuietInterval that suits p's
// mode: with ProbeHeld DefaultQuietInterval, or ReadyzInterval if that is
// shorter (a round asks /readyz when it is due); none otherwise (every
// round is a check). Zero for a nil Prober.
func (p *Prober) QuietInterval() time.Duration {
	if p == nil || p.Mode != ProbeHeld {
		return 0
	}
	return min(DefaultQuietInterval, OrDefault(p.ReadyzInterval, DefaultReadyzInterval))
}

// readyzEvery is how often GET /readyz goes over addr's held connection:
// ReadyzInterval while addr is in use (or without InUse),
// IdleReadyzInterval (never more often) otherwise. An endpoint that comes
// into use is thus asked at its first probe once its last answer is
// older than ReadyzInterval.
func (p *Prober) readyzEvery(addr string) time.Duration {
	every := OrDefault(p.ReadyzInterval, DefaultReadyzInterval)
	if p.InUse == nil || p.InUse(addr) {
		return every
	}
	return max(OrDefault(p.IdleReadyzInterval, idleReadyzFactor*every), every)
}

// heldConn returns h's connection, opening one if needed. It returns nil
// and the probe's result if the server does not speak HTTP/2 and was
// probed over HTTP/1.1 instead.
func (p *Prober) heldConn(ctx context.Context, h *heldEndpoint) (*heldConn, error) {
	h.mu.Lock()
	c, gone := h.conn, h.gone
	h.mu.Unlock()
	if gone {
		return nil, errForgotten
	}
	if c != nil && c.gen != p.files.generation() {
		c.close()
		h.dropped(c, nil)
		c = nil
	}
	if c != nil && c.usable() {
		return c, nil
	}
	if c != nil {
		// Its watch may not have seen why yet: it ends now, reporting
		// that, and leaves the endpoint's waker to the new connection's.
		c.retire()
	}
	return p.connectHeld(ctx, h)
}

// connectHeld opens h's connection: TCP, then TLS as ProbeReadyz does it
// (offering h2), then HTTP/2, within ctx; and starts its PINGs.
func (p *Prober) connectHeld(ctx context.Context, h *heldEndpoint) (*heldConn, error) {
	if err := h.waitBackoff(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	raw, err := p.dial(ctx, h.addr)
	if err != nil {
		h.failed(err)
		return nil, err
	}
	// Its PINGs' reads and writes, as raw system calls, do not wake Go's
	// sysmon (see rawio).
	raw = rawio.Wrap(raw)
	connect := time.Since(start)
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	gen := p.files.generation()
	tc, err := p.handshake(ctx, h.addr, raw, []string{"h2", "http/1.1"})
	if err != nil {
		raw.Close()
		h.failed(err)
		return nil, err
	}
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		defer raw.Close()
		return nil, p.readyz(ctx, tc)
	}
	w := &watchedConn{Conn: tc, tls: tc, lost: make(chan struct{})}
	cc, err := p.held.h2.NewClientConn(w)
	if err != nil {
		raw.Close()
		h.failed(err)
		return nil, fmt.Errorf("http2: %w", err)
	}
	raw.SetDeadline(time.Time{})
	c := &heldConn{h: h, cc: cc, raw: raw, w: w, gen: gen, connect: connect, retired: make(chan struct{})}
	c.srtt.Store(int64(connect))
	c.ctx, c.cancel = context.WithCancel(context.Background())

	p.held.mu.Lock()
	if p.held.closed {
		p.held.mu.Unlock()
		c.close()
		return nil, ErrProberClosed
	}
	h.mu.Lock()
	if h.gone {
		h.mu.Unlock()
		p.held.mu.Unlock()
		c.close()
		return nil, errForgotten
	}
	h.conn = c
	h.mu.Unlock()
	p.held.wg.Add(1)
	p.held.mu.Unlock()
	go p.watchHeld(c)
	return c, nil
}

// readyzHeld sends GET /readyz over c.
func (p *Prober) readyzHeld(ctx context.Context, c *heldConn) error {
	req, err := p.readyzRequest(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	resp, err := c.cc.RoundTrip(req)
	if err != nil {
		heard := false
		if p.Heard != nil {
			_, heard = p.Heard(c.h.addr, time.Since(start))
		}
		return c.requestFailed(err, start, heard)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeResponse))
	if resp.StatusCode != http.StatusOK {
		return &ReadyzError{Status: resp.StatusCode, Body: firstLine(string(body))}
	}
	return nil
}

// requestFailed is the error of a GET /readyz sent at start that got no
// answer. A server that answered a PING since, or sent data on a client
// connection since (heard: a busy PING waits while it does, see
// heardWait), but did not answer the request is up but not ready (a
// ReadyzError if it timed out, as with ProbeReadyz): kube-apiserver
// waiting for etcd serves reads from its cache. One that did neither, or
// lost the connection, is not.
func (c *heldConn) requestFailed(err error, start time.Time, heard bool) error {
	select {
	case <-c.w.lost:
		return fmt.Errorf("GET /readyz: held connection lost: %w", err)
	default:
	}
	if heard || c.lastAck.Load() > monotime.Of(start) {
		return readyzFailed(err)
	}
	return fmt.Errorf("GET /readyz: no answer, nor to a PING, in time: %w", err)
}

// heldEnded, if set (tests), runs in watchHeld between the end of a held
// connection's PING loop and its close.
var heldEnded atomic.Pointer[func()]

// watchHeld sends c's PINGs until c is closed, fails, or its endpoint is
// no longer probed. A PING unanswered past its timeout is reported at once
// (and its late answer too); a failure ends the connection and is
// reported, unless c was closed by the Prober meanwhile.
func (p *Prober) watchHeld(c *heldConn) {
	defer p.held.wg.Done()
	addr := c.h.addr
	l := &pingLoop{
		interval:     OrDefault(p.PingInterval, DefaultPingInterval),
		idleInterval: OrDefault(p.IdlePingInterval, DefaultIdlePingInterval),
		unusedInterval: OrDefault(p.UnusedPingInterval,
			unusedPingFactor*OrDefault(p.IdlePingInterval, DefaultIdlePingInterval)),
		ping:    c.cc.Ping,
		lost:    c.w.lost,
		retired: c.retired,
		lostErr: c.w.lostErr,
		acked: func(t time.Time, srtt time.Duration) {
			c.lastAck.Store(monotime.Of(t))
			c.srtt.Store(int64(srtt))
		},
		late: func(err error) {
			c.late.Store(true)
			if p.Reporter != nil {
				p.Reporter.ReportFailure(addr, upstream.FailureConnLost, err)
			}
		},
		answered: func() {
			c.late.Store(false)
			if p.Reporter != nil {
				p.Reporter.ReportAnswered(addr)
			}
		},
		// A GOAWAY ends the connection: kube-apiserver sends one when its
		// shutdown delay is over (and, with --goaway-chance, now and then
		// on a request to rebalance connections). The next probe
		// reconnects and tells which.
		goingAway: func() bool { return c.cc.State().Closing },
		// No probe for long ends it quietly.
		stop: func(now time.Time) bool { return c.h.idle(now, p.QuietInterval()) },
	}
	busy := p.Busy
	if busy == nil {
		busy = p.InUse
	}
	if busy != nil {
		l.busy = func() bool { return busy(addr) }
		l.w = c.h.w
		defer c.h.w.awake.Store(false)
	}
	if p.Heard != nil {
		l.heard = func(within time.Duration) (time.Duration, bool) { return p.Heard(addr, within) }
	}
	if p.InUse != nil {
		l.inUse = func() bool { return p.InUse(addr) }
	}
	l.rtt.Sample(c.connect)
	p.Logger.V(2).Info("held connection opened", "addr", addr, "connect", c.connect)
	f, err := l.run(c.ctx)
	closedByProber := c.ctx.Err() != nil
	if f := heldEnded.Load(); f != nil {
		(*f)()
	}
	c.close()
	p.Logger.V(2).Info("held connection closed", "addr", addr, "byProber", closedByProber, "failure", f.String(), "err", err)
	if f == upstream.FailureGoAway && p.Credentials() == "none" {
		// kube-apiserver closes HTTP/2 connections after an anonymous
		// request (UnauthenticatedHTTP2DOSMitigation, on by default
		// since 1.29): every anonymous probe sends one, so this GOAWAY
		// says nothing about the server.
		p.held.anonymousGoAway.Do(func() {
			p.Logger.Info("API servers close the held probe connections after each anonymous GET /readyz (kube-apiserver's UnauthenticatedHTTP2DOSMitigation); "+
				"every probe reconnects, as with the readyz probe, and a hung server is not seen between probes. Give the probes credentials to hold the connections", "addr", addr)
		})
		f = 0
	}
	if f == 0 || closedByProber {
		c.h.dropped(c, nil)
		return
	}
	if f == upstream.FailureGoAway {
		c.h.dropped(c, nil)
	} else {
		c.h.dropped(c, err)
	}
	if p.Reporter != nil {
		p.Reporter.ReportFailure(addr, f, err)
	}
}

// pingLoop is the PING schedule of one held connection.
type pingLoop struct {
	// interval is the time between PINGs while busy (if set) says the
	// endpoint has requests waiting for an answer, or with no busy;
	// idleInterval otherwise, and unusedInterval while inUse (if set)
	// says it carries no connection at all.
	interval, idleInterval, unusedInterval time.Duration
	busy, inUse                            func() bool
	// heard, if set, reports whether the server sent data on a client
	// connection less than within ago, and how long ago: a busy PING
	// waits until it has not for interval (see heardWait).
	heard func(within time.Duration) (time.Duration, bool)
	// w, if set, tells the loop of requests sent (see waker).
	w *waker
	// idle: the loop waits idleInterval; last: when the last PING went.
	idle bool
	last time.Time
	ping func(context.Context) error
	// lost is closed when the connection breaks, for lostErr.
	lost    <-chan struct{}
	lostErr func() error
	// retired is closed when a probe found the connection unusable (it
	// went away, or was lost, before the loop saw it) and opened
	// another: the loop ends as for a lost connection, so that it runs
	// beside the new one's on the endpoint's waker no longer than that.
	retired <-chan struct{}
	// acked, if set, is told when a PING is answered and the smoothed
	// round trip after it.
	acked func(t time.Time, srtt time.Duration)
	// late, if set, is told when a PING is unanswered past its timeout;
	// answered when such a PING is answered after all.
	late     func(error)
	answered func()
	// goingAway, if set, reports whether the server sent GOAWAY; it is
	// asked after each answered PING and when the connection is lost: if
	// so, the loop ends with FailureGoAway.
	goingAway func() bool
	// stop, if set, is asked after each answered PING whether to end
	// the loop with nothing to report.
	stop func(time.Time) bool
	rtt  RTTEstimator
}

// run sends PINGs until one is not answered in time or the connection is
// lost or the server sent GOAWAY (the failure to report is returned), or
// ctx is done or stop says so (zero). While the endpoint is busy (or with
// no busy) a PING goes every interval (±10%) after the last answer,
// otherwise every idleInterval (unusedInterval with no connection); a
// wake during an idle wait brings the next PING forward to interval after
// the last one (at once if that has passed), and a request sent since the
// last PING went keeps the loop busy for one more (see waker). Each PING
// has two deadlines: the timeout of rtt, past which it is reported late
// (see late), and a confirmation timeout past which the connection counts
// as lost (see confirmTimeout).
func (l *pingLoop) run(ctx context.Context) (upstream.Failure, error) {
	t := time.NewTimer(l.next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, nil
		case <-l.lost:
			return l.lostFailure()
		case <-l.retired:
			return l.lostFailure()
		case <-l.w.woken():
			if l.idle {
				l.idle = false
				l.w.setAwake(true)
				t.Reset(max(l.interval-time.Since(l.last), 0))
			}
			continue
		case <-t.C:
		}
		if wait, ok := l.heardWait(); ok {
			t.Reset(wait)
			continue
		}
		l.last = time.Now()
		l.w.pinged()
		f, err := l.pingOnce(ctx)
		if f != 0 || err != nil || ctx.Err() != nil {
			return f, err
		}
		now := time.Now()
		if l.goingAway != nil && l.goingAway() {
			return upstream.FailureGoAway, errors.New("held connection: the server sent GOAWAY")
		}
		if l.stop != nil && l.stop(now) {
			return 0, nil
		}
		t.Reset(l.next())
	}
}

// heardSkips: a busy PING goes at least every heardSkips PingIntervals
// (1s by default), however recently the server was heard: data in its
// kernel's send buffer still arrives after the process froze.
const heardSkips = 4

// heardWait is how long a busy PING that is due waits, ok false if it
// goes now: the server sent data on a client connection less than
// interval ago, which says as much as an answered PING would, so the
// PING waits until that data is interval old. The loop stays busy
// meanwhile: only a PING's end asks Busy again, since data that arrives
// in the same millisecond as a request, or after it, makes a request
// that waits look answered (a server that froze after it gets its PING
// interval after its last data). The idle PINGs always go, and a busy
// one goes at least every heardSkips intervals (or IdlePingInterval if
// shorter), which also keeps the connection and its round-trip time
// fresh.
func (l *pingLoop) heardWait() (time.Duration, bool) {
	if l.idle || l.heard == nil || time.Since(l.last) >= min(max(l.idleInterval, l.interval), heardSkips*l.interval) {
		return 0, false
	}
	ago, heard := l.heard(l.interval)
	if !heard || ago < 0 || ago >= l.interval {
		return 0, false
	}
	return l.interval - ago, true
}

// next is the wait until the next PING; it sets idle and awake. A
// request sent since the last PING went keeps the loop busy whatever busy
// says (see waker.asked).
func (l *pingLoop) next() time.Duration {
	l.w.setAwake(false)
	l.idle = l.busy != nil && !l.w.askedSincePing() && !l.busy()
	l.w.setAwake(!l.idle)
	switch {
	case !l.idle:
		return spread(l.interval)
	case l.inUse != nil && !l.inUse():
		return spread(max(l.unusedInterval, l.idleInterval, l.interval))
	}
	return spread(max(l.idleInterval, l.interval))
}

// pingOnce sends one PING and waits for its answer: past the timeout of
// rtt it calls late (once), and past confirmTimeout it gives up with
// FailureConnLost; an answer after late calls answered.
func (l *pingLoop) pingOnce(ctx context.Context) (upstream.Failure, error) {
	timeout := pingTimeout(&l.rtt)
	confirm := confirmTimeout(timeout)
	var (
		mu         sync.Mutex
		done, late bool
	)
	lateTimer := time.AfterFunc(timeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		late = true
		if l.late != nil {
			l.late(fmt.Errorf("held connection: PING unanswered within %v", timeout))
		}
	})
	pctx, cancel := context.WithTimeout(ctx, confirm)
	start := time.Now()
	err := l.ping(pctx)
	cancel()
	now := time.Now()
	mu.Lock()
	done = true
	wasLate := late
	mu.Unlock()
	lateTimer.Stop()
	switch {
	case ctx.Err() != nil:
		return 0, nil
	case err != nil:
		select {
		case <-l.lost:
			return l.lostFailure()
		default:
		}
		return upstream.FailureConnLost, fmt.Errorf("held connection: PING unanswered within %v: %w", confirm, err)
	}
	l.rtt.Sample(now.Sub(start))
	if l.acked != nil {
		l.acked(now, l.rtt.srtt)
	}
	if wasLate && l.answered != nil {
		l.answered()
	}
	return 0, nil
}

// lostFailure is the failure to report for a lost connection:
// FailureGoAway if the server sent GOAWAY first.
func (l *pingLoop) lostFailure() (upstream.Failure, error) {
	if l.goingAway != nil && l.goingAway() {
		return upstream.FailureGoAway, errors.New("held connection: the server sent GOAWAY and closed it")
	}
	return upstream.FailureConnLost, fmt.Errorf("held connection lost: %w", l.lostErr())
}

// spread spreads d by ±10%.
func spread(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*2-1)*0.1*float64(d))
}

// pingTimeout is how long a PING may go unanswered before the connection
// counts as lost: the RTTEstimator rule between pingTimeoutFloor (200ms,
// which keeps a near server's scheduling hiccups and this host's from
// counting) and pingTimeoutCap (2s). A far server (300ms away) thus gets
// about 600ms, a near one 200ms.
func pingTimeout(e *RTTEstimator) time.Duration { return e.Timeout(pingTimeoutFloor, pingTimeoutCap) }

// confirmTimeout is how long a PING whose timeout is timeout may go
// unanswered before the connection counts as lost: half as long again,
// and at least pingConfirmMin (100ms) more. Past the timeout the PING is
// reported late: one failure towards the pool's Fall, the endpoint
// suspect; past the confirmation, a second. With the pool's default Fall
// of 2, a near server that stops answering is down 300ms after the PING
// it left unanswered, one that was only slow for a moment stays up.
func confirmTimeout(timeout time.Duration) time.Duration {
	return timeout + max(pingConfirmMin, timeout/2)
}

// Forget closes the held connection to addr (ProbeHeld) and drops its
// TLS session, for an endpoint removed from the pool (on
// upstream.EventRemoved); a later probe of addr starts over. It does not
// wait for the connection's goroutine (Close does) and does nothing on a
// nil Prober. An endpoint that is no longer probed, and not forgotten,
// loses its connection after 3 of its probe intervals, and at least 3s.
func (p *Prober) Forget(addr string) {
	if p == nil {
		return
	}
	p.sessions.Delete(addr)
	p.held.mu.Lock()
	h := p.held.eps[addr]
	delete(p.held.eps, addr)
	p.held.mu.Unlock()
	if h != nil {
		h.forget()
	}
}

// Wake tells the held connection of addr (ProbeHeld), if any, that addr
// may have come into use (see InUse), so that its PINGs go every
// PingInterval from now on rather than from its next idle PING: at least
// one PING goes after each Wake. Call it once a request's bytes were
// written, so that the PING follows the request (the transport does for
// HTTP/2; see its traceWrites). It does not block, and does nothing on a
// nil Prober.
func (p *Prober) Wake(addr string) {
	if p == nil {
		return
	}
	p.held.mu.Lock()
	h := p.held.eps[addr]
	p.held.mu.Unlock()
	if h != nil {
		h.w.wake()
	}
}

// waker is how the requests to an endpoint reach its PING loop: a
// request sent to a frozen server is to be followed by a PING within
// PingInterval, which is left unanswered.
type waker struct {
	// ch tells an idle loop that a request was just sent: its next PING
	// goes at once, or interval after the last one.
	ch chan struct{}
	// awake is true while the loop is not idle: a request sends nothing
	// on ch, and the loop's goroutine is not scheduled once per request.
	awake atomic.Bool
	// asked is set by each request and cleared as a PING goes. The loop
	// that asks whether to go idle after a PING (pingLoop.next) stays
	// busy for one more PING while it is set: the Busy it asks as well
	// cannot see every request, since the kernel's data clocks count in
	// jiffies and a request sent in the same jiffy as the last answer
	// came looks answered. Without asked, a request sent to a server
	// that froze while a PING was out went unwatched until the idle
	// PING, 5s on.
	asked atomic.Bool
}

func newWaker() *waker { return &waker{ch: make(chan struct{}, 1)} }

// wake records a request sent and wakes the loop if it is idle. asked is
// set before awake is read, and next clears awake before it reads
// asked: either the loop sees the request or this sees the loop idle.
func (w *waker) wake() {
	if !w.asked.Load() {
		w.asked.Store(true)
	}
	if w.awake.Load() {
		return
	}
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// woken is the channel an idle loop waits on; nil (never ready) on a nil
// waker.
func (w *waker) woken() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.ch
}

// setAwake sets awake; nothing on a nil waker.
func (w *waker) setAwake(v bool) {
	if w != nil {
		w.awake.Store(v)
	}
}

// pinged clears asked as a PING goes: that PING follows every request
// whose Wake came so far (a caller wakes once the request was written).
func (w *waker) pinged() {
	if w != nil && w.asked.Load() {
		w.asked.Store(false)
	}
}

// askedSincePing reports whether a request was sent since the last PING
// went; false on a nil waker.
func (w *waker) askedSincePing() bool { return w != nil && w.asked.Load() }

// Close closes the held connections (ProbeHeld) and waits for their
// goroutines; later ProbeHeld probes fail with ErrProberClosed. Call it
// once the pool's Run has returned; not from a pool subscriber. It does
// nothing more on a Prober of another mode, or a nil one, and may be
// called again.
func (p *Prober) Close() {
	if p == nil {
		return
	}
	p.held.mu.Lock()
	p.held.closed = true
	eps := p.held.eps
	p.held.eps = nil
	p.held.mu.Unlock()
	for _, h := range eps {
		h.forget()
	}
	p.held.wg.Wait()
}
