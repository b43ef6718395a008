package transport_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// originName is the name every test server's certificate carries, as every
// kube-apiserver certificate carries the control-plane endpoint name.
const originName = "origin.test"

// testPKI is a CA with one serving certificate for originName.
type testPKI struct {
	caPEM []byte
	cert  tls.Certificate
	// wrong is a certificate from the same CA for another name.
	wrong tls.Certificate
	// client is a client certificate from the same CA for "probe-client".
	client tls.Certificate
	ca     *x509.Certificate
}

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "apifailover test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			DNSNames:     []string{name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	return &testPKI{
		caPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		cert:   leaf(originName, 2, x509.ExtKeyUsageServerAuth),
		wrong:  leaf("wrong.test", 3, x509.ExtKeyUsageServerAuth),
		client: leaf("probe-client", 4, x509.ExtKeyUsageClientAuth),
		ca:     ca,
	}
}

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
		c.servers = append(c.servers, newServer(t, fmt.Sprintf("s%d", i), c.pki.cert))
	}
	return c
}

// config returns a rest.Config whose host is the first server.
func (c *cluster) config() *rest.Config {
	return &rest.Config{
		Host: "https://" + c.servers[0].addr,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     c.pki.caPEM,
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
