package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// In-cluster service account files, used for discovery without
// --kubeconfig and as the probe CA without --ca-file.
var (
	serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	serviceAccountCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// defaultServerName is in the certificate of every kube-apiserver (kubeadm
// and the apiserver's own self-signed certificates alike).
const defaultServerName = "kubernetes.default.svc"

// config validates the options and builds the proxy configuration. Every
// problem is reported, joined, in the order of the steps below.
func (o *options) config() (localproxy.Config, error) {
	b := &builder{options: o}
	var cfg localproxy.Config
	eps := b.endpoints()
	for _, e := range eps {
		cfg.Endpoints = append(cfg.Endpoints, localproxy.FormatEndpoint(e.spec))
	}
	l := b.listeners()
	cfg.ListenAddresses, cfg.HealthAddress = l.addrs, l.health
	b.selfEndpoints(eps, l)
	cfg.Profiling = b.profiling
	mode, modeOK := b.probeMode()
	cfg.Pool = b.probeSchedule()
	cfg.Origin = b.origin()
	cfg.Probe = b.probeTLS(mode, modeOK, cfg.Origin)
	creds, credErr := b.credentials()
	b.probeCredentials(cfg.Probe, creds)
	cfg.Discovery = b.discovery(creds, credErr, l, cfg.Origin)
	cfg.Pool.Zone, cfg.NodeName, cfg.NodeClient = b.zone(creds, cfg.Discovery, l, cfg.Origin)
	cfg.StateFile, cfg.StateFileCA = b.stateFile(cfg.Probe)
	b.connections(&cfg)
	b.failback(&cfg)
	b.liveness(&cfg)
	if o.exporter = b.export(); o.exporter != nil {
		o.exporter.origin = cfg.Origin
	}
	b.logging()
	return cfg, errors.Join(b.errs...)
}

// stateFile returns --state-file and the cluster CA bundle it is bound to:
// that of the probes (--ca-file, or the in-cluster service account's), else
// --ca-file itself (with --probe=tcp).
func (b *builder) stateFile(probe *endpoint.ProbeConfig) (string, []byte) {
	if b.options.stateFile == "" {
		return "", nil
	}
	pathOK := b.stateFilePath(b.options.stateFile)
	caFile := b.caFile
	if probe != nil && probe.CAFile != "" {
		caFile = probe.CAFile
	}
	if caFile == "" && fileExists(serviceAccountCA) {
		caFile = serviceAccountCA
	}
	if caFile == "" {
		b.add(usagef("invalid %s: the state file is bound to the cluster by its CA, and there is none; set --ca-file (or %s), or run in a pod with a service account",
			b.input("state-file", b.options.stateFile), envName("ca-file")))
		return "", nil
	}
	pemBytes, err := b.readCA(caFile)
	if err != nil {
		if caFile != b.caFile { // a bad --ca-file is reported by probeTLS
			b.add(usagef("invalid %s: the state file is bound to the cluster by its CA, and the in-cluster service account's, %s, is no CA bundle (%v); set --ca-file (or %s)",
				b.input("state-file", b.options.stateFile), caFile, err, envName("ca-file")))
		}
		return "", nil
	}
	if !pathOK {
		return "", nil
	}
	return b.options.stateFile, pemBytes
}

// stateFilePath checks --state-file at start, as each save would fail
// later (logged, not fatal): an absolute path, not a directory or other
// non-regular file, in an existing directory. Whether the proxy's user may
// write there is left to the first save.
func (b *builder) stateFilePath(path string) bool {
	const want = "want the path of a regular file (created if missing) in an existing directory, e.g. /var/lib/localproxy/state.json"
	if !filepath.IsAbs(path) {
		b.reject("state-file", path, "want an absolute path, e.g. /var/lib/localproxy/state.json")
		return false
	}
	if strings.HasSuffix(path, "/") {
		b.reject("state-file", path, "it ends in a slash; "+want)
		return false
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		b.reject("state-file", path, "it is a directory; "+want)
		return false
	} else if err == nil && !fi.Mode().IsRegular() {
		b.reject("state-file", path, fmt.Sprintf("it is not a regular file (%s); %s", fi.Mode().Type(), want))
		return false
	}
	dir := filepath.Dir(path)
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, os.ErrNotExist):
		b.reject("state-file", path, fmt.Sprintf("its directory %s does not exist; %s", dir, want))
		return false
	case errors.Is(err, syscall.ENOTDIR) || err == nil && !fi.IsDir():
		b.reject("state-file", path, fmt.Sprintf("%s is not a directory; %s", dir, want))
		return false
	case err != nil:
		b.reject("state-file", path, fmt.Sprintf("its directory: %v; %s", err, want))
		return false
	}
	return true
}

