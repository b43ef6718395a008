package testbed

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Names and addresses baked into the certificates.
const (
	// OriginName is the control-plane endpoint name every apiserver
	// certificate carries; clients verify against it (tls-server-name).
	OriginName = "control-plane.apifailover.test"
	// WrongName is the only name in the poisoning certificates.
	WrongName = "wrong.example.test"
	// ServiceIP is the first address of --service-cluster-ip-range, the
	// ClusterIP of the kubernetes Service.
	ServiceIP = "10.96.0.1"
	// ServiceCIDR is --service-cluster-ip-range.
	ServiceCIDR = "10.96.0.0/24"
)

// certValidity is generous: a bed lives for one test run.
const certValidity = 7 * 24 * time.Hour

// keyPair is a certificate with its key, in memory and as PEM files.
type keyPair struct {
	cert     *x509.Certificate
	key      crypto.Signer
	certPEM  []byte
	keyPEM   []byte
	certFile string
	keyFile  string
}

// tlsCertificate returns the pair for a tls.Config.
func (k *keyPair) tlsCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{k.cert.Raw}, PrivateKey: k.key, Leaf: k.cert}
}

// pki is every key and certificate a bed uses, generated in Go (no openssl).
type pki struct {
	ca      *keyPair // signs serving and client certificates
	serving *keyPair // shared by all apiservers
	sa      *keyPair // service-account signing key (cert unused)

	wrongCA   *keyPair // an unrelated CA
	wrong     *keyPair // WrongName, signed by wrongCA
	misnamed  *keyPair // WrongName, signed by the real CA
	clientCAs []byte   // PEM bundle for --client-ca-file
}

// servingIPs are the IP SANs of the apiserver certificate: every address
// the bed can hand out plus the kubernetes Service ClusterIP. Like kubeadm,
// no loopback address.
func servingIPs() []net.IP {
	ips := []net.IP{net.ParseIP(ServiceIP)}
	for k := 1; k <= MaxAPIServers; k++ {
		ips = append(ips, net.ParseIP(apiserverHost(k)))
	}
	return ips
}

// servingDNSNames are the DNS SANs of the apiserver certificate.
func servingDNSNames() []string {
	return []string{
		OriginName,
		"kubernetes",
		"kubernetes.default",
		"kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local",
	}
}

// newPKI generates all key material and writes it under dir/pki.
func newPKI(dir string) (*pki, error) {
	dir = filepath.Join(dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var p pki
	var err error
	if p.ca, err = newCA("apifailover-testbed-ca"); err != nil {
		return nil, err
	}
	if p.serving, err = newLeaf(p.ca, "kube-apiserver", servingDNSNames(), servingIPs(),
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}); err != nil {
		return nil, err
	}
	if p.sa, err = newCA("service-accounts"); err != nil { // only the key is used
		return nil, err
	}
	if p.wrongCA, err = newCA("apifailover-testbed-wrong-ca"); err != nil {
		return nil, err
	}
	if p.wrong, err = newLeaf(p.wrongCA, WrongName, []string{WrongName}, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}); err != nil {
		return nil, err
	}
	if p.misnamed, err = newLeaf(p.ca, WrongName, []string{WrongName}, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}); err != nil {
		return nil, err
	}
	p.clientCAs = p.ca.certPEM

	for name, kp := range map[string]*keyPair{
		"ca": p.ca, "apiserver": p.serving, "sa": p.sa,
		"wrong-ca": p.wrongCA, "wrong": p.wrong, "misnamed": p.misnamed,
	} {
		kp.certFile = filepath.Join(dir, name+".crt")
		kp.keyFile = filepath.Join(dir, name+".key")
		if err := os.WriteFile(kp.certFile, kp.certPEM, 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(kp.keyFile, kp.keyPEM, 0o600); err != nil {
			return nil, err
		}
	}
	return &p, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newCA(cn string) (*keyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"apifailover testbed"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	return sign(tmpl, tmpl, key, key)
}

func newLeaf(ca *keyPair, cn string, dns []string, ips []net.IP, usage []x509.ExtKeyUsage) (*keyPair, error) {
	now := time.Now()
	return newLeafValid(ca, pkix.Name{CommonName: cn}, dns, ips, usage, now.Add(-time.Hour), now.Add(certValidity))
}

// newLeafValid is newLeaf with a subject and validity of the caller's.
func newLeafValid(ca *keyPair, subject pkix.Name, dns []string, ips []net.IP, usage []x509.ExtKeyUsage, notBefore, notAfter time.Time) (*keyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	return sign(tmpl, ca.cert, key, ca.key)
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) (*keyPair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// certPool returns a pool holding only kp's certificate.
func certPool(kp *keyPair) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(kp.cert)
	return pool
}
