package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Path names.
const (
	pathDirect     = "direct"
	pathTransport  = "transport"
	pathLocalProxy = "localproxy"
	pathHAProxy    = "haproxy"
	pathNginx      = "nginx"
	// pathDirectAgain is a second direct client, measured in the overhead
	// rounds only: its ratios against direct show the noise of the run.
	pathDirectAgain = "direct-again"
)

// allPaths in report order: the baseline first, ours, the peers.
var allPaths = []string{pathDirect, pathTransport, pathLocalProxy, pathHAProxy, pathNginx}

// pathDescriptions for the report.
var pathDescriptions = map[string]string{
	pathDirect:      "client-go straight to apiserver-1 (no failover)",
	pathDirectAgain: "a second, identical direct client (overhead only): the noise floor",
	pathTransport:   "client-go with transport.Wrap, in process (defaults, EndpointSlice discovery)",
	pathLocalProxy:  "client-go via the localproxy binary on 127.0.0.1:7445 (defaults, discovery on)",
	pathHAProxy:     "client-go via HAProxy on 127.0.0.1:6443, kubespray's configuration",
	pathNginx:       "client-go via nginx (stream) on 127.0.0.1:6444, kubespray's configuration",
}

// env is what starting a path needs.
type env struct {
	bed           *testbed.Bed
	dir           string // the run's scratch directory (configs, logs)
	localproxyBin string
	// sessionLogs gives nginx a session log (see clientPath.sent); off
	// where it would add to the measured cost.
	sessionLogs bool
}

// servers returns the bed's apiserver names and addresses.
func (e *env) servers() (names, addrs []string) {
	for _, s := range e.bed.APIServers() {
		names = append(names, s.Name())
		addrs = append(addrs, s.Addr())
	}
	return names, addrs
}

// clientPath is one started path: a client-go configuration and client,
// and what can be seen of it.
type clientPath struct {
	name       string
	config     *rest.Config
	httpClient *http.Client
	// serving returns the apiserver carrying the client's traffic now, ""
	// if unknown (workload.Config.Serving).
	serving func() string
	// down reports whether the path counts addr as down; known is false
	// for paths without a health view (nginx, direct).
	down func(addr string) (down, known bool)
	// settled reports whether the path has checked every apiserver at
	// least once and counts it healthy.
	settled func() bool
	// openConns identifies the connections the path holds open to addr
	// (socket inodes for the proxies; for in-process paths, one key per
	// connection that lives as long as the connection).
	openConns func(addr string) map[uint64]bool
	// markBaseline is called before the workload starts (see connWatcher).
	markBaseline func()
	// pids are the proxy's processes, nil for in-process paths.
	pids func() []int
	// exited reports whether the proxy process died.
	exited func() bool
	// views returns the path's health view of every apiserver by address;
	// nil for paths without one (nginx, direct).
	views func() (map[string]endpointView, error)
	// sent counts the connections the proxy has sent, or tried to send, to
	// addr since it started: localproxy's dials (its /metrics), HAProxy's
	// sessions (stot), nginx's sessions in its session log (written when
	// a session ends; env.sessionLogs). known is false where it cannot
	// tell.
	sent  func(addr string) (n int, known bool)
	close func()
}

// endpointView is a path's view of one apiserver.
type endpointView struct {
	// Down: not counted healthy (localproxy: any other state; HAProxy:
	// not UP).
	Down bool
	// Suspect: healthy, but the last check failed (localproxy: suspect;
	// HAProxy: "UP 1/2", on its way down).
	Suspect bool
	// Preferred: new connections go there first (localproxy and the
	// transport).
	Preferred bool
}

// downVia is a clientPath.down built on views; missingDown tells whether
// an apiserver missing from the view counts as down (it left the pool) or
// unknown.
func downVia(views func() (map[string]endpointView, error), missingDown bool) func(string) (bool, bool) {
	return func(addr string) (bool, bool) {
		v, err := views()
		if err != nil {
			return false, false
		}
		e, ok := v[addr]
		if !ok {
			return missingDown, missingDown
		}
		return e.Down, true
	}
}

func unknownSent(string) (int, bool) { return 0, false }

// startPath starts path name on the bed. dir receives its configuration
// and logs.
func startPath(ctx context.Context, e *env, name, dir string) (*clientPath, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := startPathOnce(ctx, e, name, dir)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	closeFn := p.close
	p.close = func() { once.Do(closeFn) }
	return p, nil
}

func startPathOnce(ctx context.Context, e *env, name, dir string) (*clientPath, error) {
	switch name {
	case pathDirect, pathDirectAgain:
		p, err := startDirect(e)
		if p != nil {
			p.name = name
		}
		return p, err
	case pathTransport:
		return startTransport(ctx, e)
	case pathLocalProxy:
		return startLocalProxy(ctx, e, dir)
	case pathHAProxy:
		return startHAProxyPath(ctx, e, dir)
	case pathNginx:
		return startNginxPath(ctx, e, dir)
	}
	return nil, fmt.Errorf("unknown path %q", name)
}

