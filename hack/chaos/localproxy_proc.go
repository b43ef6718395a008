package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// The soak's localproxy is the cmd/localproxy binary, built with the race
// detector and run as its own process the way a node runs it: flags, the
// bed's CA and a kubeconfig of the localproxy identity, JSON logs to a
// file per instance (_output/chaos/localproxy-N.log), a hand-over by a
// second process on the same addresses (SO_REUSEPORT) and SIGTERM to the
// first. The soak sees it from outside only: /status and /metrics on its
// health port, its log lines, and /proc (descriptors, sockets, memory,
// CPU), so that its own memory and descriptors are measured apart from
// the clients'.

const (
	// proxyMonitorEvery is how often the soak reads /status and each
	// instance's memory.
	proxyMonitorEvery = 100 * time.Millisecond
	// proxyStatusStale: an instance's /status older than this is not
	// used (the health server, under attack or with two instances on
	// its port, may miss a few reads).
	proxyStatusStale = 3 * time.Second
	// proxyStartLimit bounds the wait for a new instance to listen.
	proxyStartLimit = 30 * time.Second
	// proxyExitLimit bounds an instance's exit after SIGTERM: its wait
	// for a successor (--handover-timeout) and its drain
	// (--shutdown-timeout), with room to spare.
	proxyExitLimit = localproxy.DefaultHandoverTimeout + localproxy.DefaultShutdownTimeout + 15*time.Second
	// proxyLogLevel is the instances' verbosity: every probe and
	// connection is logged, so that the secrets scan covers the most
	// the binary logs in practice.
	proxyLogLevel = 4
	// daemonSetManifest is the DaemonSet whose memory limit bounds each
	// instance's resident set.
	daemonSetManifest = "cmd/localproxy/deploy/daemonset.yaml"
)

// LocalProxyReport is what the soak measured of its localproxy processes.
type LocalProxyReport struct {
	// Instances started (1 + the hand-overs) and their logs.
	Instances int      `json:"instances"`
	Logs      []string `json:"logs"`
	// MaxRSS is the largest peak resident set (VmHWM) of an instance;
	// RSSByInstance each one's. RSSBound is the bound it is held to: the
	// memory limit of the localproxy container in the DaemonSet we ship
	// (daemonSetManifest), which the instances meet although the race
	// detector's shadow memory adds to theirs.
	MaxRSS        int64   `json:"max_rss_bytes"`
	RSSByInstance []int64 `json:"rss_by_instance_bytes"`
	RSSBound      int64   `json:"rss_bound_bytes"`
	// Baseline goroutines and descriptors of the first instance before
	// the load started; Leaked what the serving instance held above them
	// once the clients stopped.
	BaselineGoroutines int `json:"baseline_goroutines"`
	BaselineFDs        int `json:"baseline_fds"`
	LeakedGoroutines   int `json:"leaked_goroutines"`
	LeakedFDs          int `json:"leaked_fds"`
	// DataRaces: race reports in the instances' output.
	DataRaces int `json:"data_races"`
	// Exits: how each instance ended, "0" for a clean exit.
	Exits []string `json:"exits"`
	// Events: pool events read from the logs of the serving instance
	// (down, up, preferred).
	Events int `json:"events"`
}

// proxyInstance is one localproxy process.
type proxyInstance struct {
	n       int
	cmd     *exec.Cmd
	logPath string
	// exited is closed once the process exited and its output is read;
	// err is then Wait's error.
	exited    chan struct{}
	err       error
	listening atomic.Bool
	hwm       atomic.Int64 // VmHWM, bytes, as last read
	races     atomic.Int64
}

func (in *proxyInstance) pid() int { return in.cmd.Process.Pid }

// proxyHandle is the soak's localproxy: whichever instance serves now,
// and those still draining. A hand-over starts a successor on the same
// addresses and makes it the serving one; the replaced instance then gets
// SIGTERM, hands over and drains.
type proxyHandle struct {
	bin    string
	args   []string
	out    string // where the logs go
	listen string // the client address, host:port
	health string // the health address every instance binds
	port   int    // the listen port
	// rssBound is the DaemonSet's memory limit of the localproxy
	// container.
	rssBound int64
	client   *http.Client
	say      func(format string, args ...any)

	mu     sync.Mutex // guards the fields below
	cur    *proxyInstance
	all    []*proxyInstance
	live   map[int]*proxyInstance // by pid, until it exited
	snaps  map[int]statusSnap     // the last /status of each live instance, by pid
	record func(upstream.Event)   // gets the serving instance's pool events
	events int

	stopMon context.CancelFunc
	monDone chan struct{}
}