// warn keeps a warning for run to log.
func (b *builder) warn(format string, args ...any) {
	b.warnings = append(b.warnings, fmt.Sprintf(format, args...))
}

// liveness checks --liveness-threshold and --liveness-interval
// (extractedprism's flags: at least 1s each, the threshold above the
// interval), and the threshold against the health-check loop's own pace
// (localproxy.CheckLivenessThreshold), once cfg's probes are set.
func (b *builder) liveness(cfg *localproxy.Config) {
	if b.livenessThreshold != 0 {
		cfg.LivenessThreshold = b.livenessThreshold
		var lt *localproxy.LivenessThresholdError
		switch {
		case b.livenessThreshold < time.Second:
			b.reject("liveness-threshold", b.livenessThreshold, "want at least 1s")
		case errors.As(localproxy.CheckLivenessThreshold(*cfg), &lt):
			b.reject("liveness-threshold", b.livenessThreshold, "want more than "+lt.Least.String()+": "+lt.Why)
		}
	}
	if b.livenessInterval == 0 {
		return
	}
	switch {
	case b.livenessInterval < time.Second:
		b.reject("liveness-interval", b.livenessInterval, "want at least 1s")
	case b.livenessThreshold != 0 && b.livenessThreshold <= b.livenessInterval:
		b.reject("liveness-threshold", b.livenessThreshold, "want more than "+b.input("liveness-interval", b.livenessInterval))
	default:
		b.warn("%s has no effect: /healthz fails when the health-check loop, every %s, has made no probe for %s",
			b.input("liveness-interval", b.livenessInterval), b.input("health-interval", b.healthInterval), b.src("liveness-threshold"))
	}
}

// builder turns options into a localproxy.Config step by step, keeping
// every problem it finds, in order.
type builder struct {
	*options
	errs []error
	// cas are the CA files read (readCA), by path: each is read once.
	cas map[string]caRead
}

// caRead is a CA file's bundle, or why it is none.
type caRead struct {
	pem []byte
	err error
}

// readCA is readCA of path, read once per builder: probeTLS checks
// --ca-file (or the service account's CA), and stateFile binds the state
// file to the same bundle.
func (b *builder) readCA(path string) ([]byte, error) {
	if r, ok := b.cas[path]; ok {
		return r.pem, r.err
	}
	pem, err := readCA(path)
	if b.cas == nil {
		b.cas = make(map[string]caRead)
	}
	b.cas[path] = caRead{pem, err}
	return pem, err
}

// checkCA checks that path, if set, is a readable PEM file with a CA
// certificate (readCA).
func (b *builder) checkCA(path string) error {
	if path == "" {
		return nil
	}
	_, err := b.readCA(path)
	return err
}

func (b *builder) add(err error) { b.errs = append(b.errs, err) }

// reject adds a usage error naming the flag (or variable), the value and
// what is allowed.
func (b *builder) reject(name string, value any, allowed string) {
	b.add(b.bad(name, value, allowed))
}

// intOK reports whether int flag name is within its range, adding the
// problem if not.
func (b *builder) intOK(name string, n int) bool {
	if err := b.checkInt(name, n); err != nil {
		b.add(err)
		return false
	}
	return true
}

