package localproxy

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/apifailover/apifailover/internal/monotime"
)

// HealthMaxConnections bounds the health server's open connections. What
// it serves needs a few at once: kubelet's liveness and readiness probes
// (a new connection each, closed after the answer), one kept-alive
// connection per Prometheus scraper, `localproxy status` and a human's
// curl. More are closed as soon as they are accepted: a local process
// (or a hostNetwork pod, or a remote one when the health server listens
// beyond loopback) cannot hold more of the proxy's file descriptors
// through it than this, one each. cmd/localproxy counts them in the file
// limit beside --max-connections.
const HealthMaxConnections = 64

// The health server's timeouts and sizes: its requests are small GETs
// from local clients, its largest answer is /metrics.
const (
	// healthReadHeaderTimeout: a client sends its request headers in
	// one write; one that trickles them (slowloris) holds a connection
	// this long at most.
	healthReadHeaderTimeout = 2 * time.Second
	// healthReadTimeout bounds reading a whole request; bodies are not
	// read (see healthRequests).
	healthReadTimeout = 5 * time.Second
	// healthWriteTimeout bounds a handler and the write of its answer,
	// counted from the end of the request headers: as long as
	// Prometheus's default scrape timeout, so a slow scraper is never
	// cut before it would give up itself.
	healthWriteTimeout = 10 * time.Second
	// healthIdleTimeout closes a kept-alive connection with no request
	// for this long: longer than the usual 15s scrape interval, so a
	// scraper's connection stays open between scrapes, and an idle
	// client gives its slot back within half a minute.
	healthIdleTimeout = 30 * time.Second
	// healthMaxHeaderBytes bounds the request headers (net/http allows
	// 4 KiB more): room for a bearer token, 128 times less than
	// net/http's default of 1 MiB.
	healthMaxHeaderBytes = 8 << 10
	// healthRejectLogEvery: rejected connections are logged at most
	// this often, with how many since the last line.
	healthRejectLogEvery = time.Minute
	// healthUnreadWait: at the cap, when no open connection can give
	// its slot but some are ones the server has not got to yet (see
	// capListener), Accept waits this long at most for it to, then
	// closes the new connection. The server gets to a connection in
	// microseconds, milliseconds on a loaded machine; meanwhile new
	// clients wait in the listen backlog. A quarter of kubelet's
	// default probe timeout of 1s: a probe kept waiting this long is
	// still answered in time.
	healthUnreadWait = 250 * time.Millisecond
	// healthStalledWrite: an answer whose write has been blocked this
	// long waits for a client that does not read it (answers are at
	// most a few hundred KiB, which a local client's socket buffers
	// take at once): at the cap, that connection gives its slot when no
	// connection without a request in progress can.
	healthStalledWrite = 250 * time.Millisecond
	// healthBackToBack and healthBackToBackGap: a connection whose
	// last healthBackToBack requests or more each came within
	// healthBackToBackGap of the answer before (pipelined, or sent in a
	// tight loop) keeps the server busy by itself: at the cap, the one
	// with the longest such run gives its slot when no connection
	// without a request in progress can, nor one whose client reads no
	// answer. kubelet's probes ask once per connection, a Prometheus
	// scraper once per scrape.
	healthBackToBack    = 4
	healthBackToBackGap = 100 * time.Millisecond
)

// healthLimits are the health server's limits that tests change
// (export_test.go); zero fields take the constants above.
type healthLimits struct {
	readHeaderTimeout time.Duration
}

func (l *healthLimits) setDefaults() {
	if l.readHeaderTimeout == 0 {
		l.readHeaderTimeout = healthReadHeaderTimeout
	}
}