// connTracker is the Dial of the client-go paths: the default dialer of
// client-go's transport (30s timeout, 30s keepalive) that counts open
// connections per remote address. A Dial of its own also gives each path
// its own transport in client-go's cache.
type connTracker struct {
	mu   sync.Mutex // guards open, next
	open map[string]map[uint64]bool
	next uint64
}

func (t *connTracker) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	remote := c.RemoteAddr().String()
	t.mu.Lock()
	if t.open == nil {
		t.open = make(map[string]map[uint64]bool)
	}
	if t.open[remote] == nil {
		t.open[remote] = make(map[uint64]bool)
	}
	t.next++
	id := t.next
	t.open[remote][id] = true
	t.mu.Unlock()
	return &trackedConn{Conn: c, t: t, remote: remote, id: id}, nil
}

// openTo returns the ids of the open connections to addr.
func (t *connTracker) openTo(addr string) map[uint64]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[uint64]bool)
	for id := range t.open[addr] {
		out[id] = true
	}
	return out
}

type trackedConn struct {
	net.Conn
	t      *connTracker
	remote string
	id     uint64
	once   sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.open[c.remote], c.id)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

// countKeys stands for n connections the path cannot tell apart: keys
// 1..n, so that connections open at the fault and still open 10s later
// are counted as such when the count did not drop (transport.Wrap's
// OpenConns gives counts only).
func countKeys(n int) map[uint64]bool {
	out := make(map[uint64]bool, n)
	for i := range n {
		out[uint64(i+1)] = true
	}
	return out
}

// clientGo builds a client-go configuration and client with client-go's
// defaults (HTTP/2, 30s+15s connection health check) for host.
func clientGo(e *env, host string) (*rest.Config, *http.Client, *connTracker, error) {
	cfg := e.bed.RESTConfig(testbed.Origin)
	cfg.Host = host
	cfg.UserAgent = "apifailover-bench"
	t := &connTracker{}
	cfg.Dial = t.dial
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return cfg, hc, t, nil
}

func alwaysSettled() bool { return true }

func unknownHealth(string) (bool, bool) { return false, false }

func startDirect(e *env) (*clientPath, error) {
	first := e.bed.APIServers()[0]
	cfg, hc, t, err := clientGo(e, first.URL())
	if err != nil {
		return nil, err
	}
	return &clientPath{
		name: pathDirect, config: cfg, httpClient: hc,
		serving:      func() string { return first.Addr() },
		down:         unknownHealth,
		settled:      alwaysSettled,
		openConns:    t.openTo,
		markBaseline: func() {},
		exited:       func() bool { return false },
		sent:         unknownSent,
		close:        hc.CloseIdleConnections,
	}, nil
}

func startTransport(ctx context.Context, e *env) (*clientPath, error) {
	f, err := transport.Wrap(ctx, e.bed.RESTConfig(testbed.Origin), transport.Options{})
	if err != nil {
		return nil, err
	}
	_, addrs := e.servers()
	state := func() map[string]upstream.Status {
		out := make(map[string]upstream.Status)
		for _, s := range f.Pool().Status() {
			out[s.Addr] = s
		}
		return out
	}
	views := func() (map[string]endpointView, error) {
		out := make(map[string]endpointView)
		for addr, s := range state() {
			out[addr] = endpointView{Down: s.State != upstream.StateHealthy, Suspect: s.Suspect, Preferred: s.Preferred}
		}
		return out, nil
	}
	return &clientPath{
		name: pathTransport, config: f.Config(), httpClient: f.HTTPClient(),
		serving: workload.FailoverServing(f),
		views:   views,
		down:    downVia(views, true), // missing: left the pool
		settled: func() bool {
			st := state()
			for _, a := range addrs {
				if s, ok := st[a]; !ok || s.State != upstream.StateHealthy || s.RTT == 0 {
					return false
				}
			}
			return true
		},
		openConns:    func(addr string) map[uint64]bool { return countKeys(f.OpenConns()[addr]) },
		markBaseline: func() {},
		exited:       func() bool { return false },
		sent:         unknownSent,
		close:        func() { f.Close() },
	}, nil
}

// proxyPath fills what the proxy paths share: a client-go client for
// listen, the connection watcher on the proxy's processes.
func proxyPath(e *env, name, listen string, p *proc, pids func() []int) (*clientPath, error) {
	cfg, hc, _, err := clientGo(e, "https://"+listen)
	if err != nil {
		p.stop()
		return nil, err
	}
	_, addrs := e.servers()
	w := newConnWatcher(pids, addrs)
	return &clientPath{
		name: name, config: cfg, httpClient: hc,
		serving:      w.serving,
		down:         unknownHealth,
		settled:      alwaysSettled,
		openConns:    w.openTo,
		markBaseline: w.markBaseline,
		pids:         pids,
		exited:       func() bool { done, _ := p.exited(); return done },
		sent:         unknownSent,
		close: func() {
			hc.CloseIdleConnections()
			p.stop()
		},
	}, nil
}

