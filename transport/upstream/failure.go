package upstream

import (
	"crypto/x509"
	"errors"
	"strconv"
	"syscall"
)

// Failure classifies a passive failure seen on real traffic.
type Failure uint8

const (
	// FailureDial: the TCP connect failed or timed out.
	FailureDial Failure = iota + 1
	// FailureTLS: the TLS handshake failed for a reason other than the
	// certificate (reset, timeout).
	FailureTLS
	// FailureCertificate: the server's certificate did not verify. The
	// endpoint is quarantined, unless the error is a time-validity one
	// (IsCertificateTimeError), which counts like FailureCertificateTime.
	FailureCertificate
	// FailureConnLost: an established connection died (read error, ping
	// timeout) without the pool asking for it.
	FailureConnLost
	// FailureGoAway: the server sent GOAWAY (graceful shutdown or load
	// shedding). The endpoint is ranked lower until a probe succeeds; it is
	// not counted towards Fall.
	FailureGoAway
	// FailureCertificateTime: the server's certificate is expired or not yet
	// valid by this host's clock (see ErrCertificateTime). Counted like
	// FailureTLS, towards Fall: a clock that is wrong at boot, or a
	// certificate renewed a moment late, is transient.
	FailureCertificateTime
	// FailureSilent: connections to the endpoint got no byte back within
	// their first-byte deadline after the client spoke, or were reset
	// before their first byte (see localproxy). The endpoint is suspect at
	// once, so new connections go elsewhere, and probed early; it is not
	// counted towards Fall: a silence is not proof, the probes decide.
	// ReportAnswered lifts the suspicion, and so does a probe asked after
	// it (see Suspected), not one under way when it came.
	FailureSilent
)

// String returns the failure name used in logs and metrics labels.
func (f Failure) String() string {
	switch f {
	case FailureDial:
		return "dial"
	case FailureTLS:
		return "tls"
	case FailureCertificate:
		return "certificate"
	case FailureConnLost:
		return "conn_lost"
	case FailureGoAway:
		return "goaway"
	case FailureCertificateTime:
		return "certificate_time"
	case FailureSilent:
		return "silent"
	}
	return "failure(" + strconv.Itoa(int(f)) + ")"
}

// ErrCertificate marks probe errors caused by a certificate that does not
// verify. A Prober wraps such errors so that errors.Is(err, ErrCertificate)
// holds; the pool then quarantines the endpoint, unless the error is a
// time-validity one (IsCertificateTimeError).
var ErrCertificate = errors.New("certificate verification failed")

// ErrCertificateTime marks probe errors caused by a certificate that is
// expired or not yet valid by this host's clock, and otherwise unchecked
// (crypto/x509 checks a certificate's validity period before its chain and
// names). A Prober wraps such errors with it instead of ErrCertificate. The
// pool counts them as ordinary failures: the endpoint becomes unhealthy and
// is probed every interval, so it returns as soon as the clock or the
// certificate is right (a node booting with its clock behind, a VM restored
// from a snapshot, a certificate renewed a moment late).
var ErrCertificateTime = errors.New("certificate not valid at the current time")

// IsCertificateTimeError reports whether err is a certificate failure caused
// by the validity period only: it wraps ErrCertificateTime or an
// x509.CertificateInvalidError with Reason x509.Expired (which crypto/x509
// uses for "not yet valid" as well as for "expired").
func IsCertificateTimeError(err error) bool {
	if errors.Is(err, ErrCertificateTime) {
		return true
	}
	var ci x509.CertificateInvalidError
	return errors.As(err, &ci) && ci.Reason == x509.Expired
}

// IsLocalError reports whether err is this host running out of a
// resource (file descriptors, kernel buffers, memory): it says nothing
// about the endpoint, so the pool does not count it, and a proxy at its
// descriptor limit does not cut the connections of a healthy server.
func IsLocalError(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}