// capListener is a listener that holds at most max open connections
// without leaving any in the listen backlog (netutil.LimitListener), where
// it would wait, and a client with it, for as long as the connections
// before it stay. A connection beyond the cap takes the slot of the one
// that went longest without a request in progress (new and not yet through
// its request headers, or idle between requests; see connState) among
// those the server waits on, in a Read, for the client's bytes: one that
// only holds a slot, trickling its headers (slowloris) or sitting idle,
// loses it to the next client, kubelet's probe included. Failing that,
// among the connections serving a request, the one whose answer's write
// has been blocked longest, over healthStalledWrite, loses it (its client
// does not read), else the one with the longest run of requests back to
// back (healthBackToBack): a process that pipelines requests on every
// slot, whether it reads the answers or not, would otherwise keep each
// slot busy, and the probes out, as long as it likes. When every slot
// serves a request otherwise, the new connection is closed at once.
//
// A connection the server has not read from yet (its goroutine has not
// run: a loaded machine), or is parsing what it read, keeps its slot: its
// client may have sent its request already, and a burst of max new
// connections within that moment would otherwise close it (a kubelet
// probe, cut as a slowloris attack began). When such connections are all
// that could give a slot, Accept waits for the server to get to one, up
// to healthUnreadWait, and then closes the new connection.
//
// That protection lasts as long as the server's own delay, which clients
// do not control: opening connections faster does not keep an attacker's
// from being taken, it only makes the server busier. A grace period
// from the accept (every new connection keeps its slot for, say,
// 250ms) would also protect a client slow to send its request, but the
// attacker's connections too: more than max new connections per grace
// period (256/s at 250ms, cheap for a local process) keep every slot
// young, and each new connection, probes included, is closed at once; a
// single burst of max or more closes every probe of the next 250ms.
// What remains: a client that has sent nothing by the time the server
// waits on its connection is told from an idle one by nothing, and loses
// its slot to the max-th new connection after it, as before.
type capListener struct {
	net.Listener
	max        int64
	unreadWait time.Duration // healthUnreadWait; tests change it
	open       atomic.Int64  // connections returned by Accept and not yet closed
	closed     atomic.Bool   // Close was called
	active     prometheus.Gauge
	rejected   prometheus.Counter
	evicted    prometheus.Counter
	log        logr.Logger

	mu        sync.Mutex // guards the fields below
	conns     map[*cappedConn]struct{}
	lastLog   time.Time // when a rejection or eviction was last logged
	notLogged int       // rejections and evictions since lastLog
}

func newCapListener(ln net.Listener, max int, active prometheus.Gauge, rejected, evicted prometheus.Counter, log logr.Logger) *capListener {
	return &capListener{Listener: ln, max: int64(max), unreadWait: healthUnreadWait,
		active: active, rejected: rejected, evicted: evicted, log: log,
		conns: make(map[*cappedConn]struct{})}
}

// Accept returns the next connection, making room for it at the cap by
// closing the open one that went longest without a request in progress
// (see capListener), and closing it instead when there is none.
//
// An accept that fails is tried again after a backoff, whatever the
// error, until the listener is closed: http.Server gives up at the first
// error it does not know as temporary (ENOBUFS, ENOMEM, EPERM from a
// firewall hook), which would leave the proxy serving clients with no
// /healthz, so that kubelet restarted it, and with no /metrics.
func (l *capListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.closed.Load() {
				return nil, err
			}
			if delay == 0 {
				l.log.Error(err, "health server: accept failed; trying again, backing off")
			}
			delay = nextAcceptBackoff(delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if l.open.Add(1) > l.max && !l.makeRoom() {
			l.open.Add(-1)
			c.Close()
			l.rejected.Inc()
			l.note("health server full, every connection serving a request or not read yet; closing new connection", c.RemoteAddr())
			continue
		}
		l.active.Inc()
		cc := &cappedConn{Conn: c, l: l}
		cc.since.Store(monotime.Now())
		l.mu.Lock()
		l.conns[cc] = struct{}{}
		l.mu.Unlock()
		return cc, nil
	}
}