// localproxyStatus reads the /status of the localproxy binary the
// benchmark runs.
func localproxyStatus() (localproxy.Status, error) {
	var st localproxy.Status
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(localproxyHealthPort) + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func startLocalProxy(ctx context.Context, e *env, dir string) (*clientPath, error) {
	kubeconfig := filepath.Join(dir, "localproxy.kubeconfig")
	if err := e.bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.LocalProxyIdentity); err != nil {
		return nil, err
	}
	_, addrs := e.servers()
	listen := "127.0.0.1:" + strconv.Itoa(localproxyListenPort)
	p, err := startProc(ctx, "localproxy", filepath.Join(dir, "localproxy.log"), listen, e.localproxyBin,
		localproxyArgs(addrs, e.bed.CAFile(), e.bed.OriginName(), kubeconfig)...)
	if err != nil {
		return nil, err
	}
	cp, err := proxyPath(e, pathLocalProxy, listen, p, func() []int { return []int{p.pid()} })
	if err != nil {
		return nil, err
	}
	status := localproxyStatus
	cp.views = func() (map[string]endpointView, error) {
		st, err := status()
		if err != nil {
			return nil, err
		}
		out := make(map[string]endpointView, len(st.Upstreams))
		for _, u := range st.Upstreams {
			out[u.Addr] = endpointView{Down: u.State != "healthy", Suspect: u.Suspect, Preferred: u.Preferred}
		}
		return out, nil
	}
	cp.down = downVia(cp.views, true) // missing: left the pool
	cp.sent = func(addr string) (int, bool) {
		n, err := localproxyDials(addr)
		return n, err == nil
	}
	cp.settled = func() bool {
		st, err := status()
		if err != nil {
			return false
		}
		healthy := 0
		for _, u := range st.Upstreams {
			if u.State == "healthy" && u.RTT > 0 {
				healthy++
			}
		}
		return healthy >= len(addrs)
	}
	return cp, nil
}

func startHAProxyPath(ctx context.Context, e *env, dir string) (*clientPath, error) {
	names, addrs := e.servers()
	p, sock, err := startHAProxy(ctx, dir, names, addrs, 0)
	if err != nil {
		return nil, err
	}
	cp, err := proxyPath(e, pathHAProxy, haproxyListen, p, func() []int { return []int{p.pid()} })
	if err != nil {
		return nil, err
	}
	nameOf := make(map[string]string)
	for i, a := range addrs {
		nameOf[a] = names[i]
	}
	cp.views = func() (map[string]endpointView, error) {
		st, err := haproxyServerStates(sock)
		if err != nil {
			return nil, err
		}
		out := make(map[string]endpointView, len(st))
		for i, n := range names {
			if s, ok := st[n]; ok {
				up := strings.HasPrefix(s, "UP")
				out[addrs[i]] = endpointView{Down: !up, Suspect: up && s != "UP"}
			}
		}
		return out, nil
	}
	cp.down = downVia(cp.views, false)
	cp.sent = func(addr string) (int, bool) {
		st, err := haproxyServerStats(sock)
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(st[nameOf[addr]]["stot"])
		return n, err == nil
	}
	cp.settled = func() bool {
		st, err := haproxyServerStates(sock)
		if err != nil {
			return false
		}
		for _, n := range names {
			if st[n] != "UP" {
				return false
			}
		}
		return true
	}
	return cp, nil
}

// nginxTree returns nginx's processes: the master p and its workers (forked
// once), read again at most every second.
func nginxTree(p *proc) func() []int {
	var mu sync.Mutex
	var pids []int
	var at time.Time
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) > time.Second {
			pids, at = processTree(p.pid()), time.Now()
		}
		return pids
	}
}

func startNginxPath(ctx context.Context, e *env, dir string) (*clientPath, error) {
	_, addrs := e.servers()
	sessionLog := ""
	if e.sessionLogs {
		sessionLog = filepath.Join(dir, "nginx-sessions.log")
	}
	p, err := startNginx(ctx, dir, addrs, sessionLog)
	if err != nil {
		return nil, err
	}
	cp, err := proxyPath(e, pathNginx, nginxListen, p, nginxTree(p))
	if err != nil || sessionLog == "" {
		return cp, err
	}
	cp.sent = func(addr string) (int, bool) {
		n, err := nginxSessionsTo(sessionLog, addr)
		return n, err == nil
	}
	return cp, nil
}
