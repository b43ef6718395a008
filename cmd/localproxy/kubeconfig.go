package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	flag "github.com/spf13/pflag"

	"github.com/apifailover/apifailover/transport/upstream"
)

const kubeconfigCmd = "localproxy kubeconfig"

// kubeconfigOptions are the raw flag values of "localproxy kubeconfig".
// Of the embedded options, it uses kubeconfig (the file to rewrite),
// bindAddress, bindPort and tlsServerName.
type kubeconfigOptions struct {
	options
	context string
	out     string
	inPlace bool
}

// kubeconfigEnvFlags are the flags of "localproxy kubeconfig" that also
// read their LOCALPROXY_* variable: run with the proxy's environment, the
// command points at the proxy as it is configured. The flags that choose
// files and contexts are read from the command line only: a variable left
// over in the environment must not pick a file to rewrite.
var kubeconfigEnvFlags = []string{"bind-address", "bind-port", "tls-server-name"}

func newKubeconfigFlagSet(k *kubeconfigOptions, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(kubeconfigCmd, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "the kubeconfig file to rewrite, e.g. /etc/kubernetes/kubelet.conf; required")
	fs.StringVar(&k.context, "context", "", "the context whose cluster is rewritten (default: the current-context)")
	fs.StringVar(&k.bindAddress, "bind-address", "127.0.0.1", "localproxy's --bind-address: the new server's address (of a list, the first loopback address; 0.0.0.0 and :: mean loopback)")
	fs.IntVar(&k.bindPort, "bind-port", 7445, "localproxy's --bind-port: the new server's port")
	fs.StringVar(&k.tlsServerName, "tls-server-name", "", "the cluster's tls-server-name, a name every API server certificate carries, e.g. kubernetes.default.svc (default: the cluster's own tls-server-name if it has one, else the host of its old server)")
	fs.StringVar(&k.out, "out", "", "write the new kubeconfig to this file (atomically; mode 0600, or the mode of the file it replaces) instead of stdout")
	fs.BoolVar(&k.inPlace, "in-place", false, "rewrite the --kubeconfig file itself (atomically, keeping its mode and owner), after copying it to FILE.<UTC time>.bak beside it")
	fs.Usage = func() {
		fmt.Fprintf(out, `Usage: %[1]s --kubeconfig=FILE [--context=NAME] [--out=FILE | --in-place] [flags]

Rewrites a kubeconfig (kubelet's, kube-proxy's, an admin's) to reach the API
servers through localproxy: the server of one cluster, that of the current
context or of --context, becomes https://127.0.0.1:7445 (--bind-address,
--bind-port), and its tls-server-name the host of the old server unless it
has one already (--tls-server-name sets another), so that clients verify
the API server certificates as before. Credentials, CA, contexts and the
rest are unchanged, but relative file paths (certificate-authority,
client-certificate, client-key, tokenFile, and an exec command with a
directory in it, which client-go reads relative to the kubeconfig) are made
absolute against the file's directory, except with --in-place. Every
context using the cluster goes through localproxy afterwards.

The new kubeconfig goes to stdout, to --out, or with --in-place over the
file, after a backup beside it, FILE.<UTC time>.bak (never overwritten). A
cluster already pointing at localproxy is left as it is (exit 0). Refused
(exit 2): a server that is not https://, a cluster with
insecure-skip-tls-verify (through localproxy its credentials would go,
unverified, to whatever listens on the local port) or proxy-url.

--bind-address, --bind-port and --tls-server-name also read
%[2]s, %[3]s and
%[4]s; the flag wins.

Example (kubelet):
  localproxy kubeconfig --kubeconfig=/etc/kubernetes/kubelet.conf --in-place
  systemctl restart kubelet

Flags:
`, kubeconfigCmd, envName("bind-address"), envName("bind-port"), envName("tls-server-name"))
		fs.PrintDefaults()
	}
	return fs
}

