package localproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
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

// capListener is a listener that closes every connection it accepts
// beyond max open ones at once, instead of leaving it queued in the
// listen backlog (netutil.LimitListener), where it waits, and a client
// with it, for as long as the connections before it stay.
type capListener struct {
	net.Listener
	max      int64
	open     atomic.Int64 // connections returned by Accept and not yet closed
	active   prometheus.Gauge
	rejected prometheus.Counter
	log      logr.Logger

	mu        sync.Mutex // guards the fields below
	lastLog   time.Time  // when a rejection was last logged
	notLogged int        // rejections since lastLog
}

func newCapListener(ln net.Listener, max int, active prometheus.Gauge, rejected prometheus.Counter, log logr.Logger) *capListener {
	return &capListener{Listener: ln, max: int64(max), active: active, rejected: rejected, log: log}
}

// Accept returns the next connection while fewer than max are open,
// closing those beyond.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			l.active.Inc()
			return &cappedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		c.Close()
		l.rejected.Inc()
		l.noteRejected(c.RemoteAddr())
	}
}

func (l *capListener) release() {
	l.open.Add(-1)
	l.active.Dec()
}

// noteRejected logs a rejection, at most one line per
// healthRejectLogEvery with the number rejected since the last one.
func (l *capListener) noteRejected(client net.Addr) {
	now := time.Now()
	l.mu.Lock()
	l.notLogged++
	n := 0
	if l.lastLog.IsZero() || now.Sub(l.lastLog) >= healthRejectLogEvery {
		n, l.notLogged, l.lastLog = l.notLogged, 0, now
	}
	l.mu.Unlock()
	l.log.V(4).Info("health server full; closing connection", "client", client.String())
	if n > 0 {
		l.log.Info("health server at its connection limit: closing new connections", "max", l.max, "closed", n)
	}
}

// cappedConn gives its slot back when closed (once).
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
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
