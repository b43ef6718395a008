// Package localproxy is the node-local L4 proxy of apifailover: it listens
// on 127.0.0.1 (and optionally [::1]), and passes every client connection
// through, TLS untouched, to the best API server endpoint of an
// upstream.Pool. Connections to an endpoint that goes down or is removed
// are closed (or drained with a deadline), so clients such as kubelet
// reconnect to a healthy server at once. A small HTTP server reports
// liveness, readiness, Prometheus metrics and the endpoints' status.
package localproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Defaults for Config fields left zero.
const (
	DefaultListenAddress   = "127.0.0.1:7445"
	DefaultShutdownTimeout = 10 * time.Second
	DefaultIdleTimeout     = time.Hour
	DefaultHalfOpenTimeout = time.Minute
	DefaultMaxConnections  = 10000
	DefaultDiscoveryPoll   = 10 * time.Second
	// DefaultKeepAlive and DefaultUserTimeout apply to client connections
	// not on loopback; upstream connections use the endpoint.Dialer
	// defaults.
	DefaultKeepAlive = 5 * time.Second
	// GracefulDrainTimeout bounds how long connections to an endpoint that
	// fails /readyz but still answers stay open.
	GracefulDrainTimeout = 10 * time.Second
	DefaultUserTimeout   = 10 * time.Second
)

// Congestion control of client connections on loopback
// (Config.LoopbackCongestionControl).
const (
	// DefaultLoopbackCongestionControl is reno on Linux: it does not pace,
	// every Linux kernel has it, and any process may choose it unless
	// net.ipv4.tcp_allowed_congestion_control was set without it (New
	// then keeps the system's). Elsewhere it is SystemCongestionControl.
	DefaultLoopbackCongestionControl = defaultLoopbackCongestionControl
	// SystemCongestionControl leaves loopback client connections with the
	// system's default congestion control.
	SystemCongestionControl = "system"
)

// checkCongestionControl is CheckCongestionControl; tests replace it.
var checkCongestionControl = CheckCongestionControl

// maxCongestionName is the longest name of a TCP congestion control
// (TCP_CA_NAME_MAX, 16 with the terminating zero).
const maxCongestionName = 15

// checkCongestionName reports whether name could name a TCP congestion
// control: 1 to 15 lowercase letters, digits and '_'.
func checkCongestionName(name string) error {
	const rule = "1 to 15 lowercase letters, digits and '_', e.g. reno or cubic"
	if name == "" || len(name) > maxCongestionName || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	}) >= 0 {
		return fmt.Errorf("%q is no congestion control name: want %s, or %q", name, rule, SystemCongestionControl)
	}
	return nil
}

// MinFailbackRate and MaxFailbackRate bound Config.FailbackRate: a gap of
// an hour, and of a millisecond. Below about 1.1e-10 a second, 1/rate
// would not fit in a time.Duration.
const (
	MinFailbackRate = 1.0 / 3600
	MaxFailbackRate = 1000
)

// failbackOn reports whether fail-back runs.
func (c *Config) failbackOn() bool { return c.FailbackSettle > 0 && c.FailbackRate > 0 }

// ProxyProtocol selects the PROXY protocol header sent to upstreams.
type ProxyProtocol string

const (
	// ProxyProtocolNone sends no header.
	ProxyProtocolNone ProxyProtocol = ""
	// ProxyProtocolV1 sends the human-readable v1 header.
	ProxyProtocolV1 ProxyProtocol = "v1"
	// ProxyProtocolV2 sends the binary v2 header.
	ProxyProtocolV2 ProxyProtocol = "v2"
)

// ParseProxyProtocol validates a PROXY protocol version: "", "none", "v1",
// "v2" (also "1" and "2").
func ParseProxyProtocol(s string) (ProxyProtocol, error) {
	switch s {
	case "", "none", "off":
		return ProxyProtocolNone, nil
	case "v1", "1":
		return ProxyProtocolV1, nil
	case "v2", "2":
		return ProxyProtocolV2, nil
	}
	return "", fmt.Errorf("invalid PROXY protocol version %q (allowed: none, v1, v2)", s)
}

