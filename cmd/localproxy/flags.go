package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// envPrefix prefixes the environment variable of every flag:
// --bind-port is also LOCALPROXY_BIND_PORT. A flag on the command line wins.
const envPrefix = "LOCALPROXY_"

// In-cluster service account files, used for discovery without
// --kubeconfig and as the probe CA without --ca-file.
var (
	serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	serviceAccountCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// defaultServerName is in the certificate of every kube-apiserver (kubeadm
// and the apiserver's own self-signed certificates alike).
const defaultServerName = "kubernetes.default.svc"

// options are the raw flag values.
type options struct {
	endpoints         string
	bindAddress       string
	bindPort          int
	healthBindAddress string
	healthPort        int
	probe             string
	caFile            string
	tlsServerName     string
	healthInterval    time.Duration
	healthTimeout     time.Duration
	rise, fall        int
	enableDiscovery   bool
	kubeconfig        string
	stateFile         string
	drainTimeout      time.Duration
	shutdownTimeout   time.Duration
	maxConnections    int
	proxyProtocol     string
	logLevel          string
	logFormat         string
	version           bool

	// from records where each set value came from: "--flag" or the
	// environment variable's name.
	from map[string]string
}

// usageError is a bad flag or environment value: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("localproxy", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.endpoints, "endpoints", "", "comma-separated API server endpoints host:port (IPv4, [IPv6] or DNS name); required")
	fs.StringVar(&o.bindAddress, "bind-address", "127.0.0.1", "comma-separated IP addresses to accept clients on, e.g. 127.0.0.1,::1")
	fs.IntVar(&o.bindPort, "bind-port", 7445, "port to accept clients on")
	fs.StringVar(&o.healthBindAddress, "health-bind-address", "127.0.0.1", "IP address of the health, metrics and status server")
	fs.IntVar(&o.healthPort, "health-port", 7446, "port of the health, metrics and status server")
	fs.StringVar(&o.probe, "probe", "readyz", "health check: readyz (verified TLS + GET /readyz), tls (verified TLS handshake) or tcp (connect only)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM file with the cluster CA that signed the API server certificates; needed by --probe=readyz and tls (default: the in-cluster service account CA if present)")
	fs.StringVar(&o.tlsServerName, "tls-server-name", "", "name the API server certificates carry, as in the clients' kubeconfig tls-server-name (default "+defaultServerName+")")
	fs.DurationVar(&o.healthInterval, "health-interval", time.Second, "time between health probe rounds (at least 1s)")
	fs.DurationVar(&o.healthTimeout, "health-timeout", 500*time.Millisecond, "timeout of one health probe (less than --health-interval)")
	fs.IntVar(&o.rise, "rise", 2, "consecutive successful probes that make an endpoint healthy")
	fs.IntVar(&o.fall, "fall", 2, "consecutive failed probes that make an endpoint unhealthy")
	fs.BoolVar(&o.enableDiscovery, "enable-discovery", false, "discover API servers from the kubernetes EndpointSlices, through this proxy")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig with the credentials for discovery and /readyz probes, and the CA for discovery (default: the in-cluster service account, if any); its server is replaced by this proxy")
	fs.StringVar(&o.stateFile, "state-file", "", "file keeping the last-known-good endpoints for a cold boot (default: none)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 0, "how long connections to an endpoint that went down or was removed may stay open; 0 closes them at once")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", localproxy.DefaultShutdownTimeout, "on SIGTERM, how long open connections may go on after the listeners close; 0 closes them at once")
	fs.IntVar(&o.maxConnections, "max-connections", localproxy.DefaultMaxConnections, "maximum concurrent client connections")
	fs.StringVar(&o.proxyProtocol, "proxy-protocol", "none", "PROXY protocol header towards the API servers: none, v1 or v2")
	fs.StringVar(&o.logLevel, "log-level", "info", "log verbosity: error, info, debug, or a number 0-10 (2: failed dials, 4: probes and connections)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: localproxy [flags]\n       localproxy status [--health-bind-address=IP] [--health-port=N] [--output=table|json]\n\n"+
			"A node-local TCP proxy on 127.0.0.1:7445 failing over across Kubernetes API servers.\n"+
			"Every flag can also be set with the environment variable %s<FLAG_NAME> (e.g. %s); the flag wins.\n\nFlags:\n", envPrefix, envName("bind-port"))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, then fills every flag not given from its
// environment variable. A value that does not parse, an unknown flag or a
// missing value is a usageError naming the input and what is allowed; the
// flag package prints nothing but -help.
func parseFlags(fs *flag.FlagSet, o *options, args []string, getenv func(string) string) error {
	err := parseChecked(fs, o, args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs)
	}
	return err
}

