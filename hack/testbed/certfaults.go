package testbed

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Serving certificate faults (CertFault values).
const (
	// CertNotYetValid: the right names and CA, NotBefore in the future.
	CertNotYetValid = "not-yet-valid"
	// CertMisnamed: signed by the real CA, valid only for WrongName.
	CertMisnamed = "misnamed"
)

// servingCert is the serving pair of one apiserver with a certificate
// fault, in files of its own.
type servingCert struct {
	pair  *keyPair
	fault string
}

// RestartNotYetValid restarts the apiserver (gracefully) with a serving
// certificate for the right names, from the bed's CA, that becomes valid
// validIn from now: until then clients fail verification ("certificate
// has expired or is not yet valid"), after it they succeed, with no
// restart. It returns the certificate's NotBefore once the server answers
// /readyz (unverified) and the EndpointSlice lists it. A restart takes
// some seconds (shutdown delay, start): pick validIn well above that.
// Undo with RestartGoodCert (Heal does).
func (s *APIServer) RestartNotYetValid(ctx context.Context, validIn time.Duration) (time.Time, error) {
	notBefore := time.Now().Add(validIn).Truncate(time.Second) // x509 times have seconds
	pair, err := newLeafValid(s.bed.pki.ca, pkix.Name{CommonName: "kube-apiserver"}, servingDNSNames(), servingIPs(),
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, notBefore, notBefore.Add(certValidity))
	if err != nil {
		return time.Time{}, err
	}
	if err := s.writeServingPair(pair, CertNotYetValid); err != nil {
		return time.Time{}, err
	}
	return notBefore, s.restartWithCert(ctx, &servingCert{pair: pair, fault: CertNotYetValid})
}

// RestartMisnamed restarts the apiserver (gracefully) with a serving
// certificate signed by the bed's CA for WrongName only: the chain
// verifies, the name does not (clients verify OriginName). Undo with
// RestartGoodCert (Heal does).
func (s *APIServer) RestartMisnamed(ctx context.Context) error {
	return s.restartWithCert(ctx, &servingCert{pair: s.bed.pki.misnamed, fault: CertMisnamed})
}

// RestartGoodCert restarts the apiserver with the shared good serving
// certificate when it has a certificate fault. No-op otherwise.
func (s *APIServer) RestartGoodCert(ctx context.Context) error {
	if s.CertFault() == "" {
		return nil
	}
	return s.restartWithCert(ctx, nil)
}

// CertFault reports the serving certificate fault: CertNotYetValid,
// CertMisnamed or "".
func (s *APIServer) CertFault() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		return ""
	}
	return s.cert.fault
}

// restartWithCert stops the server gracefully if it runs and starts it
// with cert (nil: the shared pair).
func (s *APIServer) restartWithCert(ctx context.Context, cert *servingCert) error {
	if s.Running() {
		if err := s.GracefulStop(ctx); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.cert = cert
	s.mu.Unlock()
	return s.bed.startAndWait(ctx, s)
}

// writeServingPair writes pair to files of this server's own.
func (s *APIServer) writeServingPair(pair *keyPair, what string) error {
	dir := filepath.Join(s.bed.dir, "pki")
	pair.certFile = filepath.Join(dir, fmt.Sprintf("%s-%s.crt", s.name, what))
	pair.keyFile = filepath.Join(dir, fmt.Sprintf("%s-%s.key", s.name, what))
	if err := os.WriteFile(pair.certFile, pair.certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(pair.keyFile, pair.keyPEM, 0o600)
}

// ClientCert is a client certificate from the bed's CA and its key.
type ClientCert struct {
	CertPEM, KeyPEM     []byte
	NotBefore, NotAfter time.Time
}

// IssueClientCert issues a client certificate for user in groups (the
// subject's CN and O, as kube-apiserver reads them), valid from an hour
// ago until notAfter. Group "system:masters" makes it an admin.
func (b *Bed) IssueClientCert(user string, groups []string, notAfter time.Time) (*ClientCert, error) {
	notBefore := time.Now().Add(-time.Hour)
	kp, err := newLeafValid(b.pki.ca, pkix.Name{CommonName: user, Organization: groups}, nil, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	return &ClientCert{CertPEM: kp.certPEM, KeyPEM: kp.keyPEM, NotBefore: kp.cert.NotBefore, NotAfter: kp.cert.NotAfter}, nil
}

// WriteFile writes the certificate and its key into one PEM file (use it
// as both rest.Config CertFile and KeyFile, as kubelet's
// kubelet-client-current.pem) and replaces path atomically (a rename):
// a reader sees the old pair or the new one, never a mix.
func (c *ClientCert) WriteFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(append(append([]byte(nil), c.CertPEM...), c.KeyPEM...))
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("testbed: write client certificate %s: %w", path, err)
	}
	return nil
}
