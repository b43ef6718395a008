package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apifailover/apifailover/hack/peers"
	"github.com/apifailover/apifailover/localproxy"
)

// The peers are configured as kubespray configures the localhost load
// balancer of its worker nodes (kubernetes-sigs/kubespray,
// roles/kubernetes/node/templates/loadbalancer/haproxy.cfg.j2 and
// nginx.conf.j2, with the defaults of roles/kubernetes/node/defaults/main.yml
// and no loadbalancer_apiserver_healthcheck_port). Only what the benchmark
// needs to run and observe them differs, and says so.

// Listen addresses. kubespray binds 127.0.0.1:6443 on the node; the paths
// run side by side here, so nginx takes the next port.
const (
	haproxyListen         = peers.HAProxyListen
	nginxListen           = "127.0.0.1:6444"
	localproxyListenPort  = 7445
	localproxyHealthPort  = 7446
	nginxStreamModulePath = "/usr/lib/nginx/modules/ngx_stream_module.so"
)

// nginxConfig renders kubespray's nginx configuration for servers,
// listening on listen, with the pid file pid. A sessionLog path adds a
// stream access log there (nginxSessionFormat).
func nginxConfig(listen string, servers []string, pid string, loadStream bool, sessionLog string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# kubespray's node-local apiserver load balancer (hack/bench/peers.go):")
	w("# roles/kubernetes/node/templates/loadbalancer/nginx.conf.j2")
	if loadStream {
		w("# not in kubespray (its image has the stream module built in): Debian's is dynamic.")
		w("load_module %s;", nginxStreamModulePath)
	}
	w("# not in kubespray: the pid file in the benchmark's directory.")
	w("pid %s;", pid)
	w("error_log stderr notice;")
	w("")
	w("worker_processes 2;")
	w("worker_rlimit_nofile 130048;")
	w("worker_shutdown_timeout 10s;")
	w("")
	w("events {")
	w("  multi_accept on;")
	w("  use epoll;")
	w("  worker_connections 16384;")
	w("}")
	w("")
	w("stream {")
	if sessionLog != "" {
		w("  # not in kubespray: one line per session, for the benchmark to count")
		w("  # the sessions sent to each apiserver.")
		w("  log_format sessions '%s';", nginxSessionFormat)
		w("  access_log %s sessions;", sessionLog)
		w("")
	}
	w("  upstream kube_apiserver {")
	w("    least_conn;")
	w("    # No active health checks (nginx OSS has none); passive defaults:")
	w("    # max_fails=1 fail_timeout=10s; proxy_next_upstream on.")
	for _, s := range servers {
		w("    server %s;", s)
	}
	w("  }")
	w("")
	w("  server {")
	w("    listen        %s;", listen)
	w("    proxy_pass    kube_apiserver;")
	w("    proxy_timeout 10m;")
	w("    proxy_connect_timeout 1s;")
	w("  }")
	w("}")
	w("")
	w("http {")
	w("  aio threads;")
	w("  aio_write on;")
	w("  tcp_nopush on;")
	w("  tcp_nodelay on;")
	w("  # loadbalancer_apiserver_keepalive_timeout, default 5m.")
	w("  keepalive_timeout 5m;")
	w("  keepalive_requests 100;")
	w("  reset_timedout_connection on;")
	w("  server_tokens off;")
	w("  autoindex off;")
	w("}")
	return b.String()
}

// The peers' processes and HAProxy live in hack/peers, shared with the
// demo; these are their names here.

// proc is a proxy process the benchmark started (peers.Proc).
type proc struct {
	*peers.Proc
	name, logPath string
}

func (p *proc) pid() int              { return p.Pid() }
func (p *proc) exited() (bool, error) { return p.Exited() }
func (p *proc) stop()                 { p.Stop() }

// startProc is peers.StartProc.
func startProc(ctx context.Context, name, logPath, addr string, path string, args ...string) (*proc, error) {
	return startProcWith(ctx, peers.ProcOptions{}, name, logPath, addr, path, args...)
}

// startProcWith is peers.StartProcWith.
func startProcWith(ctx context.Context, opts peers.ProcOptions, name, logPath, addr string, path string, args ...string) (*proc, error) {
	p, err := peers.StartProcWith(ctx, opts, name, logPath, addr, path, args...)
	if err != nil {
		return nil, err
	}
	return &proc{Proc: p, name: name, logPath: logPath}, nil
}

// startHAProxy is peers.StartHAProxy.
func startHAProxy(ctx context.Context, dir string, names, servers []string, maxconn int) (*proc, string, error) {
	p, sock, err := peers.StartHAProxy(ctx, dir, names, servers, maxconn)
	if err != nil {
		return nil, "", err
	}
	return &proc{Proc: p, name: p.Name(), logPath: p.LogPath()}, sock, nil
}

var (
	haproxyConfig       = peers.HAProxyConfig
	haproxyServerStats  = peers.HAProxyServerStats
	haproxyServerStates = peers.HAProxyServerStates
)

// nginxSessionFormat is the stream access log's line: when the session
// ended (Unix seconds), its status and the apiservers it was sent to
// ("a:p, b:p" when nginx tried the next one).
const nginxSessionFormat = `$msec $status "$upstream_addr"`

// startNginx writes the kubespray configuration into dir and starts nginx
// in the foreground; sessionLog as in nginxConfig.
func startNginx(ctx context.Context, dir string, servers []string, sessionLog string) (*proc, error) {
	_, err := os.Stat(nginxStreamModulePath)
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(nginxConfig(nginxListen, servers, filepath.Join(dir, "nginx.pid"), err == nil, sessionLog)), 0o644); err != nil {
		return nil, err
	}
	return startProc(ctx, "nginx", filepath.Join(dir, "nginx.log"), nginxListen, "nginx",
		"-p", dir, "-c", cfg, "-e", "stderr", "-g", "daemon off;")
}

// peerVersion returns the first line of `name -v` (nginx prints it on
// stderr).
func peerVersion(name string) string {
	out, err := exec.Command(name, "-v").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// localproxyArgs are the flags of the localproxy binary: the bed's three
// apiservers, probes verified with the bed's CA, EndpointSlice discovery
// through itself (as the README recommends; not without a kubeconfig) and
// every other setting at its default.
func localproxyArgs(servers []string, caFile, serverName, kubeconfig string) []string {
	args := []string{
		"--endpoints=" + strings.Join(servers, ","),
		"--bind-address=127.0.0.1",
		"--bind-port=" + strconv.Itoa(localproxyListenPort),
		"--health-port=" + strconv.Itoa(localproxyHealthPort),
		"--ca-file=" + caFile,
		"--tls-server-name=" + serverName,
		// Close what is left at once when a run ends, so the next run can
		// bind the port.
		"--shutdown-timeout=0",
		// Profiles of the overhead ops (profileLocalProxy).
		"--profiling",
		// The default, stated: the data path's report names it
		// (datapathConfig.LocalProxyLoopbackCC), whatever the
		// environment says.
		"--loopback-congestion-control=" + localproxy.DefaultLoopbackCongestionControl,
	}
	if kubeconfig != "" {
		args = append(args, "--enable-discovery", "--kubeconfig="+kubeconfig)
	} else {
		args = append(args, "--enable-discovery=false")
	}
	return args
}