// endpoints returns the static endpoints of --endpoints, normalized:
// host:port, or host:port@zone. An address given twice (after
// normalization: host case, IPv6 spelling, a trailing dot) is refused:
// the pool keeps one entry, and one zone, per address.
func (b *builder) endpoints() []staticEndpoint {
	var eps []staticEndpoint
	first := make(map[string]string) // address -> the entry that gave it
	for _, e := range splitList(b.options.endpoints) {
		spec, err := localproxy.ParseEndpoint(e)
		var ee *localproxy.EndpointError
		switch {
		case errors.As(err, &ee) && ee.Zone:
			b.reject("endpoints", e, ee.Msg+" (host:port@zone)")
			continue
		case errors.As(err, &ee):
			b.reject("endpoints", e, ee.Msg+"; want host:port with an IPv4 address, a bracketed IPv6 address or an RFC 1123 DNS name, and a port 1-65535, optionally followed by @zone")
			continue
		case err != nil:
			b.reject("endpoints", e, err.Error())
			continue
		}
		if f, dup := first[spec.Addr]; dup {
			b.reject("endpoints", e, fmt.Sprintf("the same address, %s, as %q before it; want each API server once (one entry, with one zone, per address)", spec.Addr, f))
			continue
		}
		first[spec.Addr] = e
		eps = append(eps, staticEndpoint{in: e, spec: spec})
	}
	if len(splitList(b.options.endpoints)) == 0 {
		b.reject("endpoints", b.options.endpoints, "at least one API server endpoint host:port is required")
	}
	return eps
}

// staticEndpoint is an entry of --endpoints.
type staticEndpoint struct {
	in   string        // as given
	spec upstream.Spec // normalized
}

// listeners are the client and health addresses.
type listeners struct {
	addrs  []string     // host:port to accept clients on
	health string       // host:port of the health server; "" if invalid
	binds  []netip.Addr // the valid --bind-address IPs
	bindOK bool         // --bind-port is valid
}

// listeners returns the addresses of --bind-address, --bind-port,
// --health-bind-address and --health-port.
func (b *builder) listeners() listeners {
	var l listeners
	l.bindOK = b.intOK("bind-port", b.bindPort)
	healthOK := b.intOK("health-port", b.healthPort)
	first := make(map[netip.Addr]string) // address -> the entry that gave it
	for _, a := range splitList(b.bindAddress) {
		ip, ok := b.bindIP("bind-address", a)
		if !ok {
			continue
		}
		// SO_REUSEPORT would let a second listener bind it, which the
		// hand-over takes for a successor.
		key := localproxy.ListenIP(ip)
		if f, dup := first[key]; dup {
			b.reject("bind-address", a, fmt.Sprintf("the same address, %s, as %q before it; want each address once (two listeners on one address split its clients, and confuse the hand-over to a new localproxy; Go listens on 0.0.0.0 as on ::, for IPv4 and IPv6)", key, f))
			continue
		}
		first[key] = a
		l.binds = append(l.binds, ip)
		l.addrs = append(l.addrs, net.JoinHostPort(ip.String(), strconv.Itoa(b.bindPort)))
	}
	if len(splitList(b.bindAddress)) == 0 {
		b.reject("bind-address", b.bindAddress, "want at least one IP address or host name, e.g. 127.0.0.1 or localhost")
	}
	// Unset, the health server listens where the proxy does (on the
	// first address), as extractedprism's did.
	var hip netip.Addr
	if h := strings.TrimSpace(b.healthBindAddress); h != "" {
		var ok bool
		if hip, ok = b.bindIP("health-bind-address", h); !ok {
			return l
		}
	} else if len(l.binds) > 0 {
		hip = l.binds[0]
	} else {
		return l
	}
	l.health = net.JoinHostPort(hip.String(), strconv.Itoa(b.healthPort))
	if l.bindOK && healthOK && b.bindPort == b.healthPort {
		b.checkSharedPort(l.binds, hip)
	}
	return l
}

// bindIP returns the IP address of --bind-address or
// --health-bind-address entry a: an IP address, or a host name resolved
// at start to the address net.Listen would take for it (the first IPv4
// one, else the first). An IPv4-mapped IPv6 address is the IPv4 address
// net.Listen binds for it: ::ffff:127.0.0.1 is 127.0.0.1.
func (b *builder) bindIP(name, a string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(a); err == nil {
		return ip.Unmap(), true
	}
	if _, err := upstream.ParseAddr(net.JoinHostPort(a, "1")); err != nil {
		b.reject(name, a, "want an IP address or a host name, e.g. 127.0.0.1, ::1 or localhost")
		return netip.Addr{}, false
	}
	ips, err := lookupHost(a)
	if err != nil || len(ips) == 0 {
		b.reject(name, a, fmt.Sprintf("the host name does not resolve (%v); want an IP address or a host name that resolves, e.g. 127.0.0.1 or localhost", err))
		return netip.Addr{}, false
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), true
		}
	}
	return ips[0], true
}

