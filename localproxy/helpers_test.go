package localproxy_test

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// server is a TCP test upstream on 127.0.0.1 running handle per connection.
type server struct {
	ln     net.Listener
	handle func(*net.TCPConn)
	wg     sync.WaitGroup
	open   atomic.Int64
	mu     sync.Mutex // guards conns
	conns  map[net.Conn]struct{}
}

func newServer(t testing.TB, handle func(*net.TCPConn)) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return serveOn(t, ln, handle)
}

// serveOn runs handle for each connection accepted on ln until the test
// ends.
func serveOn(t testing.TB, ln net.Listener, handle func(*net.TCPConn)) *server {
	s := &server{ln: ln, handle: handle, conns: make(map[net.Conn]struct{})}
	s.wg.Go(s.acceptLoop)
	t.Cleanup(s.close)
	return s
}

// newEcho returns a server that echoes until EOF, then half-closes.
func newEcho(t testing.TB) *server { return newServer(t, echo) }

func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

func (s *server) addr() string { return s.ln.Addr().String() }

func (s *server) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.open.Add(1)
		s.wg.Go(func() {
			defer func() {
				c.Close()
				s.open.Add(-1)
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
			s.handle(c.(*net.TCPConn))
		})
	}
}

func (s *server) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// prober is a fake upstream.Prober whose answers the test sets.
type prober struct {
	mu   sync.Mutex // guards fail
	fail map[string]error
}

func newProber() *prober { return &prober{fail: make(map[string]error)} }

func (p *prober) Probe(ctx context.Context, addr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fail[addr]
}

func (p *prober) set(addr string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[addr] = err
}

// running is a proxy started by start.
type running struct {
	*localproxy.Proxy
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, set before done is closed
}

// addr is the proxy's first listening address.
func (r *running) addr() string { return r.Addrs()[0].String() }

// stop ends Run and returns its error.
func (r *running) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// start runs a proxy with test defaults: listening on 127.0.0.1:0,
// connections closed at once on shutdown, a fresh registry, logs to t.
func start(t testing.TB, cfg localproxy.Config) *running {
	t.Helper()
	if len(cfg.ListenAddresses) == 0 {
		cfg.ListenAddresses = []string{"127.0.0.1:0"}
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = -1
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = testLogger(t)
	}
	p, err := localproxy.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Proxy: p, reg: cfg.Registry, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = p.Run(ctx)
		close(r.done)
	}()
	select {
	case <-p.Ready():
	case <-r.done:
		cancel()
		t.Fatalf("Run: %v", r.err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("Run: %v", r.err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	})
	return r
}

func testLogger(t testing.TB) logr.Logger {
	if tt, ok := t.(*testing.T); ok && testing.Verbose() {
		return testr.NewWithOptions(tt, testr.Options{Verbosity: 4})
	}
	return logr.Discard()
}

// metric returns the value of a counter or gauge with the given labels,
// summed over series matching them.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, err := metricValue(reg, name, labels...)
	require.NoError(t, err)
	return v
}

// metricValue is metric for conditions polled on another goroutine
// (require.Eventually): it returns the error instead of failing the test.
func metricValue(reg *prometheus.Registry, name string, labels ...string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum, nil
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// roundTrip writes msg on c and reads it back (through an echo server).
func roundTrip(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

// closedByPeer reports whether the peer closed c: a read returns EOF or a
// reset (a blocked read would time out: the connection is open).
func closedByPeer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func httpGet(t testing.TB, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func freeLocalPort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