type statusSnap struct {
	at time.Time
	st localproxy.Status
}

// startLocalProxy builds cmd/localproxy with the race detector and runs
// its first instance in front of the bed's apiservers on the bed's
// LocalProxy address, with the health server on the next port: held
// probes verified with the bed's CA, discovery through the proxy as the
// localproxy identity; it returns once the instance listens.
func (r *run) startLocalProxy(ctx context.Context, bin string) (*proxyHandle, error) {
	bed := r.bed
	listen := strings.TrimPrefix(bed.RESTConfig(testbed.LocalProxy).Host, "https://")
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("localproxy port in %q: %w", listen, err)
	}
	kubeconfig := filepath.Join(filepath.Dir(bin), "localproxy.kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.Origin, testbed.LocalProxyIdentity); err != nil {
		return nil, err
	}
	var eps []string
	for _, s := range bed.APIServers() {
		eps = append(eps, s.Addr())
	}
	h := &proxyHandle{bin: bin, out: r.opts.Out, listen: listen, health: net.JoinHostPort(host, strconv.Itoa(p+1)), port: p, say: r.say,
		live: map[int]*proxyInstance{}, snaps: map[int]statusSnap{},
		client: &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}}
	h.args = []string{
		"--endpoints=" + strings.Join(eps, ","),
		"--ca-file=" + bed.CAFile(),
		"--tls-server-name=" + bed.OriginName(),
		"--kubeconfig=" + kubeconfig,
		"--bind-address=" + host,
		"--bind-port=" + port,
		"--health-port=" + strconv.Itoa(p+1),
		"--log-format=json",
		"--log-level=" + strconv.Itoa(proxyLogLevel),
	}
	if h.rssBound, err = daemonSetMemoryLimit(); err != nil {
		return nil, err
	}
	old, _ := filepath.Glob(filepath.Join(r.opts.Out, "localproxy-*.log"))
	for _, f := range old {
		os.Remove(f)
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.stopMon, h.monDone = cancel, make(chan struct{})
	go h.monitor(mctx)
	in, err := h.launch(ctx)
	if err != nil {
		h.close()
		return nil, err
	}
	h.mu.Lock()
	h.cur = in
	h.mu.Unlock()
	return h, nil
}

// launch starts an instance and returns once it listens.
func (h *proxyHandle) launch(ctx context.Context) (*proxyInstance, error) {
	h.mu.Lock()
	in := &proxyInstance{n: len(h.all) + 1, exited: make(chan struct{})}
	h.mu.Unlock()
	in.logPath = filepath.Join(h.out, fmt.Sprintf("localproxy-%d.log", in.n))
	f, err := os.Create(in.logPath)
	if err != nil {
		return nil, err
	}
	w := &lineWriter{w: f, line: func(l []byte) { h.onLine(in, l) }}
	in.cmd = exec.Command(h.bin, h.args...)
	in.cmd.Stdout, in.cmd.Stderr = w, w
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // not outliving the soak
	if err := in.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("localproxy instance %d: %w", in.n, err)
	}
	h.mu.Lock()
	h.all = append(h.all, in)
	h.live[in.pid()] = in
	h.mu.Unlock()
	go func() {
		in.err = in.cmd.Wait()
		w.flush()
		f.Close()
		h.mu.Lock()
		delete(h.live, in.pid())
		delete(h.snaps, in.pid())
		h.mu.Unlock()
		close(in.exited)
	}()
	err = waitFor(ctx, proxyStartLimit, func() bool { return in.listening.Load() || isClosed(in.exited) })
	if err != nil || !in.listening.Load() {
		h.stop(in)
		return nil, fmt.Errorf("localproxy instance %d did not listen within %s (%v; exit %v); its log: %s", in.n, proxyStartLimit, err, in.err, in.logPath)
	}
	return in, nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// onLine takes one line of an instance's output: it notes that the