// lookupHost resolves a bind address's host name.
var lookupHost = func(host string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// checkSharedPort checks that the health address overlaps no bind address
// when both use the same port: one port may serve both on addresses that
// do not overlap, and an unspecified address overlaps every other.
func (b *builder) checkSharedPort(binds []netip.Addr, health netip.Addr) {
	for _, a := range binds {
		if a == health || a.IsUnspecified() || health.IsUnspecified() {
			h := b.input("health-bind-address", b.healthBindAddress)
			if strings.TrimSpace(b.healthBindAddress) == "" {
				h = fmt.Sprintf("the health address %s (--health-bind-address unset: the first %s)", health, b.src("bind-address"))
			}
			b.add(usagef("invalid %s: %s is the same port, and %s overlaps %s in %s; "+
				"want a port of its own, or a health address that overlaps no bind address (0.0.0.0 and :: overlap every address)",
				b.input("health-port", b.healthPort), b.input("bind-port", b.bindPort), h, a, b.src("bind-address")))
			return
		}
	}
}

// probeMode returns the check of --probe, and whether it is valid.
func (b *builder) probeMode() (endpoint.ProbeMode, bool) {
	mode, err := endpoint.ParseProbeMode(b.probe)
	if err != nil || b.probe == "" {
		b.reject("probe", b.probe, "want "+oneOf("readyz", "held", "tls", "tcp"))
		return mode, false
	}
	return mode, true
}

// probeSchedule returns the pool's probe timing and thresholds:
// --health-interval, --health-timeout, --rise and --fall.
func (b *builder) probeSchedule() upstream.Config {
	if b.healthInterval < time.Second {
		b.reject("health-interval", b.healthInterval, "want at least 1s")
	}
	if b.healthTimeout <= 0 || b.healthTimeout >= b.healthInterval {
		b.reject("health-timeout", b.healthTimeout, fmt.Sprintf("want more than 0 and less than %s", b.input("health-interval", b.healthInterval)))
	}
	b.intOK("rise", b.rise)
	b.intOK("fall", b.fall)
	return upstream.Config{Interval: b.healthInterval, Timeout: b.healthTimeout, Rise: b.rise, Fall: b.fall}
}

// origin returns the API server name of --tls-server-name, or
// defaultServerName.
func (b *builder) origin() string {
	name := strings.TrimSpace(b.tlsServerName)
	if name == "" {
		return defaultServerName
	}
	if _, err := upstream.ParseAddr(net.JoinHostPort(name, "1")); err != nil {
		b.reject("tls-server-name", b.tlsServerName, "want a DNS name or an IP address")
	}
	return name
}

// probeTLS returns the probe configuration without credentials: for
// readyz and tls, the certificates are verified with --ca-file (or the
// in-cluster service account CA), re-read as it rotates, and serverName.
// It returns nil when mode is invalid or the CA is missing or bad. A
// given --ca-file and the --probe-*-interval flags are checked whatever
// the mode: with --probe=tcp the state file is bound to the cluster by
// --ca-file, and a bad value is not kept for a later change of mode.
func (b *builder) probeTLS(mode endpoint.ProbeMode, modeOK bool, serverName string) *endpoint.ProbeConfig {
	if b.probePingInterval < 0 {
		b.reject("probe-ping-interval", b.probePingInterval, "want a positive duration (0: the default, "+endpoint.DefaultPingInterval.String()+")")
	}
	if b.probeReadyzInterval < 0 {
		b.reject("probe-readyz-interval", b.probeReadyzInterval, "want a positive duration (0: the default, "+endpoint.DefaultReadyzInterval.String()+")")
	}
	if b.probeIdleReadyz < 0 {
		b.reject("probe-idle-readyz-interval", b.probeIdleReadyz, "want a positive duration (0: 3 × --probe-readyz-interval)")
	}
	caErr := b.checkCA(b.caFile)
	if caErr != nil {
		b.reject("ca-file", b.caFile, caErr.Error())
	}
	switch {
	case !modeOK:
		return nil
	case mode == endpoint.ProbeTCP:
		return &endpoint.ProbeConfig{Mode: mode}
	case caErr != nil:
		return nil
	}
	caFile := b.caFile // checked above
	if caFile == "" && fileExists(serviceAccountCA) {
		caFile = serviceAccountCA
		if err := b.checkCA(caFile); err != nil {
			b.reject("ca-file", b.caFile, err.Error())
			return nil
		}
	}
	if caFile == "" {
		b.add(usagef("invalid %s: %s=%s verifies the API server certificates and needs the cluster CA; set %s (or %s), or use --probe=tcp to check TCP connects only",
			b.input("ca-file", b.caFile), b.src("probe"), mode, "--ca-file", envName("ca-file")))
		return nil
	}
	return &endpoint.ProbeConfig{Mode: mode, ServerName: serverName, CAFile: caFile, PingInterval: b.probePingInterval,
		ReadyzInterval: b.probeReadyzInterval, IdleReadyzInterval: b.probeIdleReadyz}
}

// credentials returns the credentials for discovery and probes: those of
// --kubeconfig, else the in-cluster service account if there is one.
func (b *builder) credentials() (*rest.Config, error) {
	creds, err := credentials(b.kubeconfig)
	if err != nil && b.kubeconfig != "" {
		b.reject("kubeconfig", b.kubeconfig, err.Error())
	}
	return creds, err
}

// probeCredentials makes readyz and tls probes authenticate as creds
// (clusters with anonymous auth off answer /readyz with 401) and checks
// that pc builds a Prober. pc or creds may be nil.
func (b *builder) probeCredentials(pc *endpoint.ProbeConfig, creds *rest.Config) {
	if pc == nil || pc.Mode == endpoint.ProbeTCP {
		return
	}
	if creds != nil {
		pc.BearerToken, pc.BearerTokenFile = creds.BearerToken, creds.BearerTokenFile
		pc.CertFile, pc.KeyFile = creds.CertFile, creds.KeyFile
		pc.CertData, pc.KeyData = creds.CertData, creds.KeyData
		b.pluginCredentials(pc, creds)
	}
	_, err := endpoint.NewProber(*pc)
	var pe *endpoint.ProbeConfigError
	switch {
	case err == nil:
	case errors.As(err, &pe) && pe.Field == "CAFile":
		b.reject("ca-file", b.caFile, pe.Err.Error())
	case errors.As(err, &pe):
		err = fmt.Errorf("probe credentials: %w", pe.Err)
		if b.kubeconfig == "" {
			b.add(usagef("the in-cluster service account's credentials: %v; set --kubeconfig", err))
		} else {
			b.reject("kubeconfig", b.kubeconfig, err.Error())
		}
	default:
		b.add(err)
	}
}

// pluginCredentials warns when the probes of pc send GET /readyz without
// credentials because the kubeconfig's user has only an exec plugin or an
// auth provider, which discovery runs (client-go) and probes do not
// (endpoint.Prober.WithCredentials). Probes without any credentials are
// accepted, and so is this: clusters serve /readyz to anonymous users by
// default.
func (b *builder) pluginCredentials(pc *endpoint.ProbeConfig, creds *rest.Config) {
	if pc.Mode != endpoint.ProbeReadyz && pc.Mode != endpoint.ProbeHeld || b.kubeconfig == "" ||
		pc.BearerToken != "" || pc.BearerTokenFile != "" || pc.CertFile != "" || len(pc.CertData) > 0 {
		return
	}
	var plugin string
	switch {
	case creds.ExecProvider != nil:
		plugin = fmt.Sprintf("an exec plugin (%s)", creds.ExecProvider.Command)
	case creds.AuthProvider != nil:
		plugin = fmt.Sprintf("an auth provider (%s)", creds.AuthProvider.Name)
	default:
		return
	}
	user := "of the current context"
	if raw, err := clientcmd.LoadFromFile(b.kubeconfig); err == nil {
		if c, ok := raw.Contexts[raw.CurrentContext]; ok {
			user = strconv.Quote(c.AuthInfo)
		}
	}
	b.warn("the probes (%s) go without credentials: user %s of %s has only %s, which is run for discovery but not for probes; "+
		"clusters with anonymous auth off answer their GET /readyz with 401. Give the user a token, token file or client certificate, or use --probe=tls or tcp",
		b.input("probe", b.probe), user, b.input("kubeconfig", b.kubeconfig), plugin)
}

// discovery returns the client configuration for --enable-discovery, nil
// without it. Discovery goes through this proxy, never the ClusterIP.
func (b *builder) discovery(creds *rest.Config, credErr error, l listeners, serverName string) *rest.Config {
	if !b.enableDiscovery {
		return nil
	}
	switch {
	case creds == nil && b.kubeconfig == "":
		// A node before its kubelet has credentials, or a plain service
		// unit: serve the static endpoints rather than refuse to start.
		b.warn("discovery is off, serving %s alone: %v; set --kubeconfig, or --enable-discovery=false to silence this", b.src("endpoints"), credErr)
	case creds != nil && creds.Insecure && b.from["enable-discovery"] == "":
		b.warn("discovery is off, serving %s alone: the cluster of %s sets insecure-skip-tls-verify, and discovery would send its credentials to endpoints whose certificates are not verified; set --enable-discovery=false to silence this",
			b.src("endpoints"), b.input("kubeconfig", b.kubeconfig))
	case creds != nil && creds.Insecure:
		b.reject("kubeconfig", b.kubeconfig, "its cluster sets insecure-skip-tls-verify, and --enable-discovery would send its credentials to endpoints whose certificates are not verified; want a kubeconfig with certificate-authority (or -data), or no --enable-discovery")
	case creds != nil && len(l.binds) > 0 && l.bindOK:
		proxyAddr := net.JoinHostPort(loopbackOf(l.binds).String(), strconv.Itoa(b.bindPort))
		return localproxy.DiscoveryConfig(creds, proxyAddr, serverName)
	}
	return nil
}

// zone returns the pool's zone (--zone), and the Node to learn it from
// when there is none (--node-name, or NODE_NAME) with the client to read
// it: the discovery client if there is one, else one with the same
// credentials, through this proxy.
func (b *builder) zone(creds *rest.Config, discovery *rest.Config, l listeners, serverName string) (string, string, *rest.Config) {
	zone := strings.TrimSpace(b.options.zone)
	if zone != "" {
		if err := localproxy.CheckZone(zone); err != nil {
			b.reject("zone", b.options.zone, "the zone "+err.Error())
			return "", "", nil
		}
	}
	node := strings.TrimSpace(b.nodeName)
	if node == "" {
		return zone, "", nil
	}
	if msgs := content.IsDNS1123Subdomain(node); len(msgs) > 0 {
		b.reject("node-name", b.nodeName, "want a Node name: an RFC 1123 subdomain of at most 253 lowercase letters, digits, '-' and '.'")
		return zone, "", nil
	}
	switch {
	case zone != "":
		return zone, "", nil // --zone wins: the label is not read
	case discovery != nil:
		return "", node, discovery
	case creds == nil:
		b.warn("the zone is not learned from node %s (%s): there are no credentials to read it with; set --kubeconfig, or --zone", node, b.src("node-name"))
	case creds.Insecure:
		b.warn("the zone is not learned from node %s (%s): the cluster of %s sets insecure-skip-tls-verify, and the credentials would go to endpoints whose certificates are not verified; set --zone",
			node, b.src("node-name"), b.input("kubeconfig", b.kubeconfig))
	case len(l.binds) > 0 && l.bindOK:
		proxyAddr := net.JoinHostPort(loopbackOf(l.binds).String(), strconv.Itoa(b.bindPort))
		return "", node, localproxy.DiscoveryConfig(creds, proxyAddr, serverName)
	}
	return "", "", nil
}

// connections sets the limits of client and upstream connections:
// --drain-timeout, --first-byte-timeout, --shutdown-timeout, --handover-timeout,
// --max-connections, --gomaxprocs (applied by run), --proxy-protocol and
// --loopback-congestion-control.
func (b *builder) connections(cfg *localproxy.Config) {
	if b.drainTimeout < 0 {
		b.reject("drain-timeout", b.drainTimeout, "want 0 (close at once) or a positive duration")
	}
	cfg.DrainTimeout = b.drainTimeout
	switch {
	case b.firstByteTimeout < 0:
		b.reject("first-byte-timeout", b.firstByteTimeout, "want 0 (off) or a positive duration")
	case b.firstByteTimeout == 0:
		cfg.FirstByteTimeout = -1
	default:
		cfg.FirstByteTimeout = b.firstByteTimeout
	}
	switch {
	case b.shutdownTimeout < 0:
		b.reject("shutdown-timeout", b.shutdownTimeout, "want 0 (close at once) or a positive duration")
	case b.shutdownTimeout == 0:
		cfg.ShutdownTimeout = -1
	default:
		cfg.ShutdownTimeout = b.shutdownTimeout
	}
	switch {
	case b.handoverTimeout < 0:
		b.reject("handover-timeout", b.handoverTimeout, "want 0 (no hand-over) or a positive duration")
	case b.handoverTimeout == 0:
		cfg.HandoverTimeout = -1
	default:
		cfg.HandoverTimeout = b.handoverTimeout
	}
	b.intOK("max-connections", b.maxConnections)
	cfg.MaxConnections = b.maxConnections
	b.intOK("gomaxprocs", b.gomaxprocs)
	pp, err := localproxy.ParseProxyProtocol(b.proxyProtocol)
	if err != nil {
		b.reject("proxy-protocol", b.proxyProtocol, "want "+oneOf("none", "v1", "v2"))
	}
	cfg.ProxyProtocol = pp
	// Left at its default, the library's default applies, which gives
	// way to the system's where this process may not set it.
	if _, set := b.from["loopback-congestion-control"]; set {
		if err := localproxy.CheckCongestionControl(b.loopbackCC); err != nil {
			b.reject("loopback-congestion-control", b.loopbackCC, err.Error())
		}
		cfg.LoopbackCongestionControl = b.loopbackCC
	}
}

// logging checks --log-level and --log-format; run sets up the logger.
func (b *builder) logging() {
	if _, err := parseLogLevel(b.logLevel); err != nil {
		b.reject("log-level", b.logLevel, err.Error())
	}
	if b.logFormat != "text" && b.logFormat != "json" {
		b.reject("log-format", b.logFormat, "want "+oneOf("text", "json"))
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readCA returns the PEM bundle of path, a readable PEM file with at
// least one CA certificate; the error is for the messages of --ca-file.
func readCA(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("want a readable PEM file: %v", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, errors.New("want a PEM file with at least one CA certificate")
	}
	return b, nil
}

// credentials returns the credentials (and CA) for discovery and probes:
// from the kubeconfig, or the in-cluster service account. For discovery,
// its host is replaced by this proxy's address.
func credentials(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		if !fileExists(kubeconfig) {
			return nil, errors.New("want an existing kubeconfig file")
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("want a valid kubeconfig: %v", err)
		}
		return cfg, nil
	}
	// rest.InClusterConfig needs KUBERNETES_SERVICE_HOST, which static
	// pods lack; the host is replaced anyway.
	if !fileExists(serviceAccountToken) {
		return nil, fmt.Errorf("no in-cluster service account token at %s", serviceAccountToken)
	}
	return &rest.Config{
		BearerTokenFile: serviceAccountToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: serviceAccountCA},
	}, nil
}

// loopbackOf picks the bind address discovery connects to: a loopback one
// if there is one, the first otherwise (an unspecified address means
// loopback).
func loopbackOf(binds []netip.Addr) netip.Addr {
	for _, b := range binds {
		if b.IsLoopback() {
			return b
		}
	}
	b := binds[0]
	if b.IsUnspecified() {
		if b.Is4() {
			return netip.MustParseAddr("127.0.0.1")
		}
		return netip.IPv6Loopback()
	}
	return b
}
