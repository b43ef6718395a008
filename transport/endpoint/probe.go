package endpoint

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport/upstream"
)

// ProbeMode selects the active health check.
type ProbeMode string

const (
	// ProbeReadyz: TLS handshake verified with the cluster CA and the
	// origin's server name, then GET /readyz; healthy on 200. During a
	// graceful shutdown kube-apiserver fails /readyz while /healthz still
	// passes, so this moves clients away before the server stops.
	ProbeReadyz ProbeMode = "readyz"
	// ProbeTLS: the verified TLS handshake only.
	ProbeTLS ProbeMode = "tls"
	// ProbeTCP: a TCP connect only.
	ProbeTCP ProbeMode = "tcp"
	// ProbeHeld (the default): one HTTP/2 connection per endpoint held
	// open (verified as ProbeReadyz verifies), so that only its first
	// probe costs the server a TLS handshake. PINGs watch it (every
	// PingInterval while a request to the endpoint waits for its answer,
	// every IdlePingInterval while it carries connections, every
	// UnusedPingInterval otherwise); a PING unanswered past its timeout, past its
	// confirmation, or the connection's loss is reported to Reporter at
	// once. GET /readyz goes over it every ReadyzInterval, the probes in
	// between take the answered PINGs' word: the server's CPU a probe
	// costs is mostly serving /readyz. A server that does not negotiate
	// HTTP/2 is probed as ProbeReadyz does. See Prober.Forget and
	// Prober.Close for the connections' lifetime.
	ProbeHeld ProbeMode = "held"
)

// ParseProbeMode validates a probe mode name; "" means ProbeHeld, the
// default of NewProber and of both front ends.
func ParseProbeMode(s string) (ProbeMode, error) {
	switch m := ProbeMode(strings.ToLower(s)); m {
	case "":
		return ProbeHeld, nil
	case ProbeReadyz, ProbeHeld, ProbeTLS, ProbeTCP:
		return m, nil
	}
	return "", fmt.Errorf("invalid probe mode %q (allowed: readyz, held, tls, tcp)", s)
}

