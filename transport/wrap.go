package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/altsvc"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Defaults for Options fields left zero.
const (
	DefaultPingInterval = time.Second
	// DefaultPingIntervalHeld is PingInterval's default with held probes
	// (endpoint.ProbeHeld): their PINGs watch each server, and close its
	// request connections when it stops answering; the request
	// connections' own PINGs are left to catch one connection that dies
	// alone, at the held connections' idle pace.
	DefaultPingIntervalHeld      = endpoint.DefaultIdlePingInterval
	DefaultPingTimeout           = time.Second
	DefaultDiscoveryPollInterval = endpoint.DefaultDiscoveryPollInterval
)

// Options configures Wrap. The zero value is a sound default: discovery on,
// /readyz probes every second, failover in about two seconds for a server
// that stops answering and at once for one that refuses connections.
type Options struct {
	// Endpoints are extra static endpoints (host:port). The rest.Config host
	// is always one; it ranks after discovered endpoints of equal health.
	Endpoints []string
	// DisableDiscovery turns off the watch of the kubernetes EndpointSlice
	// in default. Discovery needs list and watch on
	// discovery.k8s.io/endpointslices there, or get on the core endpoints
	// "kubernetes" (node identities), which is polled instead when listing
	// slices is forbidden.
	DisableDiscovery bool
	// DiscoveryPollInterval is how often the Endpoints fallback is polled.
	// If zero, DefaultDiscoveryPollInterval (10s).
	DiscoveryPollInterval time.Duration

	// Probe selects the active health check. If empty, endpoint.ProbeHeld:
	// one HTTP/2 connection held per endpoint, PINGed every
	// ProbePingInterval while a request to the endpoint waits for its
	// answer (every 5s otherwise, 15s while no connection uses it), GET
	// /readyz over it every ProbeReadyzInterval (ProbeIdleReadyzInterval
	// while no connection uses it). One TLS handshake per endpoint
	// instead of one per probe, a server that stops answering with a
	// request waiting is down within about half a second, and the servers
	// spend about a twenty-fifth of ProbeReadyz's CPU on an idle client's
	// checks (a tenth with a connection open; README, Benchmarks).
	// endpoint.ProbeReadyz is the former default: a new TLS connection
	// and GET /readyz per probe.
	Probe endpoint.ProbeMode
	// ProbePingInterval is how often endpoint.ProbeHeld PINGs the held
	// connection of an endpoint that requests use. If zero,
	// endpoint.DefaultPingInterval (250ms).
	ProbePingInterval time.Duration
	// ProbeReadyzInterval is how often endpoint.ProbeHeld sends GET
	// /readyz over a held connection whose PINGs are answered: how soon a
	// server that starts a graceful shutdown stops getting new requests,
	// when its shutdown delay is longer (a shorter one ends with a GOAWAY,
	// which moves them). If zero, endpoint.DefaultReadyzInterval (10s).
	// It applies to the endpoints requests use.
	ProbeReadyzInterval time.Duration
	// ProbeIdleReadyzInterval is the same for the endpoints no request
	// uses; one that comes into use is asked at once if its last answer is
	// older than ProbeReadyzInterval. If zero, 3 × ProbeReadyzInterval
	// (30s by default).
	ProbeIdleReadyzInterval time.Duration
	// ProbeInterval between probe rounds. If zero, 1s.
	ProbeInterval time.Duration
	// ProbeTimeout for one probe. If zero, 1s (at most ProbeInterval).
	ProbeTimeout time.Duration
	// Rise and Fall are the consecutive successes and failures that change
	// an endpoint's health. If zero, 2 each.
	Rise, Fall int
	// Zone is this client's topology zone; same-zone endpoints are preferred
	// after local ones. If empty, zones are ignored.
	Zone string

	// StaggerDelay before a parallel attempt at the next endpoint. If zero,
	// 250ms.
	StaggerDelay time.Duration
	// AttemptTimeout bounds one connection attempt, TLS included. If zero,
	// 2s.
	AttemptTimeout time.Duration
	// DialTimeout bounds a whole connection setup across endpoints. If
	// zero, 10s.
	DialTimeout time.Duration
	// PingInterval is how long an HTTP/2 request connection may go
	// without a frame from the server before it is pinged; PingTimeout is
	// how long the ping may go unanswered before the connection is
	// closed. client-go's defaults (30s + 15s) leave a watch on a
	// blackholed server hanging for 45s. If zero, 1s and 1s (a dead
	// connection is closed within 2s), and with held probes (the
	// default) 5s and 1s: the held connection's PINGs catch a server that
	// stops answering and close its request connections, and a PING
	// every second on each idle request connection would cost the server
	// about half a millisecond of CPU each (README, Benchmarks).
	PingInterval, PingTimeout time.Duration
	// MaxAttempts bounds the endpoints one request may be sent to. If zero,
	// DefaultMaxAttempts (3).
	MaxAttempts int

	// GracefulDrainTimeout bounds how long requests (a watch) may go on
	// on the connections to a server that fails /readyz but still
	// answers, or leaves discovery while healthy: a server shutting down
	// gracefully finishes them and closes the connections itself. Those
	// connections take no new requests. A drain lifts if the server is
	// healthy again in time, and outlasts its deadline while no server is
	// healthy. If zero, endpoint.DefaultGracefulDrain (10s).
	GracefulDrainTimeout time.Duration
	// TLSReloadInterval is how often the rest.Config's CAFile, CertFile
	// and KeyFile are checked for change (content, not time stamps): a new
	// CA is used for the next handshakes and endpoints quarantined for
	// certificate errors are probed again; a new client certificate
	// retires every connection (no new requests, closed once their running
	// requests are done) so that requests move to connections presenting
	// it. Files given as data (CAData, CertData, KeyData) do not change.
	// If zero, endpoint.DefaultTLSReloadInterval (10s).
	TLSReloadInterval time.Duration

	// AltSvc, if set, also learns API servers from Alt-Svc response
	// headers, within its allowlist. See AltSvcOptions.
	AltSvc *AltSvcOptions

	// Logger receives endpoint state changes and failovers. The zero value
	// discards.
	Logger logr.Logger
	// Registerer, if set, receives the apifailover_* metrics.
	Registerer prometheus.Registerer
}

