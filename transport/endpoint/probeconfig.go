package endpoint

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
)

// ProbeConfig is everything a Prober needs, as a front end knows it: the
// check, the origin's name, how to verify the API servers, how to
// authenticate to them and how to open a probe's connection. Wrap (from a
// rest.Config) and localproxy (from its flags) both fill one in and get
// their Prober from NewProber.
//
// The TLS and credential fields are used by ProbeReadyz, ProbeHeld and
// ProbeTLS; ProbeTCP only connects and ignores them. How often and how
// long probes run is the pool's business (upstream.Config Interval and
// Timeout): each probe gets its deadline from the context the pool gives
// it.
type ProbeConfig struct {
	// Mode is the check. If empty, ProbeHeld.
	Mode ProbeMode

	// ServerName is the name the API server certificates are verified
	// against: the origin's host, as in the clients' kubeconfig
	// tls-server-name. Required for ProbeReadyz, ProbeHeld and ProbeTLS
	// unless TLSConfig carries one.
	ServerName string
	// Host is the Host header of GET /readyz: the origin's host[:port]. If
	// empty, the server name.
	Host string
	// TLSConfig, if set, is the base of the probes' TLS configuration
	// (cloned, never changed), e.g. the client's own from
	// rest.TLSConfigFor with its client certificate. ServerName and
	// RootCAs, where set, win over its own. If nil, TLS 1.2 or later.
	TLSConfig *tls.Config

	// CAFile is a PEM bundle of the CA that signed the API server
	// certificates, re-read as it rotates (checked every
	// TLSReloadInterval, on probes). A file that cannot be read or holds
	// no certificate is an error; later, such a content is logged and the
	// last good bundle kept. Not together with RootCAs or Files.
	CAFile string
	// RootCAs, if set, verifies the API servers when they are not
	// verified with a CAFile or the CA of Files. With none of them, the
	// TLSConfig's RootCAs, or else the host's roots.
	RootCAs *x509.CertPool
	// Files are CA and client certificate files already followed
	// elsewhere, e.g. shared with a Dialer so that one rotation reaches
	// both at once: their CA, if any, verifies the servers, and TLSConfig
	// must already present their client certificate (TLSFiles.Apply). Not
	// together with CAFile, CertFile or KeyFile.
	Files *TLSFiles

	// BearerToken, if set, is sent as "Authorization: Bearer" with GET
	// /readyz (kube-apiserver serves /readyz to anonymous users by
	// default; clusters with anonymous auth off answer 401 without one).
	BearerToken string
	// BearerTokenFile, if set, holds the bearer token, read on probes and
	// re-read as it rotates; it wins over BearerToken, which is then sent
	// only while the file cannot be read (as client-go does with a
	// kubeconfig's tokenFile). It need not exist yet.
	BearerTokenFile string
	// CertFile and KeyFile are a client certificate and its key (the same
	// file will do), presented in the handshake and re-read as they rotate
	// (checked every TLSReloadInterval). Both or neither; not together
	// with CertData and KeyData, which win, as in a rest.Config.
	CertFile, KeyFile string
	// CertData and KeyData are a client certificate and its key in PEM,
	// fixed.
	CertData, KeyData []byte

	// DialContext, if set, opens a probe's TCP connection, e.g. one that
	// sends a PROXY protocol header first, for endpoints behind a proxy
	// that requires one. If nil, a net.Dialer.
	DialContext func(ctx context.Context, network, address string) (net.Conn, error)
	// TLSReloadInterval is how often CAFile, CertFile and KeyFile are
	// checked for change, on probes. If zero, DefaultTLSReloadInterval
	// (10s). Files keeps its own.
	TLSReloadInterval time.Duration
	// Logger receives the reloads of those files and their failures. The
	// zero value discards.
	Logger logr.Logger
	// PingInterval is how often ProbeHeld sends a PING on the held
	// connection of an endpoint with a request waiting for its answer (see
	// Prober.Busy, which the front end's Registry sets). If zero,
	// DefaultPingInterval (250ms). The Prober's
	// Reporter, which receives what the PINGs find, is set once the pool
	// exists.
	PingInterval time.Duration
	// IdlePingInterval is how often ProbeHeld PINGs the held connection
	// of an endpoint that carries connections, none waiting for an
	// answer. If zero, DefaultIdlePingInterval (5s).
	IdlePingInterval time.Duration
	// UnusedPingInterval is how often ProbeHeld PINGs the held connection
	// of an endpoint that carries no connection. If zero, 3 ×
	// IdlePingInterval (15s).
	UnusedPingInterval time.Duration
	// ReadyzInterval is how often ProbeHeld sends GET /readyz over a
	// held connection whose PINGs are answered, to an endpoint in use. If
	// zero, DefaultReadyzInterval (10s).
	ReadyzInterval time.Duration
	// IdleReadyzInterval is the same for an endpoint not in use. If zero,
	// 3 × ReadyzInterval (30s by default).
	IdleReadyzInterval time.Duration
}