// kubeconfigEnv is getenv restricted to the variables of kubeconfigEnvFlags.
func kubeconfigEnv(getenv func(string) string) func(string) string {
	return func(name string) string {
		for _, f := range kubeconfigEnvFlags {
			if envName(f) == name {
				return getenv(name)
			}
		}
		return ""
	}
}

// runKubeconfig implements "localproxy kubeconfig": it rewrites one
// cluster of a kubeconfig to go through localproxy.
func runKubeconfig(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var k kubeconfigOptions
	fs := newKubeconfigFlagSet(&k, stderr)
	if err := parseFlags(fs, &k.options, args, kubeconfigEnv(getenv)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		printErrors(stderr, kubeconfigCmd, err)
		fmt.Fprintf(stderr, "Run '%s --help' for the flags.\n", kubeconfigCmd)
		return exitUsage
	}
	printWarnings(stderr, kubeconfigCmd, k.warnings)
	rt, err := k.retarget()
	if err != nil {
		printErrors(stderr, kubeconfigCmd, err)
		fmt.Fprintf(stderr, "Run '%s --help' for the flags.\n", kubeconfigCmd)
		return exitUsage
	}
	file := k.kubeconfig
	old, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, k.bad("kubeconfig", file, fmt.Sprintf("%v; want a readable kubeconfig file", err)))
		return exitUsage
	}
	cfg, err := clientcmd.Load(old)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, k.bad("kubeconfig", file, fmt.Sprintf("not a kubeconfig: %v", err)))
		return exitUsage
	}
	res, err := rt.apply(cfg, file)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, err)
		return exitUsage
	}
	res.report(stderr, rt)
	if k.inPlace {
		if !res.changed {
			fmt.Fprintf(stderr, "%s: %s left as it is\n", kubeconfigCmd, file)
			return exitOK
		}
	} else if err := resolvePaths(cfg, file); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, err)
		return exitError
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: encoding the new kubeconfig: %v\n", kubeconfigCmd, err)
		return exitError
	}
	switch {
	case k.inPlace:
		backup, err := replaceFile(file, old, data, time.Now())
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, err)
			return exitError
		}
		fmt.Fprintf(stderr, "%s: rewrote %s; the old one is in %s\n", kubeconfigCmd, file, backup)
	case k.out != "":
		if err := writeOut(k.out, data); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", kubeconfigCmd, err)
			return exitError
		}
		fmt.Fprintf(stderr, "%s: wrote %s\n", kubeconfigCmd, k.out)
	default:
		if _, err := stdout.Write(data); err != nil {
			fmt.Fprintf(stderr, "%s: writing the new kubeconfig: %v\n", kubeconfigCmd, err)
			return exitError
		}
	}
	return exitOK
}

// retarget is what "localproxy kubeconfig" does to a cluster.
type retarget struct {
	// server is localproxy's URL, https://127.0.0.1:7445, and hostPort
	// its host and port as serverHostPort returns them.
	server, hostPort string
	// serverName is --tls-server-name, "" to keep or derive the name;
	// serverNameSrc names where it came from.
	serverName, serverNameSrc string
	// context is --context, "" for the current-context.
	context string
}

