package endpoint

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/upstream"
)

// Dialer defaults.
const (
	DefaultStaggerDelay   = 250 * time.Millisecond
	DefaultAttemptTimeout = 2 * time.Second
	DefaultDialTimeout    = 10 * time.Second
	DefaultKeepAlive      = 5 * time.Second
	DefaultUserTimeout    = 10 * time.Second
)

// ErrUnreachable is returned (joined with every attempt's error) when no
// endpoint could be connected to.
var ErrUnreachable = errors.New("no endpoint could be reached")

// Dialer connects to the best endpoints of a pool: staggered parallel
// attempts in candidate order, first to connect wins, the rest are closed.
// The pool counts the connections it opens (upstream.Pool.ConnOpened) until
// they are closed; the front ends keep them by endpoint in a Registry.
type Dialer struct {
	// Pool supplies the candidates and receives passive failures.
	Pool *upstream.Pool
	// TLSConfig, if set, makes every attempt include the TLS handshake, so
	// that a server that accepts TCP but never answers loses the race. Its
	// ServerName must be the origin's name.
	TLSConfig *tls.Config
	// GetTLSConfig, if set, is called for every handshake and its result
	// used instead of TLSConfig, which must be set too (e.g. a clone whose
	// RootCAs follow a CA file as it rotates).
	GetTLSConfig func() *tls.Config
	// StaggerDelay is how long an attempt may run before the next candidate
	// is tried in parallel. A failed attempt starts the next one at once.
	// If zero, DefaultStaggerDelay (250ms). If negative, all candidates are
	// tried at once.
	StaggerDelay time.Duration
	// AttemptTimeout bounds one attempt (TCP connect and TLS handshake). If
	// zero, DefaultAttemptTimeout (2s).
	AttemptTimeout time.Duration
	// Timeout bounds a whole DialAny. If zero, DefaultDialTimeout (10s).
	Timeout time.Duration
	// KeepAlive is the TCP keepalive idle time and probe interval. If zero,
	// DefaultKeepAlive (5s). If negative, keepalive is off.
	KeepAlive time.Duration
	// UserTimeout is TCP_USER_TIMEOUT (Linux). If zero, DefaultUserTimeout
	// (10s). If negative, the system default.
	UserTimeout time.Duration
	// Go, if set, starts each attempt's goroutine (see workers.Pool.Go);
	// if nil, a go statement does.
	Go func(func())
	// OnDial, if set, is called after every attempt with its endpoint,
	// duration and error (nil on success, context.Canceled for a loser).
	OnDial func(addr string, d time.Duration, err error)
	// Logger receives one line per failed attempt at V(2). The zero value
	// discards.
	Logger logr.Logger
}

func (d *Dialer) staggerDelay() time.Duration {
	if d.StaggerDelay == 0 {
		return DefaultStaggerDelay
	}
	return max(d.StaggerDelay, 0)
}

// The methods below serve a caller that runs DialAny's race itself on
// its own non-blocking sockets (localproxy's event loop): the same
// settings, counts and reports.

// Stagger is StaggerDelay with its default: how long an attempt runs
// before the next candidate starts beside it (0: all at once).
func (d *Dialer) Stagger() time.Duration { return d.staggerDelay() }

// TuneFD sets on fd, a TCP socket about to connect, the options
// DialEndpoint's connections get: keepalive and TCP_USER_TIMEOUT (set
// before the connect, it bounds the handshake's retransmissions too).
func (d *Dialer) TuneFD(fd int) error {
	return TuneTCPFD(fd, OrDefault(d.KeepAlive, DefaultKeepAlive), OrDefault(d.UserTimeout, DefaultUserTimeout))
}

// Timeouts are AttemptTimeout and Timeout with their defaults: what
// bounds one attempt, and a whole DialAny.
func (d *Dialer) Timeouts() (attempt, dial time.Duration) {
	return OrDefault(d.AttemptTimeout, DefaultAttemptTimeout), OrDefault(d.Timeout, DefaultDialTimeout)
}

// Opened counts a connection to addr the caller connected itself, as
// DialAny counts its own (upstream.Pool.ConnOpened); closing the
// returned Closer, once or more, stops counting it.
func (d *Dialer) Opened(addr string) io.Closer { return d.count(addr, nil) }

