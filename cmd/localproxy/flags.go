package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	flag "github.com/spf13/pflag"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
)

// envPrefix prefixes the environment variable of every flag:
// --bind-port is also LOCALPROXY_BIND_PORT. A flag on the command line wins.
const envPrefix = "LOCALPROXY_"

// options are the raw flag values.
type options struct {
	endpoints           string
	zone                string
	nodeName            string
	bindAddress         string
	bindPort            int
	healthBindAddress   string
	healthPort          int
	probe               string
	caFile              string
	tlsServerName       string
	healthInterval      time.Duration
	healthTimeout       time.Duration
	rise, fall          int
	enableDiscovery     bool
	profiling           bool
	kubeconfig          string
	stateFile           string
	drainTimeout        time.Duration
	firstByteTimeout    time.Duration
	probePingInterval   time.Duration
	probeReadyzInterval time.Duration
	probeIdleReadyz     time.Duration
	shutdownTimeout     time.Duration
	handoverTimeout     time.Duration
	maxConnections      int
	gomaxprocs          int
	proxyProtocol       string
	loopbackCC          string
	logLevel            string
	logFormat           string
	version             bool
	livenessInterval    time.Duration
	livenessThreshold   time.Duration
	exportTemplate      string
	exportFile          string
	exportCommand       string
	exportDebounce      time.Duration
	failbackSettle      time.Duration
	failbackRate        float64

	// exporter is the export config built; nil without --export-template.
	exporter *exporter

	// warnings are what config found worth saying but not refusing; run
	// logs them once the logger exists.
	warnings []string

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

// envAliases are further environment variables of flags, read when
// neither the flag nor its LOCALPROXY_ variable is set.
var envAliases = map[string]string{"node-name": "NODE_NAME"}

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("localproxy", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.endpoints, "endpoints", "", "comma-separated API server endpoints host:port (IPv4, [IPv6] or DNS name), each optionally followed by @zone, its topology zone (e.g. 10.0.0.1:6443@zone-a); required")
	fs.StringVar(&o.zone, "zone", "", "this node's topology zone: API servers in it (by their @zone in --endpoints, or discovered with one) are preferred after local ones (default: the topology.kubernetes.io/zone label of --node-name's Node, else none)")
	fs.StringVar(&o.nodeName, "node-name", "", "the Node this proxy runs on (also read from NODE_NAME, as the DaemonSet sets it): without --zone, its topology.kubernetes.io/zone label becomes the zone, read through this proxy with the credentials of --kubeconfig or the service account (RBAC: get nodes) at start and every 10m; the proxy serves meanwhile")
	fs.StringVar(&o.bindAddress, "bind-address", "127.0.0.1", "comma-separated IP addresses (or host names, resolved at start) to accept clients on, e.g. 127.0.0.1,::1")
	fs.IntVar(&o.bindPort, "bind-port", 7445, "port to accept clients on")
	fs.StringVar(&o.healthBindAddress, "health-bind-address", "", "IP address or host name of the health, metrics and status server (default: the first --bind-address)")
	fs.IntVar(&o.healthPort, "health-port", 7446, "port of the health, metrics and status server")
	fs.StringVar(&o.probe, "probe", "held", "health check: held (one verified HTTP/2 connection held per API server, PINGed every --probe-ping-interval while it carries connections, GET /readyz over it every --probe-readyz-interval: a server that stops answering is noticed between probes, and the handshake and /readyz are not paid every second), readyz (verified TLS + GET /readyz on a new connection every probe), tls (verified TLS handshake) or tcp (connect only)")
	fs.DurationVar(&o.probePingInterval, "probe-ping-interval", 0, "with --probe=held, how often the held connection of an API server is PINGed while a client's request to it waits for its answer (default "+endpoint.DefaultPingInterval.String()+"; otherwise every "+endpoint.DefaultIdlePingInterval.String()+", every "+endpoint.DefaultUnusedPingInterval.String()+" with no client connection)")
	fs.DurationVar(&o.probeReadyzInterval, "probe-readyz-interval", 0, "with --probe=held, how often GET /readyz is sent over the held connection, whose PINGs are answered, of an API server that carries connections (default "+endpoint.DefaultReadyzInterval.String()+")")
	fs.DurationVar(&o.probeIdleReadyz, "probe-idle-readyz-interval", 0, "with --probe=held, the same for an API server that carries none (default 3 × --probe-readyz-interval, "+endpoint.DefaultIdleReadyzInterval.String()+")")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM file with the cluster CA that signed the API server certificates; needed by --probe=readyz, held and tls, and by --state-file, which is bound to it; checked whatever --probe (default: the in-cluster service account CA if present)")
	fs.StringVar(&o.tlsServerName, "tls-server-name", "", "name the API server certificates carry, as in the clients' kubeconfig tls-server-name (default "+defaultServerName+")")
	fs.DurationVar(&o.healthInterval, "health-interval", time.Second, "time between health probe rounds (at least 1s)")
	fs.DurationVar(&o.healthTimeout, "health-timeout", 500*time.Millisecond, "timeout of one health probe (less than --health-interval)")
	fs.IntVar(&o.rise, "rise", 2, "consecutive successful probes that make an endpoint healthy")
	fs.IntVar(&o.fall, "fall", 2, "consecutive failed probes that make an endpoint unhealthy")
	fs.BoolVar(&o.enableDiscovery, "enable-discovery", true, "discover API servers from the kubernetes EndpointSlices, through this proxy, with the credentials of --kubeconfig or the in-cluster service account; with neither, the proxy starts on --endpoints alone and says so")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig with the credentials for discovery and /readyz probes, and the CA for discovery (default: the in-cluster service account, if any); its server is replaced by this proxy")
	fs.StringVar(&o.stateFile, "state-file", "", "file keeping the last-known-good endpoints for a cold boot: an absolute path in an existing directory, the file itself created if missing (default: none)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 0, "how long connections to an endpoint that went down or was removed may stay open; 0 closes them at once")
	fs.DurationVar(&o.firstByteTimeout, "first-byte-timeout", localproxy.DefaultFirstByteTimeout, "least time an API server may take to send its first byte after a client's first bytes; two connections past it within 2s make the server suspect, so new connections go elsewhere (the deadline grows with the server's own first-byte times); 0 turns the watch off")
	fs.DurationVar(&o.handoverTimeout, "handover-timeout", localproxy.DefaultHandoverTimeout, "on SIGTERM, when a new localproxy listens on the same addresses (SO_REUSEPORT: a DaemonSet surge pod, an upgrade), how long to wait for its /readyz before handing new connections to it and closing the listeners; 0: no hand-over")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", localproxy.DefaultShutdownTimeout, "on SIGTERM, how long open connections may go on after the listeners close; 0 closes them at once")
	fs.IntVar(&o.maxConnections, "max-connections", localproxy.DefaultMaxConnections, "maximum concurrent client connections")
	fs.IntVar(&o.gomaxprocs, "gomaxprocs", defaultGOMAXPROCS, "how many threads run the proxy's Go code at once (GOMAXPROCS): one for the event loop that copies the connections, the others for the rest; with 1 the loop waits through Go's network poller, which costs more CPU per request. 0: Go's default, the CPUs or the container's CPU limit; at most "+strconv.Itoa(maxGOMAXPROCS)+". Without this flag, a GOMAXPROCS environment variable is kept")
	fs.StringVar(&o.proxyProtocol, "proxy-protocol", "none", "PROXY protocol header towards the API servers: none, v1 or v2")
	fs.StringVar(&o.loopbackCC, "loopback-congestion-control", localproxy.DefaultLoopbackCongestionControl, "TCP congestion control of client connections on a loopback address (127.0.0.1, ::1), which cross no link: reno does not pace, where a node default such as BBR spends the proxy's CPU pacing them; one of net.ipv4.tcp_allowed_congestion_control, or system to keep net.ipv4.tcp_congestion_control. Connections to the API servers keep the node's default")
	fs.StringVar(&o.logLevel, "log-level", "info", "log verbosity: error, info, debug, or a number 0-10 (2: failed dials, 4: probes and connections); extractedprism's warn, dpanic, panic and fatal are taken as error")
	fs.DurationVar(&o.livenessThreshold, "liveness-threshold", 0, "how long the health-check loop may go without a probe before /healthz fails (default 3 × the longest wait between probe rounds, --health-interval or, with --probe=held while every API server is healthy, 5s, + --health-timeout; must exceed that wait, +10%, + --health-timeout)")
	fs.DurationVar(&o.livenessInterval, "liveness-interval", 0, "accepted from extractedprism, no effect: the liveness heartbeat is the health-check loop itself, every --health-interval")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.exportTemplate, "export-template", "", "Go text/template file rendering the healthy API servers (.Endpoints: .Addr .Host .Port .Name .Zone; .Origin) into --export-file on every change, for an external load balancer's backends (templates for HAProxy and nginx are in deploy/export/)")
	fs.StringVar(&o.exportFile, "export-file", "", "with --export-template, the file to write (atomically)")
	fs.StringVar(&o.exportCommand, "export-command", "", "with --export-template, a shell command run after each write, e.g. to reload the load balancer; a failure is logged and retried")
	fs.DurationVar(&o.exportDebounce, "export-debounce", 0, "with --export-template, how long changes must pause before an export (default "+defaultExportDebounce.String()+")")
	fs.DurationVar(&o.failbackSettle, "failback-settle", localproxy.DefaultFailbackSettle, "fail-back: how long a better API server (local, same zone, lower RTT tier) must have been healthy without a break before client connections on worse ones are closed, gradually, so that they reconnect to it; 0 turns fail-back off")
	fs.Float64Var(&o.failbackRate, "failback-rate", localproxy.DefaultFailbackRate, "fail-back: most client connections closed per second (one at a time, oldest first, jittered; from 1/3600, one an hour, to 1000); 0 turns fail-back off")
	fs.BoolVar(&o.profiling, "profiling", false, "serve Go's CPU, heap and goroutine profiles (net/http/pprof) on the health address under /debug/pprof/")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: localproxy [flags]\n       localproxy status [--health-bind-address=IP] [--health-port=N] [--output=table|json]\n"+
			"       localproxy kubeconfig --kubeconfig=FILE [--context=NAME] [--out=FILE | --in-place]\n"+
			"       localproxy state-dir --state-file=FILE [--owner=UID:GID]\n\n"+
			"A node-local TCP proxy on 127.0.0.1:7445 failing over across Kubernetes API servers.\n"+
			"'localproxy status' prints a running proxy's endpoints and their health; 'localproxy kubeconfig'\n"+
			"rewrites a kubeconfig (kubelet's, kube-proxy's, an admin's) to go through the proxy (see its --help);\n"+
			"'localproxy state-dir', run as root, makes the state file's directory the proxy user's.\n"+
			"Every flag can also be set with the environment variable %s<FLAG_NAME> (e.g. %s); the flag wins.\n\nFlags:\n", envPrefix, envName("bind-port"))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args the way Kubernetes components do (spf13/pflag:
// --flag=value or --flag value, -h or --help), then fills every flag not
// given from its environment variable. A value that does not parse, an
// unknown flag or a missing value is a usageError naming the input and
// what is allowed; pflag prints nothing but the usage for --help.
func parseFlags(fs *flag.FlagSet, o *options, args []string, getenv func(string) string) error {
	err := parseChecked(fs, o, args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs)
	}
	return err
}