// Prober checks API server endpoints. Each probe uses a fresh connection,
// so that a server that accepts connections but no longer answers is
// caught, except with ProbeHeld, which holds one per endpoint and watches
// it with PINGs.
type Prober struct {
	// Mode is the check to run. If empty, ProbeReadyz (NewProber's
	// default is ProbeHeld).
	Mode ProbeMode
	// TLSConfig verifies the server (RootCAs, ServerName = the origin's
	// name) and may carry a client certificate. Required for readyz and tls.
	TLSConfig *tls.Config
	// Host is the Host header for /readyz (the origin's host[:port]).
	Host string
	// Authorization, if set, returns the value of the Authorization header
	// for /readyz (kube-apiserver serves /readyz to anonymous users by
	// default; clusters with anonymous auth off need credentials).
	Authorization func() string
	// DialContext, if set, opens a probe's TCP connection, e.g. to send a
	// PROXY protocol header first to endpoints behind a proxy that requires
	// one. If nil, a net.Dialer.
	DialContext func(ctx context.Context, network, address string) (net.Conn, error)
	// TLSReloadInterval is how often the files read by WithCAFile and
	// WithCredentials are checked for change, on probes. If zero,
	// DefaultTLSReloadInterval (10s).
	TLSReloadInterval time.Duration
	// Logger receives the reloads of those files and their failures. The
	// zero value discards.
	Logger logr.Logger
	// PingInterval is how often ProbeHeld PINGs the held connection of
	// an endpoint in use (see InUse). If zero, DefaultPingInterval
	// (250ms).
	PingInterval time.Duration
	// IdlePingInterval is how often ProbeHeld PINGs the held connection
	// of an endpoint that is not busy (see Busy) but carries connections
	// (see InUse). If zero, DefaultIdlePingInterval (5s); never more
	// often than PingInterval.
	IdlePingInterval time.Duration
	// UnusedPingInterval is the same for an endpoint that carries no
	// connection. If zero, 3 × IdlePingInterval (15s by default).
	UnusedPingInterval time.Duration
	// InUse, if set, reports whether addr carries connections: /readyz
	// goes every ReadyzInterval to those, every IdleReadyzInterval to the
	// others. If nil, every endpoint is in use.
	InUse func(addr string) bool
	// Busy, if set, reports whether addr has requests waiting for an
	// answer, so that its held connection is PINGed every PingInterval
	// while it has: a server that stops answering is then caught before
	// they wait long. Wake says that a request was just sent (a PING goes
	// at once, or PingInterval after the last one). Otherwise the held
	// connection is PINGed every IdlePingInterval: on this kind of
	// machine a PING costs an idle kube-apiserver about half a
	// millisecond of CPU. If nil, InUse stands in for it (nil too: every
	// endpoint is busy).
	Busy func(addr string) bool
	// Heard, if set, reports whether addr sent data on one of the
	// connections to it less than within ago, and how long ago: a PING
	// that Busy calls for waits while it has, since an answered PING
	// would say no more (a server that sends data is neither dead nor
	// cut off, and answers PINGs on the same loop). A client reading an
	// answer sends flow-control updates, which count as a request
	// waiting (see BusyWindow): without Heard, every answer would cost
	// the server PINGs every PingInterval for the next two seconds. The
	// held connection is still PINGed every IdlePingInterval.
	Heard func(addr string, within time.Duration) (ago time.Duration, ok bool)
	// ReadyzInterval is how often ProbeHeld sends GET /readyz over a
	// held connection whose PINGs are answered in time, to an endpoint in
	// use (see InUse); probes between take the PINGs' word. If zero,
	// DefaultReadyzInterval (10s).
	ReadyzInterval time.Duration
	// IdleReadyzInterval is the same for an endpoint not in use: it
	// carries no request that a server shutting down would fail, and
	// becoming in use asks again once the last answer is older than
	// ReadyzInterval. If zero, 3 × ReadyzInterval (30s by default); never
	// more often than ReadyzInterval.
	IdleReadyzInterval time.Duration
	// Reporter, if set, receives the failures ProbeHeld sees between
	// probes, when they happen: a PING unanswered in time or a connection
	// lost (upstream.FailureConnLost), a GOAWAY (upstream.FailureGoAway).
	// Usually the pool the Prober probes for. Set it before the first
	// probe. Failures of probes themselves are only returned.
	Reporter Reporter

	// held are ProbeHeld's connections.
	held heldChannels

	// files are the CA and client certificate files followed as they
	// rotate; nil if none.
	files *TLSFiles
	// sessionsGen is the files' generation the session caches belong to:
	// a resumed session presents the client certificate of its first
	// handshake and skips verification, so they are dropped on a change.
	sessionsGen atomic.Uint64

	// sessions holds a TLS session cache per endpoint, so that probes
	// resume TLS sessions (unless TLSConfig has a ClientSessionCache of
	// its own): a resumed handshake skips the certificate chain and its
	// signature checks, most of a probe's cost. A cache per endpoint
	// because crypto/tls keys sessions by server name, which every
	// endpoint shares, and only the server that issued a ticket can
	// resume it (so a resumed session is still that server).
	sessions sync.Map // endpoint address -> tls.ClientSessionCache
}

var _ upstream.Prober = (*Prober)(nil)

// WithCredentials returns a copy of p whose probes authenticate as cfg
// does: its bearer token (a token file is re-read as it rotates) and its
// client certificate (CertFile and KeyFile are re-read as they rotate,
// checked every TLSReloadInterval). For clusters that do not serve /readyz
// to anonymous users. Exec plugins and auth providers are not run for
// probes: with only those, probes stay anonymous (see Credentials). cfg's
// CA is not used; p.TLSConfig (or WithCAFile) verifies the servers.
func (p *Prober) WithCredentials(cfg *rest.Config) (*Prober, error) {
	q, err := p.withClientCert(cfg.CertFile, cfg.KeyFile, cfg.CertData, cfg.KeyData)
	if err != nil {
		return nil, fmt.Errorf("probe credentials: %w", err)
	}
	if a := Bearer(cfg); a != nil {
		q.Authorization = a
	}
	return q, nil
}

// withClientCert returns a copy of p that presents the client certificate
// of certFile and keyFile (followed as they rotate) or of certData and
// keyData (fixed), as a rest.Config's fields of those names; with none, a
// plain copy.
func (p *Prober) withClientCert(certFile, keyFile string, certData, keyData []byte) (*Prober, error) {
	q := p.copy()
	files, err := NewTLSFiles("", nil, certFile, keyFile, certData, keyData, p.TLSReloadInterval, p.Logger)
	if err != nil {
		return nil, err
	}
	if files != nil {
		if q.TLSConfig == nil {
			q.TLSConfig = &tls.Config{}
		} else {
			q.TLSConfig = q.TLSConfig.Clone()
		}
		q.files = &TLSFiles{cert: files.cert}
		if p.files != nil {
			q.files.ca = p.files.ca
		}
		q.files.Apply(q.TLSConfig)
		return q, nil
	}
	certOnly := &rest.Config{TLSClientConfig: rest.TLSClientConfig{
		CertFile: certFile, KeyFile: keyFile, CertData: certData, KeyData: keyData,
	}}
	tc, err := rest.TLSConfigFor(certOnly)
	if err != nil {
		return nil, err
	}
	if tc != nil && (len(tc.Certificates) > 0 || tc.GetClientCertificate != nil) {
		if q.TLSConfig == nil {
			q.TLSConfig = &tls.Config{}
		} else {
			q.TLSConfig = q.TLSConfig.Clone()
		}
		q.TLSConfig.Certificates = tc.Certificates
		q.TLSConfig.GetClientCertificate = tc.GetClientCertificate
	}
	return q, nil
}

