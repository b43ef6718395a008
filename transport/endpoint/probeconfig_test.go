package endpoint_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/endpoint"
)

// writePEM writes pki's CA, and its client certificate and key as PEM
// files, and returns their paths.
func writePEM(t *testing.T, pki *testPKI) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	key, err := x509.MarshalECPrivateKey(pki.Client.PrivateKey.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	require.NoError(t, os.WriteFile(caFile, pki.CAPEM, 0o600))
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Client.Certificate[0]}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key}), 0o600))
	return caFile, certFile, keyFile
}

// TestNewProberValidation: a ProbeConfig NewProber cannot use is a
// ProbeConfigError naming the field at fault.
func TestNewProberValidation(t *testing.T) {
	pki := newPKI(t)
	caFile, certFile, keyFile := writePEM(t, pki)
	dir := t.TempDir()
	missing, notPEM := filepath.Join(dir, "missing"), filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	files, err := endpoint.NewTLSFiles(caFile, nil, "", "", nil, nil, 0, logr.Discard())
	require.NoError(t, err)
	roots := x509.NewCertPool()

	tests := []struct {
		name  string
		cfg   endpoint.ProbeConfig
		field string
		msg   string // in the error
	}{
		{"mode", endpoint.ProbeConfig{Mode: "http", ServerName: originName}, "Mode", `invalid probe mode "http"`},
		{"no server name", endpoint.ProbeConfig{CAFile: caFile}, "ServerName", "probe mode held verifies"},
		{"no server name for tls", endpoint.ProbeConfig{Mode: endpoint.ProbeTLS, TLSConfig: &tls.Config{}}, "ServerName", "probe mode tls verifies"},
		{"no server name for held", endpoint.ProbeConfig{Mode: endpoint.ProbeHeld}, "ServerName", "probe mode held verifies"},
		{"CA file missing", endpoint.ProbeConfig{ServerName: originName, CAFile: missing}, "CAFile", missing},
		{"CA file not PEM", endpoint.ProbeConfig{ServerName: originName, CAFile: notPEM}, "CAFile", "at least one certificate"},
		{"CA file and pool", endpoint.ProbeConfig{ServerName: originName, CAFile: caFile, RootCAs: roots}, "RootCAs", "CAFile"},
		{"files and CA file", endpoint.ProbeConfig{ServerName: originName, CAFile: caFile, Files: files}, "Files", "CAFile"},
		{"files and client certificate files", endpoint.ProbeConfig{ServerName: originName, Files: files, CertFile: certFile, KeyFile: keyFile}, "Files", "CertFile"},
		{"client certificate missing", endpoint.ProbeConfig{ServerName: originName, CertFile: missing, KeyFile: keyFile}, "CertFile, KeyFile", missing},
		{"client key of another certificate", endpoint.ProbeConfig{ServerName: originName, CertFile: certFile, KeyFile: caFile}, "CertFile, KeyFile", "client certificate"},
		{"client certificate data", endpoint.ProbeConfig{ServerName: originName, CertData: []byte("x"), KeyData: []byte("y")}, "CertData, KeyData", "PEM"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := endpoint.NewProber(tc.cfg)
			assert.Nil(t, p)
			var pe *endpoint.ProbeConfigError
			require.True(t, errors.As(err, &pe), "error %v", err)
			assert.Equal(t, tc.field, pe.Field)
			assert.ErrorContains(t, err, "probe configuration: "+tc.field+": ")
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestNewProberTCP: a TCP probe only connects, through DialContext if set;
// it ignores the TLS and credential fields, files included.
func TestNewProberTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var dials atomic.Int32
	p, err := endpoint.NewProber(endpoint.ProbeConfig{
		Mode: endpoint.ProbeTCP, CAFile: filepath.Join(t.TempDir(), "missing"), BearerToken: "x",
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	require.NoError(t, err)
	assert.Equal(t, "none", p.Credentials())
	require.NoError(t, p.Probe(t.Context(), ln.Addr().String()))
	assert.Equal(t, int32(1), dials.Load())
}

// TestNewProber: probes built from a ProbeConfig verify the server with
// its CA file and authenticate with its bearer token (the file wins) or
// client certificate files; Host defaults to the server name.
func TestNewProber(t *testing.T) {
	pki := newPKI(t)
	addr, hosts := newAuthServer(t, pki)
	caFile, certFile, keyFile := writePEM(t, pki)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))

	anon, err := endpoint.NewProber(endpoint.ProbeConfig{ServerName: originName, CAFile: caFile})
	require.NoError(t, err)
	err = anon.Probe(t.Context(), addr)
	require.True(t, endpoint.IsReadyzError(err), "anonymous probe: %v", err)
	assert.Equal(t, originName, <-hosts)
	assert.Equal(t, "none", anon.Credentials())

	byToken, err := endpoint.NewProber(endpoint.ProbeConfig{ServerName: originName, Host: originName + ":6443", CAFile: caFile,
		BearerToken: "expired", BearerTokenFile: tokenFile})
	require.NoError(t, err)
	require.NoError(t, byToken.Probe(t.Context(), addr))
	assert.Equal(t, originName+":6443", <-hosts)
	assert.Equal(t, "bearer token", byToken.Credentials())

	base := &tls.Config{MinVersion: tls.VersionTLS13}
	byCert, err := endpoint.NewProber(endpoint.ProbeConfig{ServerName: originName, TLSConfig: base, CAFile: caFile, CertFile: certFile, KeyFile: keyFile})
	require.NoError(t, err)
	require.NoError(t, byCert.Probe(t.Context(), addr))
	assert.Equal(t, "client certificate", byCert.Credentials())
	assert.Equal(t, &tls.Config{MinVersion: tls.VersionTLS13}, base, "the TLSConfig given is not changed")

	// A CA pool instead of a file; the wrong name fails verification.
	roots := x509.NewCertPool()
	roots.AddCert(pki.CA)
	wrong, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeTLS, ServerName: "wrong.test", RootCAs: roots})
	require.NoError(t, err)
	assert.Error(t, wrong.Probe(t.Context(), addr))
	right, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: endpoint.ProbeTLS, ServerName: originName, RootCAs: roots})
	require.NoError(t, err)
	assert.NoError(t, right.Probe(t.Context(), addr))
}

// TestNewProberSharedFiles: with Files, probes follow the CA and client
// certificate someone else watches, presented through the TLSConfig.
func TestNewProberSharedFiles(t *testing.T) {
	pki := newPKI(t)
	addr, _ := newAuthServer(t, pki)
	caFile, certFile, keyFile := writePEM(t, pki)
	files, err := endpoint.NewTLSFiles(caFile, nil, certFile, keyFile, nil, nil, 0, logr.Discard())
	require.NoError(t, err)
	p, err := endpoint.NewProber(endpoint.ProbeConfig{ServerName: originName, TLSConfig: files.Apply(&tls.Config{}), Files: files})
	require.NoError(t, err)
	require.NoError(t, p.Probe(t.Context(), addr))
	assert.Equal(t, "client certificate", p.Credentials())

	var nilProber *endpoint.Prober
	assert.Equal(t, "none", nilProber.Credentials())
	nilProber.OnCAChange(func() {})()
}