// retarget checks the flags and returns what they ask for.
func (k *kubeconfigOptions) retarget() (*retarget, error) {
	var errs []error
	if k.kubeconfig == "" {
		errs = append(errs, k.bad("kubeconfig", k.kubeconfig, "want the kubeconfig file to rewrite, e.g. --kubeconfig=/etc/kubernetes/kubelet.conf"))
	}
	if k.inPlace && k.out != "" {
		errs = append(errs, usagef("invalid --out=%q with --in-place: want one of them (without either, the new kubeconfig goes to stdout)", k.out))
	}
	if k.out != "" && k.kubeconfig != "" && sameFile(k.out, k.kubeconfig) {
		errs = append(errs, k.bad("out", k.out, "it is the --kubeconfig file; want another file, or --in-place, which keeps a backup"))
	}
	var binds []netip.Addr
	for _, a := range splitList(k.bindAddress) {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			errs = append(errs, k.bad("bind-address", a, "want an IP address, e.g. 127.0.0.1 or ::1"))
			continue
		}
		binds = append(binds, ip.Unmap()) // as localproxy binds it
	}
	if len(splitList(k.bindAddress)) == 0 {
		errs = append(errs, k.bad("bind-address", k.bindAddress, "want at least one IP address, e.g. 127.0.0.1"))
	}
	if err := k.checkInt("bind-port", k.bindPort); err != nil {
		errs = append(errs, err)
	}
	name := strings.TrimSpace(k.tlsServerName)
	if name != "" {
		if _, err := upstream.ParseAddr(net.JoinHostPort(name, "1")); err != nil {
			errs = append(errs, k.bad("tls-server-name", k.tlsServerName, "want a DNS name or an IP address"))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	hostPort := net.JoinHostPort(loopbackOf(binds).String(), strconv.Itoa(k.bindPort))
	return &retarget{
		server:        "https://" + hostPort,
		hostPort:      hostPort,
		serverName:    name,
		serverNameSrc: k.src("tls-server-name"),
		context:       k.context,
	}, nil
}

// retargeted says what apply did.
type retargeted struct {
	context, cluster string
	// others are the other contexts using the cluster.
	others []string
	// oldServer and oldServerName are the cluster's before.
	oldServer, oldServerName string
	// serverName is the cluster's tls-server-name after, serverNameFrom
	// says where it came from.
	serverName, serverNameFrom string
	// already is true when the cluster's server was localproxy already.
	already bool
	// changed is false when the cluster already pointed at localproxy
	// with this tls-server-name.
	changed bool
}

// apply points the cluster of rt.context (or of the current-context) of
// cfg, read from file, at localproxy. The errors name the file and what
// is allowed.
func (rt *retarget) apply(cfg *clientcmdapi.Config, file string) (retargeted, error) {
	var res retargeted
	contexts := slices.Sorted(maps.Keys(cfg.Contexts))
	want, wantContext := "want a kubeconfig with a context", "want a kubeconfig with a context"
	if len(contexts) > 0 {
		want = "want --context naming one of its contexts: " + quoteList(contexts)
		wantContext = "want one of its contexts: " + quoteList(contexts)
	}
	res.context = rt.context
	switch {
	case rt.context == "" && cfg.CurrentContext == "":
		return res, fmt.Errorf("%s has no current-context; %s", file, want)
	case rt.context == "" && cfg.Contexts[cfg.CurrentContext] == nil:
		return res, fmt.Errorf("%s: its current-context %q names no context in the file; %s", file, cfg.CurrentContext, want)
	case rt.context == "":
		res.context = cfg.CurrentContext
	case cfg.Contexts[rt.context] == nil:
		return res, fmt.Errorf("%s has no context %q (--context); %s", file, rt.context, wantContext)
	}
	res.cluster = cfg.Contexts[res.context].Cluster
	c := cfg.Clusters[res.cluster]
	if c == nil {
		return res, fmt.Errorf("%s: context %q names cluster %q, which the file does not define; want a context whose cluster is in the file", file, res.context, res.cluster)
	}
	for _, name := range contexts {
		if name != res.context && cfg.Contexts[name].Cluster == res.cluster {
			res.others = append(res.others, name)
		}
	}
	which := fmt.Sprintf("%s: cluster %q (context %q)", file, res.cluster, res.context)
	u, err := url.Parse(c.Server)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "" || u.Hostname() == "":
		return res, fmt.Errorf("%s has server %q; want an https:// URL: localproxy passes TLS through, so the client must speak TLS to the API server", which, c.Server)
	case u.Path != "" && u.Path != "/":
		return res, fmt.Errorf("%s has server %q with a path; want https://host[:port]: localproxy forwards to kube-apiservers, which serve at /", which, c.Server)
	case c.InsecureSkipTLSVerify:
		return res, fmt.Errorf("%s sets insecure-skip-tls-verify: through localproxy its credentials would go, unverified, to whatever listens on %s (an unprivileged port); want certificate-authority or certificate-authority-data in the cluster instead", which, rt.hostPort)
	case c.ProxyURL != "":
		return res, fmt.Errorf("%s sets proxy-url %q: its connections to %s would go through that proxy; want a cluster without proxy-url", which, c.ProxyURL, rt.server)
	}
	res.oldServer, res.oldServerName = c.Server, c.TLSServerName
	res.already = serverHostPort(u) == rt.hostPort
	switch {
	case rt.serverName != "":
		res.serverName, res.serverNameFrom = rt.serverName, rt.serverNameSrc
	case c.TLSServerName != "":
		res.serverName, res.serverNameFrom = c.TLSServerName, "kept"
	case res.already:
		return res, fmt.Errorf("%s already points at %s but has no tls-server-name, so the API server's name is not known; want --tls-server-name with a name every API server certificate carries, e.g. kubernetes.default.svc", which, c.Server)
	default:
		res.serverName, res.serverNameFrom = u.Hostname(), "the old server's host"
	}
	res.changed = !res.already || res.serverName != c.TLSServerName
	if res.changed {
		c.Server, c.TLSServerName = rt.server, res.serverName
	}
	return res, nil
}

