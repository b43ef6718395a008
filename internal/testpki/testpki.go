// Package testpki makes the CA and certificates that apifailover's unit
// tests give their TLS test servers and clients. For tests only.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// OriginName is the name every test server's certificate carries, as every
// kube-apiserver certificate carries the control-plane endpoint name.
const OriginName = "origin.test"

// PKI is a CA with one serving certificate for OriginName.
type PKI struct {
	CAPEM []byte
	Cert  tls.Certificate
	// Wrong is a certificate from the same CA for another name.
	Wrong tls.Certificate
	// Client is a client certificate from the same CA for "probe-client".
	Client tls.Certificate
	CA     *x509.Certificate
}

// New makes a fresh PKI; it fails t if key generation fails.
func New(t testing.TB) *PKI {
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
	return &PKI{
		CAPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert:   leaf(OriginName, 2, x509.ExtKeyUsageServerAuth),
		Wrong:  leaf("wrong.test", 3, x509.ExtKeyUsageServerAuth),
		Client: leaf("probe-client", 4, x509.ExtKeyUsageClientAuth),
		CA:     ca,
	}
}
