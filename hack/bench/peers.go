package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	haproxyListen         = "127.0.0.1:6443"
	nginxListen           = "127.0.0.1:6444"
	localproxyListenPort  = 7445
	localproxyHealthPort  = 7446
	nginxStreamModulePath = "/usr/lib/nginx/modules/ngx_stream_module.so"
)

// haproxyConfig renders kubespray's HAProxy configuration for servers
// (name -> host:port, in order) listening on listen. maxconn, if not 0,
// replaces kubespray's connection limits (4000 in all, 1000 per server)
// with maxconn for both.
func haproxyConfig(listen string, names, servers []string, statsSocket string, maxconn int) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# kubespray's node-local apiserver load balancer (hack/bench/peers.go):")
	w("# roles/kubernetes/node/templates/loadbalancer/haproxy.cfg.j2")
	limit, serverLimit := 4000, 1000
	if maxconn != 0 {
		limit, serverLimit = maxconn, maxconn
	}
	w("global")
	if maxconn != 0 {
		w("    # not in kubespray (4000 in all, 1000 per server): room for the")
		w("    # benchmark's idle connections.")
	}
	w("    maxconn %d", limit)
	w("    # kubespray: log 127.0.0.1 local0 (syslog); here the process's stderr.")
	w("    log stderr format raw local0")
	w("    # not in kubespray: the benchmark reads the server states (show stat).")
	w("    stats socket %s mode 600 level admin", statsSocket)
	w("")
	w("defaults")
	w("    mode http")
	w("    log global")
	w("    option httplog")
	w("    option dontlognull")
	w("    option http-server-close")
	w("    # A connection that fails is retried, the last retry on another server.")
	w("    option redispatch")
	w("    retries 5")
	w("    timeout http-request 5m")
	w("    timeout queue 5m")
	w("    timeout connect 30s")
	w("    # loadbalancer_apiserver_keepalive_timeout, default 5m")
	w("    # (roles/kubernetes/node/defaults/main.yml; older templates: 15m).")
	w("    timeout client 5m")
	w("    timeout server 15m")
	w("    timeout http-keep-alive 30s")
	w("    timeout check 30s")
	w("    maxconn %d", limit)
	w("")
	w("frontend kube_api_frontend")
	w("    bind %s", listen)
	w("    mode tcp")
	w("    option tcplog")
	w("    default_backend kube_api_backend")
	w("")
	w("backend kube_api_backend")
	w("    mode tcp")
	w("    balance leastconn")
	w("    # Health: GET /healthz over TLS without verification every 15s;")
	w("    # 2 failures mark a server down, 2 successes up again.")
	w("    default-server inter 15s downinter 15s rise 2 fall 2 slowstart 60s maxconn %d maxqueue 256 weight 100", serverLimit)
	w("    option httpchk GET /healthz")
	w("    http-check expect status 200")
	for i, s := range servers {
		w("    server %s %s check check-ssl verify none", names[i], s)
	}
	return b.String()
}

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

// proc is a proxy process the benchmark started: its own process group,
// SIGKILLed if the benchmark dies, output in a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid once done is closed
}

// startProc starts path with args, logging to logPath, and waits until
// addr accepts TCP connections (or the process exits, or 10s pass).
func startProc(ctx context.Context, name, logPath, addr string, path string, args ...string) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "=== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(lf, "=== %s exit: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
		lf.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited (%v) before listening on %s; log %s:\n%s", name, p.err, addr, logPath, tail(logPath, 15))
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s does not listen on %s after 10s; log %s:\n%s", name, addr, logPath, tail(logPath, 15))
		}
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process ended, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop SIGKILLs the process group and waits for the process.
func (p *proc) stop() {
	if done, _ := p.exited(); done {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of a file, indented.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// startHAProxy writes the kubespray configuration into dir and starts
// haproxy in the foreground; maxconn as in haproxyConfig.
func startHAProxy(ctx context.Context, dir string, names, servers []string, maxconn int) (*proc, string, error) {
	sock := filepath.Join(dir, "haproxy.sock")
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(haproxyListen, names, servers, sock, maxconn)), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProc(ctx, "haproxy", filepath.Join(dir, "haproxy.log"), haproxyListen, "haproxy", "-db", "-f", cfg)
	return p, sock, err
}

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

// haproxyServerStats asks HAProxy's stats socket for the counters of
// every server of kube_api_backend: name -> column of show stat ("status":
// "UP", "DOWN", "UP 1/2", ...; "stot": sessions sent to it; "chkdown":
// transitions to down) -> value.
func haproxyServerStats(sock string) (map[string]map[string]string, error) {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("show stat\n")); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(c)
	var cols []string
	out := make(map[string]map[string]string)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# ") {
			cols = strings.Split(strings.TrimPrefix(line, "# "), ",")
			continue
		}
		f := strings.Split(line, ",")
		if cols == nil || len(f) < 2 || f[0] != "kube_api_backend" || f[1] == "BACKEND" {
			continue
		}
		row := make(map[string]string)
		for i, v := range f {
			if i < len(cols) {
				row[cols[i]] = v
			}
		}
		out[f[1]] = row
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cols == nil {
		return nil, errors.New("haproxy show stat: no header")
	}
	return out, nil
}

// haproxyServerStates returns the state of every server of
// kube_api_backend: name -> "UP", "DOWN", "UP 1/2", ...
func haproxyServerStates(sock string) (map[string]string, error) {
	st, err := haproxyServerStats(sock)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(st))
	for name, row := range st {
		out[name] = row["status"]
	}
	return out, nil
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
	}
	if kubeconfig != "" {
		args = append(args, "--enable-discovery", "--kubeconfig="+kubeconfig)
	} else {
		args = append(args, "--enable-discovery=false")
	}
	return args
}