// WithCAFile returns a copy of p that verifies servers with the PEM CA
// bundle in caFile instead of p.TLSConfig.RootCAs, re-read as it rotates
// (checked every TLSReloadInterval, on probes). A file that cannot be read
// or holds no certificate is an error; later, such a content is logged
// and the last good bundle kept.
func (p *Prober) WithCAFile(caFile string) (*Prober, error) {
	files, err := NewTLSFiles(caFile, nil, "", "", nil, nil, p.TLSReloadInterval, p.Logger)
	if err != nil {
		return nil, err
	}
	if files == nil {
		return nil, errors.New("no CA file given")
	}
	q := p.copy()
	if q.TLSConfig == nil {
		q.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	q.files = &TLSFiles{ca: files.ca}
	if p.files != nil {
		q.files.cert = p.files.cert
	}
	return q, nil
}

// OnCAChange runs fn after every change of the CA file of WithCAFile, in
// the goroutine that saw it, until cancel is called; for
// upstream.Pool.ResetQuarantine. It does nothing without a CA file, or
// on a nil Prober.
func (p *Prober) OnCAChange(fn func()) (cancel func()) {
	if p == nil || p.files == nil || p.files.ca == nil {
		return func() {}
	}
	return p.files.ca.subscribe(fn)
}

// WithTLSFiles returns a copy of p that follows files: their CA bundle,
// if any, verifies servers and their client certificate, if any, is
// presented (p.TLSConfig must already use it: see TLSFiles.Apply).
func (p *Prober) WithTLSFiles(files *TLSFiles) *Prober {
	q := p.copy()
	q.files = files
	return q
}

// copy returns p's settings without its session caches and held
// connections.
func (p *Prober) copy() *Prober {
	return &Prober{Mode: p.Mode, TLSConfig: p.TLSConfig, Host: p.Host, Authorization: p.Authorization, DialContext: p.DialContext,
		TLSReloadInterval: p.TLSReloadInterval, Logger: p.Logger, PingInterval: p.PingInterval, IdlePingInterval: p.IdlePingInterval, UnusedPingInterval: p.UnusedPingInterval,
		InUse: p.InUse, Busy: p.Busy, Heard: p.Heard, ReadyzInterval: p.ReadyzInterval, IdleReadyzInterval: p.IdleReadyzInterval, Reporter: p.Reporter, files: p.files}
}

// Credentials says how probes authenticate: "bearer token", "client
// certificate", both, or "none" (also for a nil Prober).
func (p *Prober) Credentials() string {
	if p == nil {
		return "none"
	}
	var kinds []string
	if p.Authorization != nil {
		kinds = append(kinds, "bearer token")
	}
	if p.TLSConfig != nil && (len(p.TLSConfig.Certificates) > 0 || p.TLSConfig.GetClientCertificate != nil) {
		kinds = append(kinds, "client certificate")
	}
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, ", ")
}

// maxProbeResponse bounds how much of a /readyz response is read.
const maxProbeResponse = 64 << 10

// Probe runs one check against addr. It honours ctx's deadline for every
// step. Certificate failures wrap upstream.ErrCertificate, or
// upstream.ErrCertificateTime when the certificate is only expired or not
// yet valid by this host's clock. With ProbeHeld, a Prober that was closed
// fails with ErrProberClosed.
func (p *Prober) Probe(ctx context.Context, addr string) error {
	_, err := p.ProbeRTT(ctx, addr)
	return err
}

// ProbeRTT is Probe, with the round trip to addr when the probe knows it
// better than by its own duration: the smoothed PING round trip of a held
// connection (ProbeHeld). Zero otherwise: the pool then times the probe.
func (p *Prober) ProbeRTT(ctx context.Context, addr string) (time.Duration, error) {
	if p.Mode == ProbeHeld {
		return p.probeHeld(ctx, addr)
	}
	return 0, p.probeFresh(ctx, addr)
}