// instance listens, counts race reports, and passes the serving
// instance's pool events to the recorder.
func (h *proxyHandle) onLine(in *proxyInstance, l []byte) {
	if bytes.Contains(l, []byte("WARNING: DATA RACE")) {
		in.races.Add(1)
	}
	if bytes.Contains(l, []byte(`"msg":"proxy listening"`)) {
		in.listening.Store(true)
	}
	ev, ok := eventOf(l)
	if !ok {
		return
	}
	h.mu.Lock()
	rec := h.record
	if rec == nil || h.cur != in {
		h.mu.Unlock()
		return
	}
	h.events++
	h.mu.Unlock()
	rec(ev)
}

// eventOf reads a pool event from a log line of cmd/localproxy
// (--log-format=json): "endpoint healthy", "endpoint down" and, at
// verbosity 1, "preferred endpoint changed", as transport/upstream's Pool
// logs them with its events.
func eventOf(l []byte) (upstream.Event, bool) {
	if !bytes.Contains(l, []byte(`"msg":"endpoint `)) && !bytes.Contains(l, []byte(`"msg":"preferred endpoint changed"`)) {
		return upstream.Event{}, false
	}
	var line struct {
		Msg   string `json:"msg"`
		Addr  string `json:"addr"`
		Prev  string `json:"prev"`
		State string `json:"state"`
	}
	if json.Unmarshal(l, &line) != nil || line.Addr == "" {
		return upstream.Event{}, false
	}
	switch line.Msg {
	case "endpoint healthy":
		return upstream.Event{Kind: upstream.EventUp, Addr: line.Addr, State: upstream.StateHealthy}, true
	case "endpoint down":
		ev := upstream.Event{Kind: upstream.EventDown, Addr: line.Addr}
		if ev.State.UnmarshalText([]byte(line.State)) != nil {
			ev.State = upstream.StateUnhealthy
		}
		return ev, true
	case "preferred endpoint changed":
		return upstream.Event{Kind: upstream.EventPreferred, Addr: line.Addr, Prev: line.Prev}, true
	}
	return upstream.Event{}, false
}

// lineWriter writes what it gets to w and hands each whole line to line.
// exec's copying goroutine is its only writer.
type lineWriter struct {
	w    io.Writer
	line func([]byte)
	buf  []byte
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.w.Write(p)
	lw.buf = append(lw.buf, p...)
	for {
		i := bytes.IndexByte(lw.buf, '\n')
		if i < 0 {
			break
		}
		lw.line(lw.buf[:i])
		lw.buf = lw.buf[i+1:]
	}
	if len(lw.buf) == 0 {
		lw.buf = nil // not to keep a large backing array
	}
	return len(p), nil
}

// flush hands on a last line without its newline.
func (lw *lineWriter) flush() {
	if len(lw.buf) > 0 {
		lw.line(lw.buf)
		lw.buf = nil
	}
}

// monitor reads /status (whichever instance answers: both do during a
// hand-over) and each live instance's peak memory every
// proxyMonitorEvery.
func (h *proxyHandle) monitor(ctx context.Context) {
	defer close(h.monDone)
	t := time.NewTicker(proxyMonitorEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := h.fetchStatus(ctx)
		h.mu.Lock()
		if _, ok := h.live[st.PID]; ok && err == nil {
			h.snaps[st.PID] = statusSnap{at: time.Now(), st: st}
		}
		live := make([]*proxyInstance, 0, len(h.live))
		for _, in := range h.live {
			live = append(live, in)
		}
		h.mu.Unlock()
		for _, in := range live {
			if v := procStatusBytes(in.pid(), "VmHWM:"); v > in.hwm.Load() {
				in.hwm.Store(v)
			}
		}
	}
}

func (h *proxyHandle) fetchStatus(ctx context.Context) (localproxy.Status, error) {
	var st localproxy.Status
	b, err := h.get(ctx, "/status")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// get fetches path from the health server, whichever instance answers.
func (h *proxyHandle) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.health+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return b, err
}

// metrics reads /metrics from whichever instance answers.
func (h *proxyHandle) metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	b, err := h.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// status is the serving instance's last /status, and whether there is a
// recent one (within proxyStatusStale).
func (h *proxyHandle) status() (localproxy.Status, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return localproxy.Status{}, false
	}
	return h.snapLocked(h.cur)
}

