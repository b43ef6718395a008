package endpoint_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// A cluster with anonymous auth off answers /readyz with 401 to anonymous
// probes; WithCredentials makes them authenticate as the rest.Config does,
// by bearer token file or by client certificate.
func TestProbeWithCredentials(t *testing.T) {
	pki := newPKI(t)
	addr, _ := newAuthServer(t, pki)

	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pki.CAPEM))
	var err error
	anon := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
	err = anon.Probe(t.Context(), addr)
	require.True(t, endpoint.IsReadyzError(err), "anonymous probe: %v", err)
	assert.ErrorContains(t, err, "401")

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	// As clientcmd loads a kubeconfig with tokenFile: both fields set, the
	// file's content at start in BearerToken. The file wins.
	byToken, err := anon.WithCredentials(&rest.Config{BearerTokenFile: tokenFile, BearerToken: "expired"})
	require.NoError(t, err)
	assert.NoError(t, byToken.Probe(t.Context(), addr))
	assert.Equal(t, "bearer token", byToken.Credentials())
	assert.Equal(t, "none", anon.Credentials())
	// An unreadable file falls back to the token given.
	byStatic, err := anon.WithCredentials(&rest.Config{BearerTokenFile: filepath.Join(t.TempDir(), "gone"), BearerToken: "s3cret"})
	require.NoError(t, err)
	assert.NoError(t, byStatic.Probe(t.Context(), addr))
	// Exec plugins are not run for probes.
	byExec, err := anon.WithCredentials(&rest.Config{ExecProvider: &clientcmdapi.ExecConfig{Command: "false", APIVersion: "client.authentication.k8s.io/v1"}})
	require.NoError(t, err)
	assert.Equal(t, "none", byExec.Credentials())

	key, err := x509.MarshalECPrivateKey(pki.Client.PrivateKey.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	byCert, err := anon.WithCredentials(&rest.Config{TLSClientConfig: rest.TLSClientConfig{
		CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Client.Certificate[0]}),
		KeyData:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key}),
	}})
	require.NoError(t, err)
	assert.NoError(t, byCert.Probe(t.Context(), addr))
	assert.Equal(t, "client certificate", byCert.Credentials())
	// A CA in the rest.Config (absent here) is not loaded: the prober
	// verifies servers with its own.
	_, err = anon.WithCredentials(&rest.Config{BearerToken: "x", TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(t.TempDir(), "missing-ca.crt")}})
	assert.NoError(t, err)

	// The original is unchanged.
	assert.Nil(t, anon.Authorization)
	assert.Nil(t, anon.TLSConfig.GetClientCertificate)
	assert.Empty(t, anon.TLSConfig.Certificates)

	_, err = anon.WithCredentials(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: filepath.Join(t.TempDir(), "missing.crt"), KeyFile: "x"}})
	assert.Error(t, err)
}

// newAuthServer starts an API server stand-in for pki's origin whose
// /readyz answers 401 but to "Bearer s3cret" or pki's client certificate.
// It returns its address and the Host header of every request.
func newAuthServer(t *testing.T, pki *testPKI) (addr string, hosts <-chan string) {
	cas := x509.NewCertPool()
	cas.AddCert(pki.CA)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pki.Cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    cas,
	})
	require.NoError(t, err)
	hc := make(chan string, 100)
	srv := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case hc <- r.Host:
		default:
		}
		byToken := r.Header.Get("Authorization") == "Bearer s3cret"
		byCert := r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "probe-client"
		if r.URL.Path != "/readyz" || !(byToken || byCert) {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		w.Write([]byte("ok"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), hc
}

// A server that completes the TLS handshake but does not answer /readyz in
// time (kube-apiserver waiting for a stalled etcd) fails with a
// ReadyzError, so its connections are drained, not cut; one that does not
// even complete the handshake (stopped) fails with a plain timeout.
func TestProbeTimeoutAfterHandshakeIsReadyzError(t *testing.T) {
	pki := newPKI(t)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pki.CAPEM))
	pr := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pki.Cert}})
	require.NoError(t, err)
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release })}
	go srv.Serve(ln)
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err = pr.Probe(ctx, ln.Addr().String())
	require.True(t, endpoint.IsReadyzError(err), "slow /readyz: %v", err)
	var re *endpoint.ReadyzError
	require.ErrorAs(t, err, &re)
	assert.True(t, re.TimedOut)
	assert.ErrorContains(t, err, "not ready")
	assert.True(t, endpoint.Graceful(upstream.Event{Kind: upstream.EventDown, Addr: ln.Addr().String(), Err: err}))

	stopped, err := net.Listen("tcp", "127.0.0.1:0") // accepts (backlog), never handshakes
	require.NoError(t, err)
	defer stopped.Close()
	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err = pr.Probe(ctx, stopped.Addr().String())
	require.Error(t, err)
	assert.False(t, endpoint.IsReadyzError(err), "no TLS handshake: %v", err)
	assert.False(t, endpoint.Graceful(upstream.Event{Kind: upstream.EventDown, Addr: stopped.Addr().String(), Err: err}))
}