// report says on w which cluster was rewritten, and how.
func (res retargeted) report(w io.Writer, rt *retarget) {
	shared := ""
	if len(res.others) > 0 {
		shared = "; also used by context " + quoteList(res.others)
		if len(res.others) > 1 {
			shared = "; also used by contexts " + quoteList(res.others)
		}
	}
	if !res.changed {
		fmt.Fprintf(w, "%s: cluster %q (context %q%s) already points at %s with tls-server-name %s: nothing to change\n",
			kubeconfigCmd, res.cluster, res.context, shared, res.oldServer, res.serverName)
		return
	}
	from := "(" + res.serverNameFrom + ")"
	if res.oldServerName != "" && res.serverName != res.oldServerName {
		from = fmt.Sprintf("(was %s; %s)", res.oldServerName, res.serverNameFrom)
	}
	server := res.oldServer + " -> " + rt.server
	if res.already {
		server = res.oldServer + " (already localproxy)"
	}
	fmt.Fprintf(w, "%s: cluster %q (context %q%s): server %s, tls-server-name %s %s\n",
		kubeconfigCmd, res.cluster, res.context, shared, server, res.serverName, from)
	if _, err := netip.ParseAddr(res.serverName); err == nil {
		fmt.Fprintf(w, "%s: note: tls-server-name %s is an IP address: every API server's certificate must carry it, or connections that localproxy sends to the others fail verification; --tls-server-name sets a name they all carry (e.g. kubernetes.default.svc)\n",
			kubeconfigCmd, res.serverName)
	}
}

// resolvePaths makes the relative file paths of cfg, read from file,
// absolute against file's directory, as client-go reads them: the
// clusters' certificate-authority; the users' client-certificate,
// client-key, tokenFile, and an exec command with a path separator in it
// (a bare command is looked up in $PATH and left alone).
func resolvePaths(cfg *clientcmdapi.Config, file string) error {
	for _, c := range cfg.Clusters {
		c.LocationOfOrigin = file
	}
	for _, a := range cfg.AuthInfos {
		a.LocationOfOrigin = file
	}
	if err := clientcmd.ResolveLocalPaths(cfg); err != nil {
		return fmt.Errorf("making the paths of %s absolute: %w", file, err)
	}
	return nil
}

// serverHostPort returns the host and port of an https URL as
// net.JoinHostPort does: an IP address in its normal form (an
// IPv4-mapped one as the IPv4 address it reaches), a name in lower case,
// port 443 if it has none.
func serverHostPort(u *url.URL) string {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(host, port)
}

// quoteList lists names quoted: "a", "b", "c".
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}
