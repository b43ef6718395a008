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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// testCA issues certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for name and its key, as PEM and as a
// tls.Certificate.
func (ca *testCA) issue(t testing.TB, name string, serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte, cert tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return certPEM, keyPEM, cert
}

// replaceFile replaces path atomically, as kubelet and Secret volume
// updates do: the new content is written beside it and renamed over it.
func replaceFile(t testing.TB, path string, content []byte) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, content, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// mtlsServer is an HTTP/2 TLS server that requires client certificates
// and records the serial number each request presented.
type mtlsServer struct {
	srv  *httptest.Server
	addr string
	cert atomic.Pointer[tls.Certificate] // served on new connections

	mu      sync.Mutex
	serials map[string][]int64 // by path

	// slowStarted is signalled when /slow begins; it answers when
	// slowRelease is closed.
	slowStarted chan struct{}
	slowRelease chan struct{}
}

func newMTLSServer(t testing.TB, serving tls.Certificate, clientCA *testCA) *mtlsServer {
	t.Helper()
	s := &mtlsServer{serials: make(map[string][]int64), slowStarted: make(chan struct{}, 1), slowRelease: make(chan struct{})}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.EnableHTTP2 = true
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	cas := x509.NewCertPool()
	cas.AddCert(clientCA.cert)
	s.cert.Store(&serving)
	s.srv.TLS = &tls.Config{GetCertificate: s.getCertificate, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: cas}
	s.srv.StartTLS()
	s.addr = s.srv.Listener.Addr().String()
	t.Cleanup(func() {
		s.release()
		s.srv.Close()
	})
	return s
}

// setCert makes the server present cert on new connections.
func (s *mtlsServer) setCert(cert tls.Certificate) { s.cert.Store(&cert) }

func (s *mtlsServer) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert.Load(), nil
}

func (s *mtlsServer) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.slowRelease:
	default:
		close(s.slowRelease)
	}
}

func (s *mtlsServer) serve(w http.ResponseWriter, r *http.Request) {
	serial := r.TLS.PeerCertificates[0].SerialNumber.Int64()
	s.mu.Lock()
	s.serials[r.URL.Path] = append(s.serials[r.URL.Path], serial)
	s.mu.Unlock()
	if r.URL.Path == "/slow" {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		s.slowStarted <- struct{}{}
		<-s.slowRelease
		fmt.Fprint(w, "done")
		return
	}
	fmt.Fprint(w, serial)
}

// lastSerial is the serial number of the last request to path.
func (s *mtlsServer) lastSerial(path string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.serials[path]
	if len(ss) == 0 {
		return 0
	}
	return ss[len(ss)-1]
}

func getBody(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), nil
}

// pollUntil calls try until it returns true, failing the test after a
// deadline.
func pollUntil(t *testing.T, what string, try func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !try(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kubelet rotates its client certificate by replacing the files; our
// connections are pinged and never idle out, so without a reload every
// request would present the old certificate until it expires. After the
// reload, new requests present the new certificate, no request fails, and
// a request running on an old connection finishes there.
func TestClientCertificateRotation(t *testing.T) {
	ca := newTestCA(t, "rotation CA")
	_, _, serving := ca.issue(t, originName, 2, x509.ExtKeyUsageServerAuth)
	srv := newMTLSServer(t, serving, ca)

	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), filepath.Join(dir, "ca.crt")
	certPEM, keyPEM, _ := ca.issue(t, "client", 10, x509.ExtKeyUsageClientAuth)
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))

	cfg := &rest.Config{Host: "https://" + srv.addr, TLSClientConfig: rest.TLSClientConfig{
		CAFile: caFile, ServerName: originName, CertFile: certFile, KeyFile: keyFile,
	}}
	f, err := transport.Wrap(t.Context(), cfg, transport.Options{DisableDiscovery: true, TLSReloadInterval: time.Hour})
	require.NoError(t, err)
	defer f.Close()
	client := f.HTTPClient()
	url := "https://" + srv.addr

	body, err := getBody(client, url+"/before")
	require.NoError(t, err)
	assert.Equal(t, "10", body)

	slow := make(chan error, 1)
	go func() {
		b, err := getBody(client, url+"/slow")
		if err == nil && b != "done" {
			err = fmt.Errorf("slow request: body %q, want done", b)
		}
		slow <- err
	}()
	<-srv.slowStarted

	// The new pair: written beside the old files and renamed over them.
	certPEM, keyPEM, _ = ca.issue(t, "client", 11, x509.ExtKeyUsageClientAuth)
	replaceFile(t, keyFile, keyPEM)
	replaceFile(t, certFile, certPEM)
	transport.CheckTLSFiles(f)

	pollUntil(t, "a request presenting the new certificate", func() bool {
		body, err := getBody(client, url+"/after")
		require.NoError(t, err, "a request after the rotation failed")
		return body == "11"
	})
	assert.Equal(t, int64(10), srv.lastSerial("/slow"))
	select {
	case err := <-slow:
		t.Fatalf("the running request ended before it was answered: %v", err)
	default:
	}
	srv.release()
	require.NoError(t, <-slow, "the request running on the old connection")
	// Connections made since present the new certificate.
	body, err = getBody(client, url+"/later")
	require.NoError(t, err)
	assert.Equal(t, "11", body)
}