// readyzServer serves /readyz over TLS with cert on addr ("127.0.0.1:0" for
// any port) and records whether each handshake resumed a session.
func readyzServer(t testing.TB, addr string, cert tls.Certificate) (string, *[]bool, func()) {
	ln, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	var mu sync.Mutex
	var resumed []bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		resumed = append(resumed, r.TLS.DidResume)
		mu.Unlock()
		w.Write([]byte("ok"))
	})}
	go srv.Serve(ln)
	stop := func() { srv.Close() }
	t.Cleanup(stop)
	return ln.Addr().String(), &resumed, stop
}

// Probes resume TLS sessions per endpoint (cheaper than a full handshake);
// a different server at the same address cannot resume one and is fully
// verified.
func TestProbeResumesTLSSessions(t *testing.T) {
	pki := newPKI(t)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pki.CAPEM))
	pr := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
	a, resumedA, stopA := readyzServer(t, "127.0.0.1:0", pki.Cert)
	b, resumedB, _ := readyzServer(t, "127.0.0.1:0", pki.Cert)
	for range 3 {
		require.NoError(t, pr.Probe(t.Context(), a))
		require.NoError(t, pr.Probe(t.Context(), b))
	}
	assert.Equal(t, []bool{false, true, true}, *resumedA)
	assert.Equal(t, []bool{false, true, true}, *resumedB, "the endpoints share a server name: one cache each")

	stopA()
	_, _, _ = readyzServer(t, a, pki.Wrong) // an impostor on the same address
	err := pr.Probe(t.Context(), a)
	require.ErrorIs(t, err, upstream.ErrCertificate, "a cached session must not vouch for another server")
}

// noSessions is a session cache that keeps nothing: every handshake full.
type noSessions struct{}

func (noSessions) Get(string) (*tls.ClientSessionState, bool) { return nil, false }
func (noSessions) Put(string, *tls.ClientSessionState)        {}

// BenchmarkProbe compares a /readyz probe that resumes its TLS session
// (the default) with one that makes a full handshake each time, against
// the same server in the same run; "ratio" is resumed/full. "held" is
// ProbeHeld over one HTTP/2 connection; each reports the server's TLS
// handshakes per probe and the CPU time (client and server, both in this
// process) per probe.
func BenchmarkProbe(b *testing.B) {
	pki := newPKI(b)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.CAPEM)
	s := newH2Server(b, pki.Cert)
	addr := s.addr
	resumed := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
	full := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName, ClientSessionCache: noSessions{}}, Host: originName}
	held := &endpoint.Prober{Mode: endpoint.ProbeHeld, TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
	b.Cleanup(held.Close)
	probe := func(b *testing.B, p *endpoint.Prober) {
		if err := p.Probe(b.Context(), addr); err != nil {
			b.Fatal(err)
		}
	}
	run := func(p *endpoint.Prober) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			h0, cpu0 := s.handshakes.Load(), cpuTime()
			for b.Loop() {
				probe(b, p)
			}
			b.ReportMetric(float64(s.handshakes.Load()-h0)/float64(b.N), "handshakes/op")
			if cpu := cpuTime(); cpu > 0 {
				b.ReportMetric(float64(cpu-cpu0)/float64(b.N), "cpu-ns/op")
			}
		}
	}
	b.Run("full", run(full))
	b.Run("resumed", run(resumed))
	b.Run("held", run(held))
	b.Run("ratio", func(b *testing.B) {
		var tf, tr time.Duration
		for b.Loop() {
			s := time.Now()
			probe(b, full)
			tf += time.Since(s)
			s = time.Now()
			probe(b, resumed)
			tr += time.Since(s)
		}
		b.ReportMetric(float64(tr)/float64(tf), "ratio")
	})
}