// ProbeConfigError is a ProbeConfig that NewProber cannot build a Prober
// from: Field names the field (or fields) at fault, Err says why.
type ProbeConfigError struct {
	Field string
	Err   error
}

func (e *ProbeConfigError) Error() string {
	return "probe configuration: " + e.Field + ": " + e.Err.Error()
}

func (e *ProbeConfigError) Unwrap() error { return e.Err }

// NewProber returns the Prober c describes. It reads the CA and client
// certificate files once to check them; a field that is not usable is a
// *ProbeConfigError naming it. The Prober starts no goroutines (files are
// re-read on probes) but, with ProbeHeld, one per held connection, which
// Prober.Close stops.
func NewProber(c ProbeConfig) (*Prober, error) {
	mode, err := ParseProbeMode(string(c.Mode))
	if err != nil {
		return nil, &ProbeConfigError{Field: "Mode", Err: err}
	}
	p := &Prober{Mode: mode, DialContext: c.DialContext, TLSReloadInterval: c.TLSReloadInterval, Logger: c.Logger,
		PingInterval: c.PingInterval, IdlePingInterval: c.IdlePingInterval, UnusedPingInterval: c.UnusedPingInterval, ReadyzInterval: c.ReadyzInterval,
		IdleReadyzInterval: c.IdleReadyzInterval}
	if mode == ProbeTCP {
		return p, nil
	}
	if err := c.exclusive(); err != nil {
		return nil, err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSConfig != nil {
		tc = c.TLSConfig.Clone()
	}
	if c.ServerName != "" {
		tc.ServerName = c.ServerName
	}
	if c.RootCAs != nil {
		tc.RootCAs = c.RootCAs
	}
	if tc.ServerName == "" {
		return nil, &ProbeConfigError{Field: "ServerName", Err: fmt.Errorf("empty; probe mode %s verifies the API server certificates against the origin's name", mode)}
	}
	p.TLSConfig, p.Host = tc, c.Host
	if p.Host == "" {
		p.Host = tc.ServerName
	}
	if c.Files != nil {
		p = p.WithTLSFiles(c.Files)
	}
	if c.CAFile != "" {
		if p, err = p.WithCAFile(c.CAFile); err != nil {
			return nil, &ProbeConfigError{Field: "CAFile", Err: err}
		}
	}
	if p, err = p.withClientCert(c.CertFile, c.KeyFile, c.CertData, c.KeyData); err != nil {
		field := "CertFile, KeyFile"
		if len(c.CertData) > 0 || len(c.KeyData) > 0 {
			field = "CertData, KeyData"
		}
		return nil, &ProbeConfigError{Field: field, Err: err}
	}
	if a := bearer(c.BearerToken, c.BearerTokenFile); a != nil {
		p.Authorization = a
	}
	return p, nil
}

// exclusive reports fields set together that exclude each other.
func (c *ProbeConfig) exclusive() error {
	switch {
	case c.CAFile != "" && c.RootCAs != nil:
		return &ProbeConfigError{Field: "RootCAs", Err: errors.New("set together with CAFile; want one of them")}
	case c.Files != nil && c.CAFile != "":
		return &ProbeConfigError{Field: "Files", Err: errors.New("set together with CAFile; want one of them")}
	case c.Files != nil && (c.CertFile != "" || c.KeyFile != ""):
		return &ProbeConfigError{Field: "Files", Err: errors.New("set together with CertFile and KeyFile; want one of them")}
	}
	return nil
}