// parseChecked is parseFlags with every flag.Value wrapped in a
// checkedValue and the flag package silenced, which would print its own
// message and the whole usage; both are undone on return, so that -help
// lists the flags' own types and defaults.
func parseChecked(fs *flag.FlagSet, o *options, args []string, getenv func(string) string) error {
	var failed *valueError // the flag package keeps only the text of Set's error
	var wrapped []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &checkedValue{Value: f.Value, name: f.Name, failed: &failed}
		wrapped = append(wrapped, f)
	})
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() {
		for _, f := range wrapped {
			f.Value = f.Value.(*checkedValue).Value
		}
		fs.SetOutput(out)
		fs.Usage = usage
	}()

	if err := fs.Parse(args); err != nil {
		switch msg := err.Error(); {
		case errors.Is(err, flag.ErrHelp):
			return err
		case failed != nil:
			return failed.usage("--" + failed.name)
		case strings.HasPrefix(msg, "flag provided but not defined: -"):
			return usagef("unknown flag --%s; want one of the flags '%s -help' lists",
				strings.TrimPrefix(msg, "flag provided but not defined: -"), fs.Name())
		case strings.HasPrefix(msg, "flag needs an argument: -"):
			name := strings.TrimPrefix(msg, "flag needs an argument: -")
			want := "a value"
			if f := fs.Lookup(name); f != nil {
				if a := allowed(f.Value.(*checkedValue).Value, name); a != "" {
					want = a
				}
			}
			return usagef("invalid --%s: missing value; want %s", name, want)
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (flags only; the only subcommand is status, given first)", fs.Arg(0))
	}
	o.from = make(map[string]string)
	fs.Visit(func(f *flag.Flag) { o.from[f.Name] = "--" + f.Name })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := o.from[f.Name]; ok {
			return
		}
		env := envName(f.Name)
		v := getenv(env)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			var ve *valueError
			if errors.As(err, &ve) {
				errs = append(errs, ve.usage(env))
			} else {
				errs = append(errs, usagef("invalid %s: %v", input(env, f.Name, v), err))
			}
			return
		}
		o.from[f.Name] = env
	})
	return errors.Join(errs...)
}

// src names where a flag's value came from, for messages.
func (o *options) src(name string) string {
	if s, ok := o.from[name]; ok {
		return s
	}
	return "--" + name
}

// input names a value and where it came from, for messages: --rise=0, or
// LOCALPROXY_RISE=0 (--rise) when src is not the flag itself.
func input(src, name string, value any) string {
	s := src + "=" + quoteIfString(value)
	if src != "--"+name {
		s += " (--" + name + ")"
	}
	return s
}

// input names the value of flag name and where it came from.
func (o *options) input(name string, value any) string {
	return input(o.src(name), name, value)
}

// bad returns a usage error naming the flag (or variable), the value and
// what is allowed.
func (o *options) bad(name string, value any, allowed string) error {
	return usagef("invalid %s: %s", o.input(name, value), allowed)
}

// checkInt reports an int flag outside its range in intRanges.
func (o *options) checkInt(name string, n int) error {
	if r := intRanges[name]; !r.contains(n) {
		return o.bad(name, n, "want "+r.String())
	}
	return nil
}