// parseChecked is parseFlags with every flag.Value wrapped in a
// checkedValue and pflag silenced, which would print its own message and
// the whole usage; both are undone on return, so that --help lists the
// flags' own types and defaults.
func parseChecked(fs *flag.FlagSet, o *options, args []string, getenv func(string) string) error {
	var wrapped []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &checkedValue{Value: f.Value, name: f.Name}
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
		return parseError(fs, err)
	}
	if fs.NArg() > 0 {
		if fs.Name() == "localproxy" {
			return usagef("unexpected argument %q (flags only; the subcommands, status, kubeconfig and state-dir, are given first)", fs.Arg(0))
		}
		return usagef("unexpected argument %q; %s takes flags only (see '%s --help')", fs.Arg(0), fs.Name(), fs.Name())
	}
	o.from = make(map[string]string)
	fs.Visit(func(f *flag.Flag) { o.from[f.Name] = "--" + f.Name })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Name)
		v := getenv(env)
		if _, ok := o.from[f.Name]; ok {
			if v != "" {
				errs = append(errs, o.checkIgnored(f, env, v))
			}
			return
		}
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, envError(err, env, f.Name, v))
			return
		}
		o.from[f.Name] = env
	})
	// Variables of other names that a flag reads last, e.g. NODE_NAME,
	// which deployments set from the downward API.
	for name, env := range envAliases {
		f, v := fs.Lookup(name), getenv(env)
		if f == nil || v == "" {
			continue
		}
		if _, set := o.from[name]; set {
			errs = append(errs, o.checkIgnored(f, env, v))
			continue
		}
		if err := fs.Set(name, v); err != nil {
			errs = append(errs, envError(err, env, name, v))
			continue
		}
		o.from[name] = env
	}
	return errors.Join(errs...)
}