// A CA rotation: the server moves to a certificate from a new CA, which
// fails verification until the CA file names it; then requests succeed
// again, without a restart, and the endpoint quarantined for the
// certificate error is probed again.
func TestCARotation(t *testing.T) {
	oldCA, newCA := newTestCA(t, "old CA"), newTestCA(t, "new CA")
	_, _, oldServing := oldCA.issue(t, originName, 2, x509.ExtKeyUsageServerAuth)
	_, _, newServing := newCA.issue(t, originName, 3, x509.ExtKeyUsageServerAuth)
	srv := newMTLSServer(t, oldServing, oldCA)

	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), filepath.Join(dir, "ca.crt")
	certPEM, keyPEM, _ := oldCA.issue(t, "client", 10, x509.ExtKeyUsageClientAuth)
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(caFile, oldCA.pem, 0o600))
	cfg := &rest.Config{Host: "https://" + srv.addr, TLSClientConfig: rest.TLSClientConfig{
		CAFile: caFile, ServerName: originName, CertFile: certFile, KeyFile: keyFile,
	}}
	f, err := transport.Wrap(t.Context(), cfg, transport.Options{DisableDiscovery: true, TLSReloadInterval: time.Hour, Rise: 1, Fall: 1})
	require.NoError(t, err)
	defer f.Close()
	client := f.HTTPClient()
	url := "https://" + srv.addr
	_, err = getBody(client, url+"/before")
	require.NoError(t, err)

	// The server moves to the new CA; existing connections are cut.
	srv.setCert(newServing)
	srv.srv.CloseClientConnections()
	pollUntil(t, "the endpoint quarantined for its certificate", func() bool {
		_, err := getBody(client, url+"/during")
		return err != nil && f.Pool().Status()[0].State == upstream.StateQuarantined
	})

	// Both CAs during the rotation, as a CA bundle does.
	replaceFile(t, caFile, append(append([]byte{}, oldCA.pem...), newCA.pem...))
	transport.CheckTLSFiles(f)
	pollUntil(t, "a request through the new CA", func() bool {
		_, err := getBody(client, url+"/after")
		return err == nil
	})
	pollUntil(t, "the endpoint out of quarantine", func() bool {
		return f.Pool().Status()[0].State != upstream.StateQuarantined
	})
}

// localproxy's probes authenticate with the kubeconfig's client
// certificate (Prober.WithCredentials); after a rotation they present the
// new one, although they resume TLS sessions, which carry the old one.
func TestProbeClientCertificateRotation(t *testing.T) {
	ca := newTestCA(t, "probe CA")
	_, _, serving := ca.issue(t, originName, 2, x509.ExtKeyUsageServerAuth)
	srv := newMTLSServer(t, serving, ca)
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), filepath.Join(dir, "ca.crt")
	certPEM, keyPEM, _ := ca.issue(t, "client", 10, x509.ExtKeyUsageClientAuth)
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))

	base := &endpoint.Prober{TLSConfig: &tls.Config{ServerName: originName}, Host: originName, TLSReloadInterval: time.Nanosecond}
	p, err := base.WithCAFile(caFile)
	require.NoError(t, err)
	p, err = p.WithCredentials(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: certFile, KeyFile: keyFile}})
	require.NoError(t, err)
	assert.Equal(t, "client certificate", p.Credentials())
	for range 2 { // the second resumes the first's session
		require.NoError(t, p.Probe(t.Context(), srv.addr))
		assert.Equal(t, int64(10), srv.lastSerial("/readyz"))
	}

	certPEM, keyPEM, _ = ca.issue(t, "client", 11, x509.ExtKeyUsageClientAuth)
	replaceFile(t, keyFile, keyPEM)
	replaceFile(t, certFile, certPEM)
	require.NoError(t, p.Probe(t.Context(), srv.addr))
	assert.Equal(t, int64(11), srv.lastSerial("/readyz"))
}