func quoteIfString(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// config validates the options and builds the proxy configuration. Every
// problem is reported, joined.
func (o *options) config() (localproxy.Config, error) {
	var errs []error
	bad := func(name string, value any, allowed string) {
		errs = append(errs, o.bad(name, value, allowed))
	}
	var cfg localproxy.Config

	// Endpoints.
	for _, e := range splitList(o.endpoints) {
		addr, err := upstream.ParseAddr(e)
		if err != nil {
			var ae *upstream.AddrError
			msg := err.Error()
			if errors.As(err, &ae) {
				msg = ae.Msg
			}
			bad("endpoints", e, msg+"; want host:port with an IPv4 address, a bracketed IPv6 address or an RFC 1123 DNS name, and a port 1-65535")
			continue
		}
		cfg.Endpoints = append(cfg.Endpoints, addr)
	}
	if len(splitList(o.endpoints)) == 0 {
		bad("endpoints", o.endpoints, "at least one API server endpoint host:port is required")
	}

	// Listeners.
	checkInt := func(name string, n int) bool {
		if err := o.checkInt(name, n); err != nil {
			errs = append(errs, err)
			return false
		}
		return true
	}
	bindOK := checkInt("bind-port", o.bindPort)
	healthOK := checkInt("health-port", o.healthPort)
	var binds []netip.Addr
	for _, a := range splitList(o.bindAddress) {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			bad("bind-address", a, "want an IP address, e.g. 127.0.0.1 or ::1")
			continue
		}
		binds = append(binds, ip)
		cfg.ListenAddresses = append(cfg.ListenAddresses, net.JoinHostPort(ip.String(), strconv.Itoa(o.bindPort)))
	}
	if len(splitList(o.bindAddress)) == 0 {
		bad("bind-address", o.bindAddress, "want at least one IP address, e.g. 127.0.0.1")
	}
	hip, err := netip.ParseAddr(strings.TrimSpace(o.healthBindAddress))
	if err != nil {
		bad("health-bind-address", o.healthBindAddress, "want an IP address, e.g. 127.0.0.1")
	} else {
		cfg.HealthAddress = net.JoinHostPort(hip.String(), strconv.Itoa(o.healthPort))
		// One port may serve both on addresses that do not overlap; an
		// unspecified address overlaps every other.
		if bindOK && healthOK && o.bindPort == o.healthPort {
			for _, b := range binds {
				if b == hip || b.IsUnspecified() || hip.IsUnspecified() {
					errs = append(errs, usagef("invalid %s: %s is the same port, and %s overlaps %s in %s; "+
						"want a port of its own, or a health address that overlaps no bind address (0.0.0.0 and :: overlap every address)",
						o.input("health-port", o.healthPort), o.input("bind-port", o.bindPort),
						o.input("health-bind-address", o.healthBindAddress), b, o.src("bind-address")))
					break
				}
			}
		}
	}

	// Probes.
	mode, err := endpoint.ParseProbeMode(o.probe)
	if err != nil || o.probe == "" {
		bad("probe", o.probe, "want "+oneOf("readyz", "tls", "tcp"))
	}
	if o.healthInterval < time.Second {
		bad("health-interval", o.healthInterval, "want at least 1s")
	}
	if o.healthTimeout <= 0 || o.healthTimeout >= o.healthInterval {
		bad("health-timeout", o.healthTimeout, fmt.Sprintf("want more than 0 and less than %s", o.input("health-interval", o.healthInterval)))
	}
	checkInt("rise", o.rise)
	checkInt("fall", o.fall)
	serverName := strings.TrimSpace(o.tlsServerName)
	if serverName == "" {
		serverName = defaultServerName
	} else if _, err := upstream.ParseAddr(net.JoinHostPort(serverName, "1")); err != nil {
		bad("tls-server-name", o.tlsServerName, "want a DNS name or an IP address")
	}
	cfg.Origin = serverName
	var prober *endpoint.Prober
	if mode == endpoint.ProbeReadyz || mode == endpoint.ProbeTLS {
		caFile := o.caFile
		if caFile == "" && fileExists(serviceAccountCA) {
			caFile = serviceAccountCA
		}
		switch pool, err := loadCA(caFile); {
		case caFile == "":
			errs = append(errs, usagef("invalid %s: %s=%s verifies the API server certificates and needs the cluster CA; set %s (or %s), or use --probe=tcp to check TCP connects only",
				o.input("ca-file", o.caFile), o.src("probe"), mode, "--ca-file", envName("ca-file")))
		case err != nil:
			bad("ca-file", o.caFile, err.Error())
		default:
			// The CA file is re-read as it rotates (checked on probes
			// every endpoint.DefaultTLSReloadInterval).
			prober = &endpoint.Prober{
				Mode:      mode,
				TLSConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12},
				Host:      serverName,
			}
			if p, err := prober.WithCAFile(caFile); err != nil {
				bad("ca-file", o.caFile, err.Error())
			} else {
				prober = p
			}
		}
	} else if mode == endpoint.ProbeTCP {
		prober = &endpoint.Prober{Mode: mode}
	}

	// Credentials, for discovery and probes: --kubeconfig, else the
	// in-cluster service account if there is one.
	base, credErr := credentials(o.kubeconfig)
	if credErr != nil && o.kubeconfig != "" {
		bad("kubeconfig", o.kubeconfig, credErr.Error())
	}
	if prober != nil && base != nil && mode != endpoint.ProbeTCP {
		// Clusters with anonymous auth off answer /readyz with 401.
		if p, err := prober.WithCredentials(base); err != nil {
			if o.kubeconfig == "" {
				errs = append(errs, usagef("the in-cluster service account's credentials: %v; set --kubeconfig", err))
			} else {
				bad("kubeconfig", o.kubeconfig, err.Error())
			}
		} else {
			prober = p
		}
	}
	if prober != nil {
		cfg.Pool = upstream.Config{Prober: prober, Interval: o.healthInterval, Timeout: o.healthTimeout, Rise: o.rise, Fall: o.fall}
	}

	// Discovery and state.
	if o.enableDiscovery {
		switch {
		case base == nil && o.kubeconfig == "":
			bad("enable-discovery", true, fmt.Sprintf("%v; set --kubeconfig", credErr))
		case base != nil && base.Insecure:
			bad("kubeconfig", o.kubeconfig, "its cluster sets insecure-skip-tls-verify, and --enable-discovery would send its credentials to endpoints whose certificates are not verified; want a kubeconfig with certificate-authority (or -data), or no --enable-discovery")
		case base != nil && len(binds) > 0 && bindOK:
			// Discovery goes through this proxy, never the ClusterIP.
			proxyAddr := net.JoinHostPort(loopbackOf(binds).String(), strconv.Itoa(o.bindPort))
			cfg.Discovery = localproxy.DiscoveryConfig(base, proxyAddr, serverName)
		}
	}
	cfg.StateFile = o.stateFile

	// Connections.
	if o.drainTimeout < 0 {
		bad("drain-timeout", o.drainTimeout, "want 0 (close at once) or a positive duration")
	}
	cfg.DrainTimeout = o.drainTimeout
	switch {
	case o.shutdownTimeout < 0:
		bad("shutdown-timeout", o.shutdownTimeout, "want 0 (close at once) or a positive duration")
	case o.shutdownTimeout == 0:
		cfg.ShutdownTimeout = -1
	default:
		cfg.ShutdownTimeout = o.shutdownTimeout
	}
	checkInt("max-connections", o.maxConnections)
	cfg.MaxConnections = o.maxConnections
	pp, err := localproxy.ParseProxyProtocol(o.proxyProtocol)
	if err != nil {
		bad("proxy-protocol", o.proxyProtocol, "want "+oneOf("none", "v1", "v2"))
	}
	cfg.ProxyProtocol = pp

	if _, err := parseLogLevel(o.logLevel); err != nil {
		bad("log-level", o.logLevel, err.Error())
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		bad("log-format", o.logFormat, "want "+oneOf("text", "json"))
	}
	return cfg, errors.Join(errs...)
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

func loadCA(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("want a readable PEM file: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("want a PEM file with at least one CA certificate")
	}
	return pool, nil
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
