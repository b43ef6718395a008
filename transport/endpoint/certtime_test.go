package endpoint_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// timedPKI is a CA valid from three hours before now for a day and a
// serving certificate for originName valid from notBefore to notAfter.
func timedPKI(t testing.TB, notBefore, notAfter time.Time) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "apifailover test CA"},
		NotBefore:             now.Add(-3 * time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: originName},
		DNSNames:     []string{originName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return roots, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// certServer is an HTTP/2 TLS server answering 200 to everything, with a
// certificate that can be set after it started.
type certServer struct {
	addr string
	cert atomic.Pointer[tls.Certificate]
}

func newCertServer(t testing.TB) *certServer {
	t.Helper()
	s := &certServer{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return s.cert.Load(), nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.addr = srv.Listener.Addr().String()
	return s
}

// A certificate that is not yet valid (this host's clock is behind) or
// expired fails probes and dials with ErrCertificateTime, not
// ErrCertificate; a certificate for another name still fails with
// ErrCertificate.
func TestCertificateTimeErrorClassified(t *testing.T) {
	srv := newCertServer(t)
	for _, tt := range []struct {
		name      string
		notBefore time.Duration // from now
		notAfter  time.Duration // from now
		timeErr   bool
	}{
		{"not yet valid", time.Minute, time.Hour, true},
		{"expired", -2 * time.Hour, -time.Hour, true},
		{"valid", -time.Hour, time.Hour, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			roots, cert := timedPKI(t, time.Now().Add(tt.notBefore), time.Now().Add(tt.notAfter))
			srv.cert.Store(&cert)
			tlsCfg := &tls.Config{RootCAs: roots, ServerName: originName}

			pr := &endpoint.Prober{Mode: endpoint.ProbeTLS, TLSConfig: tlsCfg, Host: originName}
			err := pr.Probe(t.Context(), srv.addr)
			if !tt.timeErr {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, upstream.ErrCertificateTime)
			assert.NotErrorIs(t, err, upstream.ErrCertificate, "not a quarantine")

			p, err := upstream.New(upstream.Config{IsLocal: func(string) bool { return false }})
			require.NoError(t, err)
			require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: srv.addr}}))
			var dialErr error
			d := &endpoint.Dialer{Pool: p, TLSConfig: tlsCfg, OnDial: func(_ string, _ time.Duration, err error) { dialErr = err }}
			_, _, err = d.DialAny(t.Context(), []string{srv.addr})
			require.Error(t, err)
			assert.ErrorIs(t, dialErr, upstream.ErrCertificateTime)
			assert.NotErrorIs(t, dialErr, upstream.ErrCertificate)
			st := p.Status()[0]
			assert.Equal(t, upstream.StateUnhealthy, st.State, "an unknown endpoint is unhealthy after one failure, not quarantined")
		})
	}
}

// A node whose clock is behind its apiserver's certificate (booted with a
// wrong clock, restored from a snapshot): the real /readyz Prober fails
// while the certificate is not yet valid, the endpoint is unhealthy (not
// quarantined), and it becomes healthy once the clock reaches NotBefore,
// without a restart. The server runs outside the bubble; inside it
// crypto/tls verifies with the bubble's clock, which the test advances.
func TestNotYetValidCertificateRecovers(t *testing.T) {
	srv := newCertServer(t)
	synctest.Test(t, func(t *testing.T) {
		validFrom := time.Now().Add(30 * time.Second)
		roots, cert := timedPKI(t, validFrom, validFrom.Add(24*time.Hour))
		srv.cert.Store(&cert)
		pr := &endpoint.Prober{TLSConfig: &tls.Config{RootCAs: roots, ServerName: originName}, Host: originName}
		p, err := upstream.New(upstream.Config{Prober: pr, IsLocal: func(string) bool { return false }})
		require.NoError(t, err)
		var mu sync.Mutex
		var events []upstream.Event
		p.Subscribe(func(e upstream.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		defer func() {
			cancel()
			require.NoError(t, <-done)
		}()
		require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: srv.addr}}))

		time.Sleep(5 * time.Second)
		synctest.Wait()
		st := p.Status()[0]
		assert.Equal(t, upstream.StateUnhealthy, st.State, "not quarantined: %s", st.LastError)
		assert.Contains(t, st.LastError, "not valid at the current time")
		assert.False(t, p.Healthy())

		time.Sleep(time.Until(validFrom) + 5*time.Second)
		synctest.Wait()
		st = p.Status()[0]
		assert.Equal(t, upstream.StateHealthy, st.State, "last error: %s", st.LastError)
		assert.True(t, p.Healthy())

		mu.Lock()
		defer mu.Unlock()
		var kinds []upstream.EventKind
		for _, e := range events {
			switch e.Kind {
			case upstream.EventDown:
				assert.ErrorIs(t, e.Err, upstream.ErrCertificateTime)
				assert.Equal(t, upstream.StateUnhealthy, e.State)
				fallthrough
			case upstream.EventUp:
				kinds = append(kinds, e.Kind)
			}
		}
		assert.Equal(t, []upstream.EventKind{upstream.EventDown, upstream.EventUp}, kinds)
	})
}