// Failover is a client-go configuration that fails over between API
// servers. Build clients from Config and HTTPClient; call Close when done.
type Failover struct {
	pool    *upstream.Pool
	dialer  *endpoint.Dialer
	tls     *endpoint.TLSFiles // nil if no TLS file may rotate
	conns   *connPool
	config  *rest.Config
	client  *http.Client
	origin  string
	proxied bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Wrap returns a Failover for cfg. Its background work (probes, discovery)
// runs until ctx is done or Close is called.
//
// The configuration returned by Config keeps cfg's host, credentials and TLS
// settings, so certificates are verified against the origin's name on every
// endpoint. It sets WrapTransport (composed with cfg's own), which replaces
// client-go's HTTP transport for requests to the origin; it does not set
// Dial, whose per-call DialHolder would defeat client-go's transport cache.
//
// Upgrade requests (exec, attach, port-forward over SPDY or WebSocket) use
// their own dialers and connect to the origin host directly, without
// failover; a failed upgrade is returned to the caller, which may retry.
//
// When an HTTP proxy applies to the origin (rest.Config.Proxy or the
// environment), requests go through the proxy unchanged: there is no direct
// endpoint to fail over to.
func Wrap(ctx context.Context, cfg *rest.Config, opts Options) (*Failover, error) {
	if cfg == nil {
		return nil, errors.New("transport: nil rest.Config")
	}
	if cfg.Transport != nil {
		return nil, errors.New("transport: rest.Config.Transport is set: failover needs to make its own connections; use WrapTransport for custom behaviour")
	}
	if err := checkInsecure(cfg, opts); err != nil {
		return nil, err
	}
	u, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport: rest.Config host %q: %w", cfg.Host, err)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("transport: rest.Config host %q: failover needs https (the certificate is what proves an endpoint is the API server)", cfg.Host)
	}
	origin := canonicalHostPort(u.Host, "443")
	statics := []upstream.Spec{{Addr: origin}}
	for _, e := range opts.Endpoints {
		addr, err := upstream.ParseAddr(e)
		if err != nil {
			return nil, fmt.Errorf("transport: Options.Endpoints: %w", err)
		}
		statics = append(statics, upstream.Spec{Addr: addr})
	}
	mode, err := endpoint.ParseProbeMode(string(opts.Probe))
	if err != nil {
		return nil, fmt.Errorf("transport: Options.Probe: %w", err)
	}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport: TLS configuration: %w", err)
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{}
	} else {
		tlsCfg = tlsCfg.Clone()
	}
	if tlsCfg.ServerName == "" {
		tlsCfg.ServerName = u.Hostname()
	}
	if len(tlsCfg.NextProtos) == 0 {
		tlsCfg.NextProtos = []string{"h2", "http/1.1"}
	}
	// client-go reloads CA and certificate files in its own dialer and
	// transport, which ours replace: follow the files here.
	files, err := endpoint.NewTLSFiles(cfg.CAFile, cfg.CAData, cfg.CertFile, cfg.KeyFile, cfg.CertData, cfg.KeyData, opts.TLSReloadInterval, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("transport: TLS configuration: %w", err)
	}
	files.Apply(tlsCfg)

	f := &Failover{origin: origin, tls: files}
	prober, err := endpoint.NewProber(endpoint.ProbeConfig{Mode: mode, TLSConfig: tlsCfg, Host: u.Host, Files: files,
		BearerToken: cfg.BearerToken, BearerTokenFile: cfg.BearerTokenFile, TLSReloadInterval: opts.TLSReloadInterval,
		PingInterval: opts.ProbePingInterval, ReadyzInterval: opts.ProbeReadyzInterval, IdleReadyzInterval: opts.ProbeIdleReadyzInterval,
		Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	f.pool, err = upstream.New(upstream.Config{
		Prober:        prober,
		Interval:      opts.ProbeInterval,
		QuietInterval: prober.QuietInterval(),
		Timeout:       opts.ProbeTimeout,
		Rise:          opts.Rise,
		Fall:          opts.Fall,
		Zone:          opts.Zone,
		Logger:        opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	// Failures seen on held probe connections between probes count at
	// once; the connection of a removed endpoint is dropped.
	prober.Reporter = f.pool
	forget := f.pool.Subscribe(func(ev upstream.Event) {
		if ev.Kind == upstream.EventRemoved {
			prober.Forget(ev.Addr)
		}
	})
	if err := f.pool.Set(upstream.SourceStatic, statics); err != nil {
		forget()
		return nil, fmt.Errorf("transport: %w", err)
	}
	m, err := newMetrics(opts.Registerer, f.pool)
	if err != nil {
		return nil, fmt.Errorf("transport: registering metrics: %w", err)
	}
	f.dialer = &endpoint.Dialer{
		Pool:           f.pool,
		TLSConfig:      tlsCfg.Clone(),
		StaggerDelay:   opts.StaggerDelay,
		AttemptTimeout: opts.AttemptTimeout,
		Timeout:        opts.DialTimeout,
		OnDial:         m.observeDial,
		Logger:         opts.Logger,
	}
	if files.HasCA() {
		dialTLS := tlsCfg.Clone()
		f.dialer.GetTLSConfig = func() *tls.Config { return files.Config(dialTLS) }
	}

	f.proxied = proxied(cfg, u)
	runCtx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	ping := DefaultPingInterval
	if mode == endpoint.ProbeHeld {
		ping = DefaultPingIntervalHeld
	}
	ht := newHTTPTransport(tlsCfg.Clone(), endpoint.OrDefault(opts.PingInterval, ping), endpoint.OrDefault(opts.PingTimeout, DefaultPingTimeout), cfg.DisableCompression)
	f.conns = newConnPool(runCtx, f.pool, f.dialer, ht, origin, opts.GracefulDrainTimeout, opts.Logger, m, prober)
	unsubscribe := f.pool.Subscribe(f.conns.onEvent)

	maxAttempts := opts.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = DefaultMaxAttempts
	}
	var learner *altsvc.Learner
	if opts.AltSvc != nil {
		if learner, err = newAltSvcLearner(opts.AltSvc, u, f.pool, opts.Logger); err != nil {
			cancel()
			unsubscribe()
			return nil, err
		}
		if f.proxied {
			learner = nil // no direct alternatives through a proxy
		}
	}
	f.config = rest.CopyConfig(cfg)
	userWrap := cfg.WrapTransport
	f.config.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if !f.proxied && !isUpgrader(rt) {
			rt = &failoverRoundTripper{conns: f.conns, next: rt, maxAttempts: maxAttempts, altUsed: learner != nil}
			if learner != nil {
				rt = learner.Wrap(rt)
			}
		}
		if userWrap != nil {
			rt = userWrap(rt)
		}
		return rt
	}
	f.client, err = rest.HTTPClientFor(f.config)
	if err != nil {
		cancel()
		unsubscribe()
		return nil, fmt.Errorf("transport: building HTTP client: %w", err)
	}
	if f.proxied {
		opts.Logger.Info("an HTTP proxy applies to the API server: failover is off", "host", u.Host)
	}

	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer prober.Close()
		defer forget()
		defer unsubscribe()
		f.pool.Run(runCtx)
	}()
	if !opts.DisableDiscovery && !f.proxied {
		d, err := newDiscoverer(f.config, f.client, f.pool, endpoint.OrDefault(opts.DiscoveryPollInterval, DefaultDiscoveryPollInterval), opts.Logger)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			d.Run(runCtx)
		}()
	}
	if files != nil {
		w := newTLSReactor(files, f.pool, f.conns, endpoint.OrDefault(opts.TLSReloadInterval, endpoint.DefaultTLSReloadInterval),
			endpoint.OrDefault(opts.DialTimeout, endpoint.DefaultDialTimeout), opts.Logger)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			w.run(runCtx)
		}()
	}
	context.AfterFunc(runCtx, f.conns.close)
	return f, nil
}

