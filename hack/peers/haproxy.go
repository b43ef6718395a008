// Package peers runs the load balancers clusters put in front of
// kube-apiserver today, as kubespray configures the localhost load
// balancer of its worker nodes (kubernetes-sigs/kubespray,
// roles/kubernetes/node/templates/loadbalancer/haproxy.cfg.j2, with the
// defaults of roles/kubernetes/node/defaults/main.yml and no
// loadbalancer_apiserver_healthcheck_port): HAProxy's configuration, its
// process and its stats socket, and the process runner the benchmark's
// other peers use. Only what the benchmark and the demo need to run and
// observe them differs from kubespray's, and the configuration says so.
package peers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HAProxyListen is where HAProxy listens: kubespray binds 127.0.0.1:6443
// on the node.
const HAProxyListen = "127.0.0.1:6443"

// HAProxyConfig renders kubespray's HAProxy configuration for servers
// (name -> host:port, in order) listening on listen. maxconn, if not 0,
// replaces kubespray's connection limits (4000 in all, 1000 per server)
// with maxconn for both.
func HAProxyConfig(listen string, names, servers []string, statsSocket string, maxconn int) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# kubespray's node-local apiserver load balancer (hack/peers/haproxy.go):")
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

// StartHAProxy writes the kubespray configuration into dir and starts
// haproxy in the foreground; maxconn as in HAProxyConfig.
func StartHAProxy(ctx context.Context, dir string, names, servers []string, maxconn int) (*Proc, string, error) {
	sock := filepath.Join(dir, "haproxy.sock")
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(HAProxyConfig(HAProxyListen, names, servers, sock, maxconn)), 0o644); err != nil {
		return nil, "", err
	}
	p, err := StartProc(ctx, "haproxy", filepath.Join(dir, "haproxy.log"), HAProxyListen, "haproxy", "-db", "-f", cfg)
	return p, sock, err
}

// HAProxyServerStats asks HAProxy's stats socket for the counters of
// every server of kube_api_backend: name -> column of show stat ("status":
// "UP", "DOWN", "UP 1/2", ...; "stot": sessions sent to it; "chkdown":
// transitions to down) -> value.
func HAProxyServerStats(sock string) (map[string]map[string]string, error) {
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

// HAProxyServerStates returns the state of every server of
// kube_api_backend: name -> "UP", "DOWN", "UP 1/2", ...
func HAProxyServerStates(sock string) (map[string]string, error) {
	st, err := HAProxyServerStats(sock)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(st))
	for name, row := range st {
		out[name] = row["status"]
	}
	return out, nil
}

// HAProxyServing returns a function naming the server of kube_api_backend
// HAProxy carries a client to now, "" when none: the one server with
// current sessions (scur), or, when several have one (a connection stuck
// on a hung server beside the client's new one), the one that got a new
// session (stot) last. It reads the stats socket at every call.
func HAProxyServing(sock string) func() string {
	var mu sync.Mutex // guards stot and latest
	stot := map[string]int{}
	latest := ""
	return func() string {
		st, err := HAProxyServerStats(sock)
		if err != nil {
			return ""
		}
		mu.Lock()
		defer mu.Unlock()
		best, most := "", 0
		var open []string
		for name, row := range st {
			n, _ := strconv.Atoi(row["stot"])
			if prev, seen := stot[name]; seen && n > prev {
				latest = name
			}
			stot[name] = n
			cur, _ := strconv.Atoi(row["scur"])
			if cur > 0 {
				open = append(open, name)
			}
			if cur > most || (cur == most && cur > 0 && name < best) {
				best, most = name, cur
			}
		}
		if len(open) > 1 && slices.Contains(open, latest) {
			return latest
		}
		return best
	}
}

// HAProxySetState sets the administrative state of server name of
// kube_api_backend through the stats socket (its runtime API): "drain"
// (no new connections, those open stay, checks go on), "ready" or
// "maint".
func HAProxySetState(sock, name, state string) error {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "set server kube_api_backend/%s state %s\n", name, state); err != nil {
		return err
	}
	answer, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	// Success is an empty answer (a blank line); anything else says why not.
	if msg := strings.TrimSpace(string(answer)); msg != "" {
		return fmt.Errorf("haproxy: set server %s state %s: %s", name, state, msg)
	}
	return nil
}