// snapLocked is in's last /status, if recent.
func (h *proxyHandle) snapLocked(in *proxyInstance) (localproxy.Status, bool) {
	s, ok := h.snaps[in.pid()]
	if !ok || time.Since(s.at) > proxyStatusStale {
		return localproxy.Status{}, false
	}
	return s.st, true
}

// ready reports whether in's last /status said ready.
func (h *proxyHandle) ready(in *proxyInstance) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.snapLocked(in)
	return ok && st.Ready
}

// poolStatus is the serving instance's pool as its last /status lists it.
func (h *proxyHandle) poolStatus() []upstream.Status {
	st, _ := h.status()
	out := make([]upstream.Status, 0, len(st.Upstreams))
	for _, u := range st.Upstreams {
		s := u.Status
		_ = s.Sources.UnmarshalText([]byte(u.Sources))
		_ = s.State.UnmarshalText([]byte(u.State))
		out = append(out, s)
	}
	return out
}

// pids are the live instances' process ids, the serving one first.
func (h *proxyHandle) pids() []int {
	p, _ := h.pidsAndOthers()
	return p
}

// others are the live instances but the serving one (those draining).
func (h *proxyHandle) others() []int {
	_, o := h.pidsAndOthers()
	return o
}

// pidsAndOthers returns the live instances' process ids, the serving one
// first, and those of the others, read at one moment.
func (h *proxyHandle) pidsAndOthers() (all, others []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil {
		if _, ok := h.live[h.cur.pid()]; ok {
			all = append(all, h.cur.pid())
		}
	}
	for pid, in := range h.live {
		if in != h.cur {
			all = append(all, pid)
			others = append(others, pid)
		}
	}
	return all, others
}

// clientConns counts the client connections the live instances hold:
// their sockets on the listen port.
func (h *proxyHandle) clientConns() int64 {
	tab := readTCPTable()
	n := 0
	for _, pid := range h.pids() {
		n += tab.count(pid, h.isClient)
	}
	return int64(n)
}

// isClient reports whether s, a socket of an instance, is a client
// connection: accepted on the listen port and connected.
func (h *proxyHandle) isClient(s tcpSocket) bool { return s.localPort == h.port && s.connected() }

// swap makes next the serving instance and returns the one it replaces.
func (h *proxyHandle) swap(next *proxyInstance) *proxyInstance {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cur
	h.cur = next
	return old
}