// Config returns a copy of the failover configuration. Clients built from
// it share the Failover's connections. Prefer one *http.Client for all of
// them: kubernetes.NewForConfigAndClient(f.Config(), f.HTTPClient()).
func (f *Failover) Config() *rest.Config { return rest.CopyConfig(f.config) }

// HTTPClient returns the shared HTTP client for Config.
func (f *Failover) HTTPClient() *http.Client { return f.client }

// Pool returns the endpoint pool, for status and metrics.
func (f *Failover) Pool() *upstream.Pool { return f.pool }

// Origin returns the origin host:port all requests are addressed to.
func (f *Failover) Origin() string { return f.origin }

// OpenConns returns the open HTTP connections per endpoint.
func (f *Failover) OpenConns() map[string]int { return f.conns.openConns() }

// Close stops probes and discovery, closes every connection and waits for
// the background goroutines to return. Requests after Close fail.
func (f *Failover) Close() error {
	f.once.Do(func() {
		f.cancel()
		f.wg.Wait()
		f.conns.close()
	})
	return nil
}

// isUpgrader reports round trippers that upgrade the connection (SPDY and
// WebSocket for exec, attach and port-forward); they dial themselves and
// are left alone.
func isUpgrader(rt http.RoundTripper) bool {
	_, ok := rt.(interface{ TLSClientConfig() *tls.Config })
	return ok
}

// proxied reports whether an HTTP proxy applies to the origin.
func proxied(cfg *rest.Config, u *url.URL) bool {
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	p, err := proxy(&http.Request{URL: u, Header: http.Header{}})
	return err == nil && p != nil
}

// canonicalHostPort adds the default port and normalizes IP addresses the
// way upstream.ParseAddr does, so URL hosts compare with pool addresses.
func canonicalHostPort(hostport, defPort string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = strings.Trim(hostport, "[]"), defPort
	}
	if addr, err := upstream.ParseAddr(net.JoinHostPort(host, port)); err == nil {
		return addr
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}