// envError is the usage error for value v of variable env, which flag
// name refused with err.
func envError(err error, env, name, v string) error {
	var ve *valueError
	if errors.As(err, &ve) {
		return ve.usage(env)
	}
	return usagef("invalid %s: %v", input(env, name, v), err)
}

// checkIgnored checks v, the value of variable env that the value of f
// overrides (from the flag, or from a variable read first): it must parse
// as f's kind all the same, and be in an int flag's range (intRanges),
// and a value other than f's is ignored with a warning naming both. f
// keeps its value.
func (o *options) checkIgnored(f *flag.Flag, env, v string) error {
	given := f.Value.String()
	err := f.Value.Set(v)
	got := f.Value.String()
	if rerr := f.Value.Set(given); rerr != nil {
		return fmt.Errorf("restoring --%s=%q after checking %s: %w", f.Name, given, env, rerr)
	}
	if err != nil {
		return envError(err, env, f.Name, v)
	}
	if _, ok := intRanges[f.Name]; ok {
		if n, perr := strconv.Atoi(got); perr == nil {
			if err := intRangeError(env, f.Name, n); err != nil {
				return err
			}
		}
	}
	if got == given {
		return nil
	}
	winner := o.input(f.Name, valueOf(f, given))
	why := winner + " is set, and wins"
	if o.src(f.Name) == "--"+f.Name {
		why = winner + " is given on the command line, and the flag wins"
	}
	o.warnings = append(o.warnings, input(env, f.Name, valueOf(f, v))+" is ignored: "+why)
	return nil
}