// setRecorder makes rec the recorder of the serving instance's events
// from now on.
func (h *proxyHandle) setRecorder(rec func(upstream.Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record = rec
}

// stop sends SIGTERM to in and waits for its exit, killing it after
// proxyExitLimit; false if it had to be killed.
func (h *proxyHandle) stop(in *proxyInstance) bool {
	in.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(proxyExitLimit)
	defer t.Stop()
	select {
	case <-in.exited:
		return true
	case <-t.C:
		in.cmd.Process.Kill()
		<-in.exited
		return false
	}
}

// close stops every live instance and the monitor.
func (h *proxyHandle) close() {
	h.mu.Lock()
	var live []*proxyInstance
	for _, in := range h.live {
		live = append(live, in)
	}
	h.mu.Unlock()
	for _, in := range live {
		if !h.stop(in) {
			h.say("localproxy instance %d did not exit within %s of SIGTERM: killed", in.n, proxyExitLimit)
		}
	}
	h.stopMon()
	<-h.monDone
}

// counts are the serving instance's goroutines (its go_goroutines) and
// descriptors; -1 where unknown.
func (h *proxyHandle) counts(ctx context.Context) (goroutines, fds int) {
	goroutines, fds = -1, -1
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	if cur == nil {
		return
	}
	fds = len(fdLinks(cur.pid()))
	mfs, err := h.metrics(ctx)
	if err == nil {
		if mf := mfs["go_goroutines"]; mf != nil && len(mf.GetMetric()) > 0 {
			goroutines = int(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	return
}

// report sums up the instances once they all exited: memory, races, how
// each ended. Descriptors and goroutines are filled in by the caller.
func (h *proxyHandle) report() LocalProxyReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := LocalProxyReport{Instances: len(h.all), RSSBound: h.rssBound, Events: h.events}
	for _, in := range h.all {
		r.Logs = append(r.Logs, filepath.Base(in.logPath))
		r.RSSByInstance = append(r.RSSByInstance, in.hwm.Load())
		r.MaxRSS = max(r.MaxRSS, in.hwm.Load())
		r.DataRaces += int(in.races.Load())
		exit := "running"
		if isClosed(in.exited) {
			exit = "0"
			if in.err != nil {
				exit = in.err.Error()
			}
		}
		r.Exits = append(r.Exits, exit)
	}
	return r
}

// violations are the report's broken invariants.
func (r LocalProxyReport) violations() []string {
	var v []string
	if r.MaxRSS > r.RSSBound {
		v = append(v, fmt.Sprintf("localproxy: an instance's peak resident set was %d MiB, above the bound %d MiB (by instance: %v)", r.MaxRSS>>20, r.RSSBound>>20, r.RSSByInstance))
	}
	if r.DataRaces > 0 {
		v = append(v, fmt.Sprintf("localproxy: %d data races reported (see %s)", r.DataRaces, strings.Join(r.Logs, ", ")))
	}
	for i, e := range r.Exits {
		if e != "0" {
			v = append(v, fmt.Sprintf("localproxy instance %d ended: %s", i+1, e))
		}
	}
	if r.LeakedGoroutines > leakSlack {
		v = append(v, fmt.Sprintf("localproxy: %d goroutines above its baseline of %d after the clients stopped", r.LeakedGoroutines, r.BaselineGoroutines))
	}
	if r.LeakedFDs > leakSlack {
		v = append(v, fmt.Sprintf("localproxy: %d file descriptors above its baseline of %d after the clients stopped", r.LeakedFDs, r.BaselineFDs))
	}
	return v
}

// logs returns the instances' logs.
func (h *proxyHandle) logs() string {
	h.mu.Lock()
	all := append([]*proxyInstance(nil), h.all...)
	h.mu.Unlock()
	var b strings.Builder
	for _, in := range all {
		data, _ := os.ReadFile(in.logPath)
		b.Write(data)
	}
	return b.String()
}

// procStatusBytes reads a "kB" field of /proc/pid/status (e.g. "VmHWM:")
// in bytes; 0 if unreadable.
func procStatusBytes(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// fdLinks returns what pid's descriptors point at ("socket:[123]",
// "pipe:[45]", a path); nil if unreadable.
func fdLinks(pid int) []string {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil {
			out = append(out, l)
		}
	}
	return out
}

// settledCounts returns the serving instance's goroutines and
// descriptors once they are back within leakSlack of (g, fd), or after
// 15s: connections the clients closed take a moment to go.
func (h *proxyHandle) settledCounts(ctx context.Context, g, fd int) (int, int) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ng, nfd := h.counts(ctx)
		if (ng >= 0 && ng <= g+leakSlack && nfd <= fd+leakSlack) || time.Now().After(deadline) || ctx.Err() != nil {
			return ng, nfd
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// discovered reports whether at least n endpoints of st came from
// discovery.
func discovered(st []upstream.Status, n int) bool {
	k := 0
	for _, s := range st {
		if s.Sources&upstream.SourceDiscovery != 0 {
			k++
		}
	}
	return k >= n
}

// cpu returns the live instances' pids and the CPU seconds (user and
// system) of those that exited.
func (h *proxyHandle) cpu() (live map[int]bool, exited float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	live = map[int]bool{}
	for pid := range h.live {
		live[pid] = true
	}
	for _, in := range h.all {
		if isClosed(in.exited) && in.cmd.ProcessState != nil {
			exited += (in.cmd.ProcessState.UserTime() + in.cmd.ProcessState.SystemTime()).Seconds()
		}
	}
	return live, exited
}

// daemonSetMemoryLimit reads the memory limit of the localproxy container
// in the DaemonSet we ship.
func daemonSetMemoryLimit() (int64, error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(root, daemonSetManifest))
	if err != nil {
		return 0, err
	}
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var ds appsv1.DaemonSet
		if yaml.Unmarshal([]byte(doc), &ds) != nil || ds.Kind != "DaemonSet" {
			continue
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && c.Name == "localproxy" {
				return m.Value(), nil
			}
		}
	}
	return 0, fmt.Errorf("chaos: %s has no DaemonSet with a memory limit on its localproxy container", daemonSetManifest)
}
