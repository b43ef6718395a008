// Command localproxy is the node-local TCP proxy of apifailover: kubelet,
// CNIs, kubectl and every other client point their kubeconfig at
// https://127.0.0.1:7445 (with tls-server-name set to the API server's
// name) and get health-checked failover across all API servers. TLS passes
// through untouched.
//
// Flags are also read from LOCALPROXY_* environment variables (the flag
// wins). Invalid values exit with code 2 and a message naming the flag or
// variable, the value and what is allowed. "localproxy status" prints the
// /status of a running proxy as a table; "localproxy kubeconfig" rewrites
// a kubeconfig to go through the proxy.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	flag "github.com/spf13/pflag"

	"github.com/apifailover/apifailover/internal/version"
	"github.com/apifailover/apifailover/localproxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], takeListenEnv(os.Getenv), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// run is the whole program, minus the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return runStatus(ctx, args[1:], getenv, stdout, stderr)
		case "kubeconfig":
			return runKubeconfig(args[1:], getenv, stdout, stderr)
		case "state-dir":
			return runStateDir(args[1:], getenv, stdout, stderr)
		}
	}
	var o options
	fs := newFlagSet(&o, stderr)
	if err := parseFlags(fs, &o, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		printErrors(stderr, "localproxy", err)
		fmt.Fprintf(stderr, "Run 'localproxy --help' for the flags.\n")
		return exitUsage
	}
	if o.version {
		fmt.Fprintf(stdout, "localproxy %s\n", version.Get())
		return exitOK
	}
	cfg, err := o.config()
	if err != nil {
		printErrors(stderr, "localproxy", err)
		fmt.Fprintf(stderr, "Run 'localproxy --help' for the flags.\n")
		return exitUsage
	}
	// --max-connections must fit in the file descriptor limit; its
	// default is lowered to what fits.
	lowered := 0
	limit := fileLimit()
	if err := fileLimitError(cfg.MaxConnections, limit); err != nil {
		_, set := o.from["max-connections"]
		if lowered = maxConnsFor(limit); set || lowered < 1 {
			printErrors(stderr, "localproxy", err)
			return exitUsage
		}
		cfg.MaxConnections = lowered
	}
	level, _ := parseLogLevel(o.logLevel)
	log := newLogger(stderr, o.logFormat, level)
	if lowered > 0 {
		log.Info("the file descriptor limit (RLIMIT_NOFILE) cannot hold the default --max-connections: lowered", "maxConnections", lowered,
			"default", localproxy.DefaultMaxConnections, "fdsPerConnection", fdsPerConn)
	}
	for _, w := range o.warnings {
		log.Info("warning: " + w)
	}
	klog.SetLogger(log.WithName("client-go"))
	cfg.Logger = log
	// Sockets passed by systemd (a .socket unit) replace binding.
	fds, err := parseListenFDs(getenv, os.Getpid())
	if err == nil && fds.n > 0 {
		var byAddr map[string]net.Listener
		if byAddr, err = inheritedListeners(fds, cfg.ListenAddresses, passedFile); err == nil {
			cfg.Listen = listenInherited(byAddr)
			cfg.ListenersOwned = true // the event loop accepts on them
			defer func() {
				for _, ln := range byAddr { // those Run did not take
					ln.Close()
				}
			}()
			log.Info("listening on sockets passed by systemd", "sockets", fds.n, "names", fds.names)
		}
	}
	if err != nil {
		printErrors(stderr, "localproxy", err)
		return exitUsage
	}
	p, err := localproxy.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return exitUsage
	}
	_, procsSet := o.from["gomaxprocs"]
	procs := applyGOMAXPROCS(o.gomaxprocs, procsSet, getenv("GOMAXPROCS"))
	log.Info("starting", "version", version.Get().Version, "revision", version.Get().Revision, "endpoints", cfg.Endpoints, "listen", cfg.ListenAddresses,
		"health", cfg.HealthAddress, "probe", o.probe, "probeCredentials", p.Prober().Credentials(), "origin", cfg.Origin, "discovery", cfg.Discovery != nil,
		"zone", cfg.Pool.Zone, "zoneFromNode", cfg.NodeName, "gomaxprocs", procs, "loopbackCongestionControl", p.LoopbackCongestionControl())
	if e := o.exporter; e != nil {
		e.pool, e.log = p.Pool(), log.WithName("export")
		defer background(ctx, e.run)()
	}
	sd, err := newSDNotifier(getenv, os.Getpid())
	if err != nil {
		log.Error(err, "not notifying systemd")
	}
	if sd != nil {
		defer sd.close()
		log.Info("notifying systemd", "watchdog", sd.watchdog)
		// Ends with Run too, should it fail before the signal.
		defer background(ctx, func(ctx context.Context) { sd.run(ctx, p, log.WithName("systemd")) })()
	}
	if err := p.Run(ctx); err != nil {
		log.Error(err, "localproxy failed")
		return exitError
	}
	return exitOK
}

// background runs f on a goroutine until ctx ends or the returned stop
// is called; stop waits for f to return.
func background(ctx context.Context, f func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f(ctx) }()
	return func() { cancel(); <-done }
}

// printErrors prints each of the errors joined in err on its own line.
func printErrors(w io.Writer, prefix string, err error) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			printErrors(w, prefix, e)
		}
		return
	}
	fmt.Fprintf(w, "%s: %v\n", prefix, err)
}