// printWarnings prints the warnings of a subcommand, which has no logger.
func printWarnings(w io.Writer, prefix string, warnings []string) {
	for _, m := range warnings {
		fmt.Fprintf(w, "%s: warning: %s\n", prefix, m)
	}
}

// valueOf is s as input quotes it: quoted for a string flag only.
func valueOf(f *flag.Flag, s string) any {
	if f.Value.Type() == "string" {
		return s
	}
	return rawValue(s)
}

// rawValue prints unquoted.
type rawValue string

func (r rawValue) String() string { return string(r) }

// parseError turns pflag's typed errors into usage errors that name the
// input and what is allowed.
func parseError(fs *flag.FlagSet, err error) error {
	var (
		notExist *flag.NotExistError
		required *flag.ValueRequiredError
		syntax   *flag.InvalidSyntaxError
		value    *valueError
	)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return err
	case errors.As(err, &value):
		return value.usage("--" + value.name)
	case errors.As(err, &required):
		name := required.GetFlag().Name
		want := "a value"
		if a := allowed(required.GetFlag().Value, name); a != "" {
			want = a
		}
		return usagef("invalid --%s: missing value; want %s", name, want)
	case errors.As(err, &notExist):
		if group := notExist.GetSpecifiedShortnames(); group != "" {
			// -version: a long flag given one dash, which pflag reads
			// as the one-letter flags v, e, r...
			name, _, _ := strings.Cut(group, "=")
			if fs.Lookup(name) != nil {
				return usagef("unknown flag -%s; long flags take two dashes: --%s", group, group)
			}
			return usagef("unknown flag -%s; %s has no one-letter flags but -h; want one of the flags '%s --help' lists", group, fs.Name(), fs.Name())
		}
		return usagef("unknown flag --%s; want one of the flags '%s --help' lists", notExist.GetSpecifiedName(), fs.Name())
	case errors.As(err, &syntax):
		return usagef("invalid argument %q: want --flag=value, --flag value or -h", syntax.GetSpecifiedFlag())
	}
	return usagef("%v", err)
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
	return intRangeError(o.src(name), name, n)
}

// intRangeError reports value n of int flag name, from src (the flag or
// its variable), outside its range in intRanges.
func intRangeError(src, name string, n int) error {
	if r := intRanges[name]; !r.contains(n) {
		return usagef("invalid %s: want %s", input(src, name, n), r)
	}
	return nil
}

func quoteIfString(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}