// Config configures a Proxy. Only Endpoints is required.
type Config struct {
	// Endpoints are the static API server endpoints, always in the pool:
	// host:port, optionally followed by @zone, the server's topology zone
	// (see ParseEndpoint). At least one is required. A zone given here is
	// kept when discovery, which knows none, reports the same address.
	Endpoints []string
	// Origin is the API server name clients use (the name in its
	// certificate, as set with tls-server-name in their kubeconfig). It
	// identifies the state file and is shown by /status. If empty, the
	// first endpoint's address.
	Origin string

	// ListenAddresses are the host:port addresses to accept clients on,
	// e.g. 127.0.0.1:7445 and [::1]:7445. If empty, DefaultListenAddress.
	ListenAddresses []string
	// HealthAddress is the host:port of the health, metrics and status
	// server. If empty, no health server is started.
	HealthAddress string
	// Profiling serves Go's profiles (net/http/pprof) on the health
	// server under /debug/pprof/, as Kubernetes components do with
	// --profiling: CPU and heap profiles of a running proxy, for whoever
	// can reach the health address (by default 127.0.0.1 only).
	Profiling bool
	// Listen creates the listeners. If nil, net.ListenConfig.Listen with
	// SO_REUSEPORT on Linux (and SO_REUSEADDR, so a restarted proxy
	// rebinds at once): a new proxy binds the addresses while the one it
	// replaces still serves, and the health listener is bound the same
	// way; the client listeners carry the client connections' keepalive
	// and TCP_USER_TIMEOUT, which accepted sockets inherit. A Listen of
	// the caller's own (e.g. sockets passed by systemd) is used as given,
	// and each connection it accepts is tuned.
	Listen func(ctx context.Context, network, address string) (net.Listener, error)
	// ListenersOwned says that the listeners Listen returns are the
	// proxy's until Run returns, as those it makes are: nothing else
	// closes them (sockets passed by systemd, which the proxy alone
	// holds). The event loop then accepts on them, as on its own, and
	// tunes each connection; otherwise each keeps a goroutine accepting,
	// which notices its owner's close.
	ListenersOwned bool
	// HandoverTimeout bounds how long a stopping proxy waits for a
	// successor listening on the same addresses (SO_REUSEPORT) to become
	// ready before it steers new connections to it and stops accepting;
	// see Run. With no successor it does not wait. If zero,
	// DefaultHandoverTimeout (2s); if negative, no hand-over: the
	// listeners close at once.
	HandoverTimeout time.Duration

	// Probe, if set, configures the active health checks: New builds an
	// *endpoint.Prober from it (endpoint.NewProber) for the pool, and
	// Proxy.Prober returns it. Its Logger defaults to Logger. With
	// ProxyProtocol set and no DialContext of its own, its probes send the
	// LOCAL header (see ProbeDialer). Not together with Pool.Prober.
	Probe *endpoint.ProbeConfig
	// Pool configures the endpoint pool: probe interval and timeout, rise,
	// fall, zone. Its Logger defaults to Logger. Its Prober, if set, is
	// used as given instead of one built from Probe (e.g. a fake in
	// tests): ProxyProtocol does not change its dials, and a change of its
	// CA file does not re-probe quarantined endpoints. With neither Probe
	// nor Pool.Prober, only passive signals (failed dials) change health.
	Pool upstream.Config

	// Discovery, if set, is the client configuration for watching the
	// kubernetes EndpointSlices in default (falling back to polling the
	// kubernetes Endpoints when slices are forbidden). Its Host should be
	// this proxy (see DiscoveryConfig) so discovery works before the CNI
	// does and follows the same failover. If nil, only static and state
	// file endpoints are used.
	Discovery *rest.Config
	// NodeName, if set, is the name of the Node this proxy runs on: when
	// Pool.Zone is empty, Run reads the Node's topology.kubernetes.io/zone
	// label through NodeClient and makes it the pool's zone
	// (upstream.Pool.SetZone), so that API servers in the node's zone are
	// preferred after local ones. The proxy serves meanwhile, without a
	// zone; the Node is read at start, again with a backoff (1s doubling
	// up to NodeZoneInterval) while it cannot be read or has no label,
	// and every NodeZoneInterval once it had one, following a change or
	// removal of the label. Why no zone was learned (no RBAC to get nodes,
	// no label) is logged and shown by /status. Ignored when Pool.Zone is
	// set.
	NodeName string
	// NodeClient is the client configuration for reading the Node (RBAC:
	// get nodes). Its Host should be this proxy, as Discovery's (see
	// DiscoveryConfig), so the Node is read through the proxy's own
	// upstreams. If nil, Discovery; NodeName needs one of them.
	NodeClient *rest.Config
	// NodeZoneInterval is how often the Node is read again once its zone
	// label was read. If zero, DefaultNodeZoneInterval (10m). If negative,
	// the Node is read only until its label was read once.
	NodeZoneInterval time.Duration
	// DiscoveryPollInterval is how often the Endpoints fallback is polled.
	// If zero, DefaultDiscoveryPoll (10s).
	DiscoveryPollInterval time.Duration
	// StateFile, if set, keeps the last-known-good endpoints across
	// restarts: read at start and rewritten (synced, renamed, directory
	// synced) when the healthy endpoints change. It is bound to the cluster
	// by StateFileCA and Origin: a file of another origin, or with no CA
	// fingerprint in common with StateFileCA, or from before the binding,
	// is ignored with a log line (every cluster's Origin may be
	// kubernetes.default.svc, so the origin alone tells clusters apart by
	// nothing).
	StateFile string
	// StateFileCA is the PEM bundle of the cluster CA the state file is
	// bound to (the CA that verifies the API servers): the SHA-256
	// fingerprints of its certificates are written into the file and
	// checked at load. Required with StateFile.
	StateFileCA []byte

	// DrainTimeout is how long client connections to an endpoint that went
	// down or was removed may stay open before they are closed. If zero,
	// they are closed at once, except for an endpoint that still answers
	// (it fails /readyz, or leaves the EndpointSlice while healthy: a
	// graceful shutdown): its connections are drained for at least
	// GracefulDrainTimeout.
	DrainTimeout time.Duration
	// ShutdownTimeout is how long open connections may keep going after Run's
	// context is done and the listeners are closed. If zero,
	// DefaultShutdownTimeout (10s). If negative, they are closed at once.
	ShutdownTimeout time.Duration
	// IdleTimeout closes connections that carried no data in either
	// direction for this long (Linux only; checked at about a quarter of
	// it). If zero, DefaultIdleTimeout (1h). If negative, disabled.
	IdleTimeout time.Duration
	// HalfOpenTimeout bounds how long a connection stays open after one side
	// finished sending (its EOF is passed on with a half-close). If zero,
	// DefaultHalfOpenTimeout (1m). If negative, disabled.
	HalfOpenTimeout time.Duration
	// MaxConnections bounds the concurrent client connections; more are
	// closed at once and counted as rejected. A connection the proxy
	// closed holds its client's descriptor for a second after its FIN,
	// and two of those count as one connection. If zero,
	// DefaultMaxConnections (10000). If negative, unlimited.
	MaxConnections int
	// LivenessThreshold is how long the pool's health-check loop may go
	// without starting a round or a probe before /healthz fails (a wedged
	// prober: the node's liveness probe then restarts the proxy). If zero,
	// three of the loop's longest waits between rounds (Pool.Interval, or
	// Pool.QuietInterval while every endpoint is healthy: the held
	// prober's 5s) plus the probe timeout. New refuses one the loop's own
	// pace would pass (LivenessThresholdError). If negative, the loop is
	// not checked.
	LivenessThreshold time.Duration
	// ProxyProtocol, if set, sends a PROXY protocol header with the client's
	// addresses to upstreams, for endpoints behind a shared proxy that
	// routes by SNI and requires the header. Health probes built from
	// Probe without a DialContext of its own then send the LOCAL header
	// (see ProbeDialer), so those endpoints accept them too.
	ProxyProtocol ProxyProtocol

	// KeepAlive is the TCP keepalive idle time and interval of client
	// connections that are not on loopback (a pod's, on the node's
	// address). If zero, DefaultKeepAlive (5s). If negative, off. A
	// loopback client's socket gets none: its peer cannot vanish unseen.
	KeepAlive time.Duration
	// UserTimeout is TCP_USER_TIMEOUT of client connections that are not
	// on loopback (Linux). If zero, DefaultUserTimeout (10s). If
	// negative, the system default. Since Linux 5.11 it counts a window
	// the peer keeps shut too: such a client that stops reading for that
	// long while the proxy holds data for it loses its connection, as a
	// dead one does. A loopback client's socket gets none, so a loopback
	// client that stops reading keeps its connection, as it would
	// connected directly.
	UserTimeout time.Duration
	// LoopbackCongestionControl is the TCP congestion control of client
	// connections on a loopback address (127.0.0.0/8, ::1), set with
	// TCP_CONGESTION on the proxy's own listeners, whose accepted sockets
	// inherit it, or on each such connection accepted from a Listen of
	// the caller's. A loopback connection crosses no link and meets no
	// congestion; a congestion control that paces what it sends, as BBR
	// does, only costs CPU there: with the node on BBR, downloads
	// through the proxy fell behind a direct connection's across a
	// 10 Gbit/s link, and kept up with it on reno, at about 30% less of
	// the proxy's CPU per GiB (README, "Bulk across the link"). Upstream
	// connections keep the node's choice. If empty,
	// DefaultLoopbackCongestionControl, or the system default where this
	// process may not set that one (logged); SystemCongestionControl keeps
	// the system default (net.ipv4.tcp_congestion_control). Others are
	// checked with CheckCongestionControl: New fails on one this process
	// may not set.
	LoopbackCongestionControl string
	// FirstByteTimeout is the floor of the first-byte deadline. An
	// upstream that sends nothing by the deadline after the client's first
	// bytes (a TLS ClientHello), or is reset before its first byte, is
	// silent; two silent connections within 2s make its endpoint suspect,
	// so that new connections go elsewhere until it answers again or the
	// probes mark it down. Connections already open are not cut. The
	// deadline follows the endpoint's own first-byte times, RFC 6298's
	// retransmission timeout rule doubled: max(FirstByteTimeout, 2·SRTT +
	// 4·RTTVAR), at most 3s. If zero, DefaultFirstByteTimeout (250ms). If
	// negative, upstream silence is not watched.
	FirstByteTimeout time.Duration
	// FailbackSettle is how long the endpoint the pool puts first (where
	// new connections go) must have been healthy without a break before
	// client connections to endpoints it outranks — by locality (local,
	// same zone), static last resort or RTT tier (upstream.Pool.Outranks),
	// never between equals, or being down — are moved back to it: closed one at a time,
	// oldest first (see FailbackRate), so that kubelet and the node's
	// watches reconnect to it. A flap (down and up again) starts the wait
	// over; fail-back stops as soon as that endpoint is not healthy.
	// Connections waiting for an answer are left alone. If zero,
	// DefaultFailbackSettle (30s). If negative, fail-back is off.
	FailbackSettle time.Duration
	// FailbackRate is the most client connections fail-back closes per
	// second: one at a time, each gap 1 to 1.5 times 1/FailbackRate at
	// random, the first one a random part of a gap after the settle time.
	// From 1/3600 (one an hour) to 1000; New refuses others. If zero,
	// DefaultFailbackRate (2). If negative, fail-back is off.
	FailbackRate float64

	// Upstream connections: see endpoint.Dialer for these fields and their
	// defaults (250ms, 2s, 10s, 5s, 10s).
	StaggerDelay, AttemptTimeout, DialTimeout time.Duration
	UpstreamKeepAlive, UpstreamUserTimeout    time.Duration

	// Registry receives the proxy's metrics and is served on /metrics. If
	// nil, a new registry with the Go runtime and process collectors.
	Registry *prometheus.Registry
	// Logger receives state changes and errors; per-connection lines at
	// V(4). The zero value discards.
	Logger logr.Logger

	// specs are Endpoints parsed by setDefaults.
	specs []upstream.Spec
	// prober is the Prober built from Probe by setDefaults, nil if none.
	prober *endpoint.Prober
	// health holds limits of the health server that tests shorten.
	health healthLimits
	// clientCloseGrace, if set, replaces the package's (tests).
	clientCloseGrace time.Duration
	// trimBurst and trimQuiet, if set, replace the package's (tests).
	trimBurst int
	trimQuiet time.Duration
}