// counted is a connection to addr the pool counts until Close, which
// closes conn too, if set, once.
type counted struct {
	addr string
	pool *upstream.Pool
	conn io.Closer
	once sync.Once
	err  error
}

func (d *Dialer) count(addr string, conn io.Closer) *counted {
	d.Pool.ConnOpened(addr)
	return &counted{addr: addr, pool: d.Pool, conn: conn}
}

func (c *counted) Close() error {
	c.once.Do(func() {
		if c.conn != nil {
			c.err = c.conn.Close()
		}
		c.pool.ConnClosed(c.addr)
	})
	return c.err
}

// ReportDialFailure reports a failed connect to addr, as an attempt of
// DialAny does; a connect abandoned because another won says nothing of
// addr and is not reported.
func (d *Dialer) ReportDialFailure(addr string, err error) {
	d.reportFailure(context.Background(), addr, upstream.FailureDial, err)
}

// OrDefault returns v, or def if v is zero: the "If zero, a default is
// used" of every duration option of both front ends.
func OrDefault(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// TrackedConn is a connection to one endpoint, counted by the pool until it
// is closed.
type TrackedConn struct {
	net.Conn
	n *counted
}

// Endpoint returns the pool address the connection goes to.
func (c *TrackedConn) Endpoint() string { return c.n.addr }

// NetConn returns the underlying connection (a *net.TCPConn for TCP), for
// splicing.
func (c *TrackedConn) NetConn() net.Conn { return c.Conn }

// Close closes the connection; the pool stops counting it.
func (c *TrackedConn) Close() error { return c.n.Close() }

func (d *Dialer) track(addr string, nc net.Conn) *TrackedConn {
	return &TrackedConn{Conn: nc, n: d.count(addr, nc)}
}

type dialResult struct {
	i    int // the candidate's index
	addr string
	conn net.Conn
	err  error
}

// DialAny connects to the first of candidates that answers: it starts with
// candidates[0], starts the next candidate when an attempt fails, or when
// none has connected after StaggerDelay, takes the first success and
// closes the others. While attempts are in flight, only a candidate as
// healthy as the healthiest of them was when the dial began starts
// beside them (upstream.HedgeBar); a less healthy one waits for their
// end. The returned connection is a
// *tls.Conn over a *TrackedConn when TLSConfig is set, else a
// *TrackedConn. On failure the error joins ErrUnreachable with every
// attempt's error.
func (d *Dialer) DialAny(ctx context.Context, candidates []string) (net.Conn, string, error) {
	if len(candidates) == 0 {
		return nil, "", fmt.Errorf("%w: %w", ErrUnreachable, upstream.ErrNoEndpoints)
	}
	_, timeout := d.Timeouts()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	results := make(chan dialResult, len(candidates))
	bars := d.Pool.HedgeBars(candidates)
	running := make([]bool, len(candidates))
	next, inflight := 0, 0
	start := func() {
		i, addr := next, candidates[next]
		if d.Go != nil {
			d.Go(func() { d.attempt(ctx, i, addr, results) })
		} else {
			go d.attempt(ctx, i, addr, results)
		}
		running[i] = true
		next++
		inflight++
	}
	// mayHedge: candidates[next] may start beside the attempts in flight.
	mayHedge := func() bool {
		var bar upstream.HedgeBar
		for i, r := range running {
			if r {
				bar = bar.Stricter(bars[i])
			}
		}
		return d.Pool.MayHedge(bar, candidates[next])
	}
	start()
	stagger := time.NewTimer(d.staggerDelay())
	defer stagger.Stop()
	errs := []error{ErrUnreachable}
	firstFailed := false
	for inflight > 0 {
		select {
		case r := <-results:
			inflight--
			running[r.i] = false
			if r.err == nil {
				if inflight > 0 {
					cancel()
					go closeLosers(results, inflight)
				}
				// The pool demotes a first candidate that keeps losing
				// races to later ones: it is slow (see upstream.ReportDialRace).
				if won := r.addr == candidates[0]; won || !firstFailed {
					d.Pool.ReportDialRace(candidates[0], won)
				}
				return r.conn, r.addr, nil
			}
			if r.addr == candidates[0] {
				firstFailed = true
			}
			errs = append(errs, fmt.Errorf("%s: %w", r.addr, r.err))
			// With attempts still in flight, a candidate less healthy
			// than the bar waits for their end, as at the stagger.
			if next < len(candidates) && ctx.Err() == nil && (inflight == 0 || mayHedge()) {
				start()
				stagger.Reset(d.staggerDelay())
			}
		case <-stagger.C:
			if next < len(candidates) && mayHedge() {
				start()
				stagger.Reset(d.staggerDelay())
			}
		}
	}
	return nil, "", errors.Join(errs...)
}

// closeLosers closes connections of attempts that completed after the
// winner.
func closeLosers(results <-chan dialResult, n int) {
	for range n {
		if r := <-results; r.conn != nil {
			r.conn.Close()
		}
	}
}

// attempt dials one endpoint (and handshakes TLS) within AttemptTimeout.
func (d *Dialer) attempt(ctx context.Context, i int, addr string, results chan<- dialResult) {
	start := time.Now()
	conn, err := d.DialEndpoint(ctx, addr)
	if d.OnDial != nil {
		d.OnDial(addr, time.Since(start), err)
	}
	results <- dialResult{i: i, addr: addr, conn: conn, err: err}
}

// DialEndpoint connects to one endpoint within AttemptTimeout (and ctx),
// handshaking TLS when TLSConfig is set. Failures other than cancellation
// are reported to the pool.
func (d *Dialer) DialEndpoint(ctx context.Context, addr string) (net.Conn, error) {
	attempt, _ := d.Timeouts()
	actx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	// Keepalive is set by TuneTCP below, TCP_USER_TIMEOUT before the
	// connect so that it bounds the handshake's retransmissions too.
	ut := OrDefault(d.UserTimeout, DefaultUserTimeout)
	nd := &net.Dialer{KeepAlive: -1, Control: func(_, _ string, rc syscall.RawConn) error { return setUserTimeout(rc, ut) }}
	raw, err := nd.DialContext(actx, "tcp", addr)
	if err != nil {
		d.reportFailure(ctx, addr, upstream.FailureDial, err)
		return nil, err
	}
	if err := TuneTCP(raw, OrDefault(d.KeepAlive, DefaultKeepAlive), 0); err != nil {
		d.Logger.V(2).Info("setting keepalive failed", "endpoint", addr, "err", err.Error())
	}
	tc := d.track(addr, raw)
	if d.TLSConfig == nil {
		return tc, nil
	}
	tlsCfg := d.TLSConfig
	if d.GetTLSConfig != nil {
		tlsCfg = d.GetTLSConfig()
	}
	conn := tls.Client(tc, tlsCfg)
	if err := conn.HandshakeContext(actx); err != nil {
		tc.Close()
		f, err := classifyHandshakeError(err)
		d.reportFailure(ctx, addr, f, err)
		return nil, err
	}
	return conn, nil
}

func (d *Dialer) reportFailure(ctx context.Context, addr string, f upstream.Failure, err error) {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return // lost the race or the caller gave up: says nothing about addr
	}
	d.Logger.V(2).Info("dial failed", "addr", addr, "failure", f.String(), "err", err.Error())
	d.Pool.ReportFailure(addr, f, err)
}

// classifyHandshakeError tells what a failed TLS handshake says about the
// server, by error types: a certificate outside its validity period by this
// host's clock (FailureCertificateTime, err wrapped with
// upstream.ErrCertificateTime: transient, e.g. a clock that is wrong at
// boot), another certificate verification failure (FailureCertificate,
// wrapped with upstream.ErrCertificate: quarantine), or none
// (FailureTLS, err unchanged).
func classifyHandshakeError(err error) (upstream.Failure, error) {
	switch {
	case !isCertError(err):
		return upstream.FailureTLS, err
	case upstream.IsCertificateTimeError(err):
		return upstream.FailureCertificateTime, fmt.Errorf("%w: %w", upstream.ErrCertificateTime, err)
	}
	return upstream.FailureCertificate, fmt.Errorf("%w: %w", upstream.ErrCertificate, err)
}

// isCertError reports whether err comes from certificate verification.
func isCertError(err error) bool {
	var cve *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &cve) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}