// Close closes the listener; Accept returns from then on.
func (l *capListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// makeRoom closes the connection whose slot a new one takes at the cap,
// waiting up to unreadWait for the server to get to one it has not read
// yet, and reports whether there is room now.
func (l *capListener) makeRoom() bool {
	deadline := time.Now().Add(l.unreadWait)
	for {
		victim, unread := l.victim()
		if victim != nil {
			victim.Close() // gives its slot back
			l.evicted.Inc()
			l.note("health server full; closing the connection longest without a request, or whose client reads no answer", victim.RemoteAddr())
			return true
		}
		if !unread || !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
		if l.open.Load() <= l.max { // one closed meanwhile
			return true
		}
	}
}

// victim returns the open connection that gives its slot to a new one
// (capListener): the one without a request in progress that the server
// waits in a Read on whose state is oldest; else, among those serving a
// request, the one whose answer's write has been blocked longest, over
// healthStalledWrite, else the one with the longest run of requests back
// to back, healthBackToBack or more; nil if none. unread: some connection
// without a request in progress is one the server has not got to (not
// read from yet, parsing what it read, or with the client's bytes queued
// for a Read whose goroutine has not run yet).
func (l *capListener) victim() (victim *cappedConn, unread bool) {
	stalledBefore := monotime.Now() - int64(healthStalledWrite)
	var stalled, asker *cappedConn
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if c.busy.Load() {
			if w := c.writing.Load(); w != 0 && w <= stalledBefore && (stalled == nil || w < stalled.writing.Load()) {
				stalled = c
			}
			if n := c.backToBack.Load(); n >= healthBackToBack && (asker == nil || n > asker.backToBack.Load()) {
				asker = c
			}
			continue
		}
		// Waiting in a Read, but with the client's bytes queued: the
		// Read has returned, or will when its goroutine runs (a loaded
		// machine), with a request, kubelet's probe maybe, on its way.
		if !c.reading.Load() || queuedBytes(c.Conn) > 0 {
			unread = true
			continue
		}
		if victim == nil || c.since.Load() < victim.since.Load() {
			victim = c
		}
	}
	switch {
	case victim != nil:
	case stalled != nil:
		victim = stalled
	default:
		victim = asker
	}
	return victim, unread
}

// connState is the health server's http.Server.ConnState: a connection
// has a request in progress from when its headers are read (StateActive)
// until the answer is written (StateIdle, or closed).
func (l *capListener) connState(c net.Conn, s http.ConnState) {
	cc, ok := c.(*cappedConn)
	if !ok {
		return
	}
	switch s {
	case http.StateActive:
		cc.busy.Store(true)
		// Within healthBackToBackGap of the last answer: back to back
		// with it. The first request starts a run of one.
		if cc.served.Load() && monotime.Now()-cc.since.Load() < int64(healthBackToBackGap) {
			if cc.backToBack.Load() < 1<<30 {
				cc.backToBack.Add(1)
			}
		} else {
			cc.backToBack.Store(1)
		}
		cc.served.Store(true)
	case http.StateIdle:
		cc.busy.Store(false)
		cc.since.Store(monotime.Now())
	}
}

func (l *capListener) release(c *cappedConn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.open.Add(-1)
	l.active.Dec()
}

// note logs a rejection or an eviction, at most one line per
// healthRejectLogEvery with the number since the last one.
func (l *capListener) note(msg string, client net.Addr) {
	now := time.Now()
	l.mu.Lock()
	l.notLogged++
	n := 0
	if l.lastLog.IsZero() || now.Sub(l.lastLog) >= healthRejectLogEvery {
		n, l.notLogged, l.lastLog = l.notLogged, 0, now
	}
	l.mu.Unlock()
	l.log.V(4).Info(msg, "client", client.String())
	if n > 0 {
		l.log.Info("health server at its connection limit: closing connections without a request in progress, or new ones", "max", l.max, "closed", n)
	}
}

// cappedConn gives its slot back when closed (once). busy: a request is
// in progress; since: when it was accepted or last went idle; reading:
// the server waits in a Read on it for the client's bytes (false from
// the accept until the server's first Read, and while the server parses
// what a Read returned); writing: when the Write in progress began
// (monotime), 0 if none; served: a request was read; backToBack: how
// many requests in a row came within healthBackToBackGap of the answer
// before them.
type cappedConn struct {
	net.Conn
	l          *capListener
	busy       atomic.Bool
	since      atomic.Int64
	reading    atomic.Bool
	writing    atomic.Int64
	served     atomic.Bool
	backToBack atomic.Int32
	once       sync.Once
}

func (c *cappedConn) Read(b []byte) (int, error) {
	c.reading.Store(true)
	n, err := c.Conn.Read(b)
	c.reading.Store(false)
	return n, err
}

func (c *cappedConn) Write(b []byte) (int, error) {
	c.writing.Store(monotime.Now())
	n, err := c.Conn.Write(b)
	c.writing.Store(0)
	return n, err
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// CloseWrite passes the half-close on: net/http sends its FIN with it
// before closing a connection whose request it did not read to the end.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