func (c *Config) setDefaults() error {
	if len(c.Endpoints) == 0 {
		return errors.New("localproxy: no endpoints configured")
	}
	// Normalized in a copy: the caller's slice stays as given.
	c.Endpoints = slices.Clone(c.Endpoints)
	c.specs = make([]upstream.Spec, len(c.Endpoints))
	first := make(map[string]string, len(c.Endpoints)) // address -> the entry that gave it
	for i, e := range c.Endpoints {
		spec, err := ParseEndpoint(e)
		if err != nil {
			return fmt.Errorf("localproxy: Endpoints: %w", err)
		}
		// The pool keeps one entry, and one zone, per address.
		if f, dup := first[spec.Addr]; dup {
			return fmt.Errorf("localproxy: Endpoints: %q is the same address, %s, as %q before it; want each API server once (one entry, with one zone, per address)", e, spec.Addr, f)
		}
		first[spec.Addr] = e
		c.specs[i], c.Endpoints[i] = spec, FormatEndpoint(spec)
	}
	if c.Discovery != nil && c.Discovery.Insecure {
		return ErrInsecureDiscovery
	}
	if c.Pool.Zone != "" {
		if err := CheckZone(c.Pool.Zone); err != nil {
			return fmt.Errorf("localproxy: Pool.Zone: zone %w", err)
		}
	}
	if c.NodeName != "" && c.Pool.Zone == "" {
		if c.NodeClient == nil {
			c.NodeClient = c.Discovery
		}
		switch {
		case c.NodeClient == nil:
			return errors.New("localproxy: NodeName needs NodeClient or Discovery, the client configuration to read the Node with")
		case c.NodeClient.Insecure:
			return fmt.Errorf("localproxy: NodeClient: %w", ErrInsecureDiscovery)
		}
	}
	c.NodeZoneInterval = endpoint.OrDefault(c.NodeZoneInterval, DefaultNodeZoneInterval)
	if c.Origin == "" {
		c.Origin = c.specs[0].Addr
	}
	if len(c.ListenAddresses) == 0 {
		c.ListenAddresses = []string{DefaultListenAddress}
	}
	if err := checkListenAddresses(c.ListenAddresses); err != nil {
		return err
	}
	c.HandoverTimeout = endpoint.OrDefault(c.HandoverTimeout, DefaultHandoverTimeout)
	if c.Pool.Logger.GetSink() == nil {
		c.Pool.Logger = c.Logger.WithName("pool")
	}
	if c.DiscoveryPollInterval == 0 {
		c.DiscoveryPollInterval = DefaultDiscoveryPoll
	}
	c.ShutdownTimeout = endpoint.OrDefault(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.IdleTimeout = endpoint.OrDefault(c.IdleTimeout, DefaultIdleTimeout)
	c.HalfOpenTimeout = endpoint.OrDefault(c.HalfOpenTimeout, DefaultHalfOpenTimeout)
	c.KeepAlive = endpoint.OrDefault(c.KeepAlive, DefaultKeepAlive)
	c.UserTimeout = endpoint.OrDefault(c.UserTimeout, DefaultUserTimeout)
	if c.LoopbackCongestionControl == "" {
		// The default is no reason to refuse to start: a node that keeps
		// reno from unprivileged processes (it is not in
		// net.ipv4.tcp_allowed_congestion_control) keeps its own.
		c.LoopbackCongestionControl = DefaultLoopbackCongestionControl
		if err := checkCongestionControl(c.LoopbackCongestionControl); err != nil {
			c.LoopbackCongestionControl = SystemCongestionControl
			c.Logger.Info("client connections on loopback keep the system's TCP congestion control", "reason", err.Error())
		}
	} else if err := checkCongestionControl(c.LoopbackCongestionControl); err != nil {
		return fmt.Errorf("localproxy: LoopbackCongestionControl: %w", err)
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	c.health.setDefaults()
	c.FailbackSettle = endpoint.OrDefault(c.FailbackSettle, DefaultFailbackSettle)
	if c.FailbackRate == 0 {
		c.FailbackRate = DefaultFailbackRate
	}
	if r := c.FailbackRate; math.IsNaN(r) || math.IsInf(r, 0) || r > MaxFailbackRate || (r > 0 && r < MinFailbackRate) {
		return fmt.Errorf("localproxy: FailbackRate %v must be a number of connections per second from 1/3600 (one an hour) to %v (negative: off)", r, MaxFailbackRate)
	}
	if c.StateFile != "" && len(caFingerprints(c.StateFileCA)) == 0 {
		return errors.New("localproxy: StateFile needs StateFileCA, a PEM bundle of the cluster CA: an unbound state file could be planted by anyone or carried over from another cluster")
	}
	if c.DrainTimeout < 0 {
		return fmt.Errorf("localproxy: DrainTimeout %v must not be negative", c.DrainTimeout)
	}
	pp, err := ParseProxyProtocol(string(c.ProxyProtocol))
	if err != nil {
		return fmt.Errorf("localproxy: %w", err)
	}
	c.ProxyProtocol = pp
	if err := c.buildProber(); err != nil {
		return err
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
		c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return nil
}

// buildProber builds the Prober of Probe, with the PROXY protocol dialer
// and the logger filled in, and hands it to the pool.
func (c *Config) buildProber() error {
	if c.Probe == nil {
		return nil
	}
	if c.Pool.Prober != nil {
		return errors.New("localproxy: Probe and Pool.Prober are both set; want one of them")
	}
	pc := *c.Probe
	if pc.DialContext == nil && c.ProxyProtocol != ProxyProtocolNone {
		dial, err := ProbeDialer(c.ProxyProtocol)
		if err != nil {
			return fmt.Errorf("localproxy: %w", err)
		}
		pc.DialContext = dial
	}
	if pc.Logger.GetSink() == nil {
		pc.Logger = c.Logger.WithName("probe")
	}
	pr, err := endpoint.NewProber(pc)
	if err != nil {
		return fmt.Errorf("localproxy: %w", err)
	}
	c.prober, c.Pool.Prober = pr, pr
	if c.Pool.QuietInterval == 0 {
		c.Pool.QuietInterval = pr.QuietInterval()
	}
	return nil
}

// Prober returns the Prober New built from Config.Probe, or nil if there
// is none (a Config.Pool.Prober is not one). Its methods answer for nil:
// Credentials says "none", OnCAChange does nothing.
func (p *Proxy) Prober() *endpoint.Prober { return p.cfg.prober }

// checkListenAddresses refuses a ListenAddresses entry that is not
// host:port, and an address given twice (after IP spelling, IPv4-mapped
// IPv6 as the IPv4 address net.Listen binds, the wildcard 0.0.0.0, :: or
// none as the one dual-stack socket net.Listen binds for each, host name
// case and a trailing dot, port spelling): the proxy's listeners use SO_REUSEPORT,
// so the second would bind beside the first, split its clients, and be
// taken by a hand-over for a successor. Port 0 (any free port) may
// repeat: each entry gets its own port.
func checkListenAddresses(addrs []string) error {
	first := make(map[string]string, len(addrs)) // normalized -> the entry that gave it
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("localproxy: ListenAddresses: %q: want host:port, e.g. 127.0.0.1:7445 or [::1]:7445: %w", a, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			if n == 0 {
				continue
			}
			port = strconv.FormatUint(n, 10)
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			host = ListenIP(ip).String()
		} else if host == "" {
			host = "::"
		} else {
			host = strings.ToLower(strings.TrimSuffix(host, "."))
		}
		key := net.JoinHostPort(host, port)
		if f, dup := first[key]; dup {
			return fmt.Errorf("localproxy: ListenAddresses: %q is the same address, %s, as %q before it; want each address once (two listeners on one address split its clients, and confuse the hand-over to a new localproxy)", a, key, f)
		}
		first[key] = a
	}
	return nil
}

// ListenIP is the address net.Listen("tcp", ...) binds for ip: an
// IPv4-mapped one as the IPv4 address, a wildcard, 0.0.0.0 or ::, as ::,
// one dual-stack socket for IPv4 and IPv6 alike.
func ListenIP(ip netip.Addr) netip.Addr {
	if ip.IsUnspecified() {
		return netip.IPv6Unspecified()
	}
	return ip.Unmap()
}