// probeFresh probes addr over a new connection.
func (p *Prober) probeFresh(ctx context.Context, addr string) error {
	raw, err := p.dial(ctx, addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	if p.Mode == ProbeTCP {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	var protos []string
	if p.Mode != ProbeTLS {
		protos = []string{"http/1.1"}
	}
	conn, err := p.handshake(ctx, addr, raw, protos)
	if err != nil {
		return err
	}
	if p.Mode == ProbeTLS {
		return nil
	}
	return p.readyz(ctx, conn)
}

// dial opens a probe's TCP connection to addr, with DialContext if set.
func (p *Prober) dial(ctx context.Context, addr string) (net.Conn, error) {
	dial := p.DialContext
	if dial == nil {
		var nd net.Dialer
		dial = nd.DialContext
	}
	return dial(ctx, "tcp", addr)
}

// handshake runs the TLS handshake of a probe over raw, offering protos
// (ALPN; none if nil), verified with the current CA and resuming addr's
// session if it can. Certificate failures wrap upstream.ErrCertificate or
// upstream.ErrCertificateTime.
func (p *Prober) handshake(ctx context.Context, addr string, raw net.Conn, protos []string) (*tls.Conn, error) {
	cfg := p.tlsConfig()
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = p.sessionCache(addr)
	}
	if protos != nil {
		cfg.NextProtos = protos
	}
	conn := tls.Client(raw, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		if f, cerr := classifyHandshakeError(err); f != upstream.FailureTLS {
			return nil, cerr
		}
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return conn, nil
}

// tlsConfig returns a clone of TLSConfig with the current CA of the
// files, after dropping the session caches if the files changed.
func (p *Prober) tlsConfig() *tls.Config {
	if p.files == nil {
		return p.TLSConfig.Clone()
	}
	if g := p.files.generation(); p.sessionsGen.Swap(g) != g {
		p.sessions.Clear()
	}
	if p.files.ca == nil {
		return p.TLSConfig.Clone()
	}
	return p.files.Config(p.TLSConfig)
}

// sessionCache returns addr's TLS session cache.
func (p *Prober) sessionCache(addr string) tls.ClientSessionCache {
	if c, ok := p.sessions.Load(addr); ok {
		return c.(tls.ClientSessionCache)
	}
	c, _ := p.sessions.LoadOrStore(addr, tls.NewLRUClientSessionCache(1))
	return c.(tls.ClientSessionCache)
}

// readyzRequest returns a probe's GET /readyz.
func (p *Prober) readyzRequest(ctx context.Context) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+p.Host+"/readyz", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "apifailover-probe")
	if p.Authorization != nil {
		if v := p.Authorization(); v != "" {
			req.Header.Set("Authorization", v)
		}
	}
	return req, nil
}

func (p *Prober) readyz(ctx context.Context, conn net.Conn) error {
	req, err := p.readyzRequest(ctx)
	if err != nil {
		return err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return readyzFailed(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return readyzFailed(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeResponse))
	if resp.StatusCode != http.StatusOK {
		return &ReadyzError{Status: resp.StatusCode, Body: firstLine(string(body))}
	}
	return nil
}

// readyzFailed is the error of a /readyz request that got no answer over
// a completed TLS handshake.
func readyzFailed(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return &ReadyzError{TimedOut: true, Body: err.Error()}
	}
	return fmt.Errorf("GET /readyz: %w", err)
}

// ReadyzError is a /readyz answer other than 200, or none in time from a
// server that completed the TLS handshake (TimedOut). Either way the
// server process runs and answers: kube-apiserver's /readyz waits for
// etcd (up to --etcd-readycheck-timeout, 2 s), so when etcd stalls every
// apiserver answers late at once, while it still serves watches from its
// cache. Such an endpoint's connections are drained, not cut (Graceful).
// A server that does not even complete the handshake (stopped, blackholed)
// fails with a plain timeout instead.
type ReadyzError struct {
	Status   int
	Body     string
	TimedOut bool
}

func (e *ReadyzError) Error() string {
	if e.TimedOut {
		return "GET /readyz: no answer in time after the TLS handshake (up but not ready, e.g. waiting for etcd): " + e.Body
	}
	if e.Body == "" {
		return fmt.Sprintf("GET /readyz: %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("GET /readyz: %d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
}

// IsReadyzError reports whether err is a /readyz answer other than 200.
func IsReadyzError(err error) bool {
	var re *ReadyzError
	return errors.As(err, &re)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
