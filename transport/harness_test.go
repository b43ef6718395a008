package transport_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/internal/testpki"
)

// The test PKI (internal/testpki), under the names these tests use.
const originName = testpki.OriginName

type testPKI = testpki.PKI

func newPKI(t testing.TB) *testPKI { return testpki.New(t) }

// server is one TLS HTTP/2 test server standing in for an API server, behind
// a listener that can freeze (accept but never answer) like a SIGSTOPped
// process.
type server struct {
	name string
	srv  *httptest.Server
	ln   *freezeListener
	addr string
	// requests counts requests by path, /readyz excluded.
	mu       sync.Mutex
	requests map[string]int
	// notReady makes /readyz answer 503.
	notReady atomic.Bool
	// handler, if set, serves everything but /readyz.
	handler atomic.Pointer[http.HandlerFunc]
	// hellos counts TLS ClientHellos received (TCP-only probes send none).
	hellos atomic.Int64
	// helloDelay holds each TLS handshake this long (a loaded server).
	helloDelay atomic.Int64
}

func newServer(t testing.TB, name string, cert tls.Certificate) *server {
	t.Helper()
	return newServerProto(t, name, cert, true)
}

// newServerProto is newServer; h2 false makes a server that speaks only
// HTTP/1.1.
func newServerProto(t testing.TB, name string, cert tls.Certificate, h2 bool) *server {
	t.Helper()
	s := &server{name: name, requests: make(map[string]int)}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = newFreezeListener(inner)
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Listener.Close()
	s.srv.Listener = s.ln
	s.srv.EnableHTTP2 = h2
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s.hellos.Add(1)
			time.Sleep(time.Duration(s.helloDelay.Load()))
			return nil, nil
		},
	}
	s.srv.StartTLS()
	s.addr = inner.Addr().String()
	t.Cleanup(s.close)
	return s
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/readyz" {
		if s.notReady.Load() {
			http.Error(w, "[-]shutdown failed: reason withheld", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
		return
	}
	s.mu.Lock()
	s.requests[r.Method+" "+r.URL.Path]++
	s.mu.Unlock()
	if h := s.handler.Load(); h != nil {
		(*h)(w, r)
		return
	}
	w.Header().Set("X-Server", s.name)
	fmt.Fprint(w, s.name)
}

func (s *server) setHandler(h http.HandlerFunc) { s.handler.Store(&h) }

func (s *server) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[key]
}

// kill closes the listener and every connection, like a SIGKILLed process.
func (s *server) kill() {
	s.ln.Close()
	s.ln.closeConns()
}

func (s *server) close() {
	s.ln.unfreeze()
	s.kill()
	s.srv.Close()
}

// freezeListener hands out connections that stop moving bytes while frozen:
// the kernel still accepts and acknowledges, the server never answers.
type freezeListener struct {
	net.Listener
	mu     sync.Mutex
	frozen chan struct{} // closed when not frozen
	conns  map[*freezeConn]struct{}
}

func newFreezeListener(l net.Listener) *freezeListener {
	open := make(chan struct{})
	close(open)
	return &freezeListener{Listener: l, frozen: open, conns: make(map[*freezeConn]struct{})}
}

func (l *freezeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &freezeConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[fc] = struct{}{}
	l.mu.Unlock()
	return fc, nil
}

func (l *freezeListener) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.frozen:
		l.frozen = make(chan struct{})
	default:
	}
}

func (l *freezeListener) unfreeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.frozen:
	default:
		close(l.frozen)
	}
}

func (l *freezeListener) gate() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frozen
}

func (l *freezeListener) closeConns() {
	l.mu.Lock()
	conns := l.conns
	l.conns = make(map[*freezeConn]struct{})
	l.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type freezeConn struct {
	net.Conn
	l *freezeListener
}

func (c *freezeConn) Read(p []byte) (int, error) {
	<-c.l.gate()
	n, err := c.Conn.Read(p)
	<-c.l.gate() // data that arrived while frozen is held back
	return n, err
}

func (c *freezeConn) Write(p []byte) (int, error) {
	<-c.l.gate()
	return c.Conn.Write(p)
}

// cluster is three test servers and a rest.Config for the first.
type cluster struct {
	pki     *testPKI
	servers []*server
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c := &cluster{pki: newPKI(t)}
	for i := range n {
		c.servers = append(c.servers, newServer(t, fmt.Sprintf("s%d", i), c.pki.Cert))
	}
	return c
}

// config returns a rest.Config whose host is the first server.
func (c *cluster) config() *rest.Config {
	return &rest.Config{
		Host: "https://" + c.servers[0].addr,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     c.pki.CAPEM,
			ServerName: originName,
		},
	}
}

func (c *cluster) addrs() []string {
	var out []string
	for _, s := range c.servers {
		out = append(out, s.addr)
	}
	return out
}

// httptestTLS starts an unrelated TLS server and returns its URL.
func httptestTLS(t testing.TB) string {
	s := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(s.Close)
	return s.URL
}
