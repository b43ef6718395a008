package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
)

func TestParseProcNetTCP(t *testing.T) {
	// Two lines of a little-endian machine's /proc/net/tcp.
	text := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1D15 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:C350 0100FA0A:192B 01 00000000:00000000 02:000AF4B1 00000000     0        0 67890 2 0000000000000000 20 4 30 10 -1
`
	got, err := parseProcNetTCP(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []sockConn{
		{Local: netip.MustParseAddrPort("127.0.0.1:7445"), Remote: netip.MustParseAddrPort("0.0.0.0:0"), State: 0x0A, Inode: 12345},
		{Local: netip.MustParseAddrPort("127.0.0.1:50000"), Remote: netip.MustParseAddrPort("10.250.0.1:6443"), State: tcpEstablished, Inode: 67890},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d sockets, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("socket %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if !got[1].open() || got[0].open() {
		t.Errorf("open(): established %v, listening %v", got[1].open(), got[0].open())
	}
}

// TestTCPConnsOfSelf finds a connection this process opened.
func TestTCPConnsOfSelf(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	dialed := time.Now()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s := <-accepted; s != nil {
		defer s.Close()
	}
	conns, err := tcpConnsOf([]int{os.Getpid()})
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	w := newConnWatcher(func() []int { return []int{os.Getpid()} }, []string{ln.Addr().String()})
	found := false
	for _, sc := range conns {
		if sc.Remote.String() == ln.Addr().String() && sc.open() {
			found = true
		}
	}
	if !found {
		t.Errorf("connection to %s not among this process's sockets %+v", ln.Addr(), conns)
	}
	if n := len(w.openTo(ln.Addr().String())); n != 1 {
		t.Errorf("openTo: %d connections, want 1", n)
	}
	// On a loaded machine the connection may be older than that by now;
	// then there is nothing to check.
	if s := w.serving(); s != "" && time.Since(dialed) < watcherMinAge {
		t.Errorf("serving = %q for a connection younger than %s, want none", s, watcherMinAge)
	}
}

func TestPeerConfigs(t *testing.T) {
	names := []string{"apiserver-1", "apiserver-2", "apiserver-3"}
	servers := []string{"10.250.0.1:6443", "10.250.0.2:6443", "10.250.0.3:6443"}
	dir := t.TempDir()

	h := haproxyConfig(haproxyListen, names, servers, filepath.Join(dir, "haproxy.sock"), 0)
	for _, want := range []string{
		"bind 127.0.0.1:6443", "balance leastconn", "option httpchk GET /healthz",
		"default-server inter 15s downinter 15s rise 2 fall 2 slowstart 60s maxconn 1000 maxqueue 256 weight 100",
		"server apiserver-2 10.250.0.2:6443 check check-ssl verify none",
		"timeout connect 30s", "timeout client 5m", "timeout server 15m", "timeout check 30s", "retries 5", "option redispatch",
	} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, h)
		}
	}
	n := nginxConfig(nginxListen, servers, filepath.Join(dir, "nginx.pid"), true, filepath.Join(dir, "sessions.log"))
	for _, want := range []string{
		"listen        127.0.0.1:6444;", "least_conn;", "server 10.250.0.3:6443;",
		"proxy_timeout 10m;", "proxy_connect_timeout 1s;", "worker_processes 2;", "load_module " + nginxStreamModulePath + ";",
		"access_log " + filepath.Join(dir, "sessions.log") + " sessions;",
	} {
		if !strings.Contains(n, want) {
			t.Errorf("nginx config lacks %q:\n%s", want, n)
		}
	}

	// The real programs accept them, where installed.
	if _, err := exec.LookPath("haproxy"); err == nil {
		cfg := filepath.Join(dir, "haproxy.cfg")
		if err := os.WriteFile(cfg, []byte(h), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("haproxy", "-c", "-f", cfg).CombinedOutput(); err != nil {
			t.Errorf("haproxy -c: %v\n%s", err, out)
		}
	}
	if _, err := exec.LookPath("nginx"); err == nil && os.Geteuid() == 0 {
		_, serr := os.Stat(nginxStreamModulePath)
		cfg := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(cfg, []byte(nginxConfig(nginxListen, servers, filepath.Join(dir, "nginx.pid"), serr == nil, filepath.Join(dir, "sessions.log"))), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nginx", "-t", "-p", dir, "-c", cfg, "-e", "stderr").CombinedOutput(); err != nil {
			t.Errorf("nginx -t: %v\n%s", err, out)
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0.001, time.Millisecond}} {
		if got := percentile(d, tc.q); got != tc.want {
			t.Errorf("percentile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v, want 0", got)
	}
}

func TestFillRatios(t *testing.T) {
	rows := []OverheadRow{
		{Op: opGetSeq, Path: pathDirect, P50ms: 2, P99ms: 4, PerSec: 500},
		{Op: opGetSeq, Path: pathHAProxy, P50ms: 3, P99ms: 8, PerSec: 250, ProxyCPUMicros: 40},
		{Op: opList, Path: pathHAProxy, P50ms: 3}, // no direct row: no ratio
		{Op: opGetSeq, Path: pathLocalProxy, P50ms: 3, ProxyCPUMicros: 50},
		{Op: opList, Path: pathLocalProxy, P50ms: 3, ProxyCPUMicros: 50}, // no HAProxy CPU: no ratio
	}
	fillRatios(rows)
	if r := rows[0]; r.P50Ratio != 1 || r.PerSecRatio != 1 {
		t.Errorf("direct ratios %+v, want 1", r)
	}
	if r := rows[1]; r.P50Ratio != 1.5 || r.P99Ratio != 2 || r.PerSecRatio != 0.5 {
		t.Errorf("haproxy ratios %+v, want 1.5, 2, 0.5", r)
	}
	if r := rows[2]; r.P50Ratio != 0 {
		t.Errorf("ratio without a baseline = %v, want 0", r.P50Ratio)
	}
	if r := rows[3]; r.CPUVsHAProxy != 1.25 {
		t.Errorf("CPU against HAProxy %v, want 1.25", r.CPUVsHAProxy)
	}
	if r := rows[4]; r.CPUVsHAProxy != 0 {
		t.Errorf("CPU against HAProxy without its figure = %v, want 0", r.CPUVsHAProxy)
	}
}

// The spread of the rounds' CPU ratios pairs each round with HAProxy's
// same round; a round without a figure, or rounds that do not pair,
// give none.
func TestFillRatiosRounds(t *testing.T) {
	rows := []OverheadRow{
		{Op: opList, Path: pathHAProxy, ProxyCPUMicros: 300, ProxyCPURounds: []float64{200, 400, 300}},
		{Op: opList, Path: pathLocalProxy, ProxyCPUMicros: 300, ProxyCPURounds: []float64{300, 300, 300}},
		{Op: opList, Path: pathNginx, ProxyCPUMicros: 300, ProxyCPURounds: []float64{300, 0, 300}},
		{Op: opList, Path: pathDirect, ProxyCPURounds: []float64{300, 300}},
	}
	fillRatios(rows)
	if got, want := rows[1].CPUVsHAProxyRounds, [2]float64{0.75, 1.5}; got != want {
		t.Errorf("rounds' spread %v, want %v", got, want)
	}
	if got := rows[0].CPUVsHAProxyRounds; got != [2]float64{1, 1} {
		t.Errorf("HAProxy's own spread %v, want [1 1]", got)
	}
	for _, i := range []int{2, 3} {
		if got := rows[i].CPUVsHAProxyRounds; got != [2]float64{} {
			t.Errorf("%s: spread %v without every round paired, want none", rows[i].Path, got)
		}
	}
}

func TestFirstGetElsewhere(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	servers := map[string]*testbed.APIServer{"10.250.0.1:6443": {}, "10.250.0.2:6443": {}}
	victim := "10.250.0.1:6443"
	fail := errors.New("timeout")
	for _, tc := range []struct {
		name     string
		gets     []workload.Request
		graceful bool
		want     time.Duration // 0: none
	}{
		{"endpoint known", []workload.Request{
			{Start: at(-time.Second), End: at(time.Millisecond), Endpoint: "10.250.0.2:6443"}, // sent before the fault
			{Start: at(0), End: at(10 * time.Millisecond), Endpoint: victim},
			{Start: at(0), End: at(20 * time.Millisecond), Endpoint: "10.250.0.2:6443", Err: fail},
			{Start: at(0), End: at(30 * time.Millisecond), Endpoint: "10.250.0.2:6443"},
		}, false, 30 * time.Millisecond},
		{"proxy, victim cannot answer", []workload.Request{
			{Start: at(0), End: at(40 * time.Millisecond), Endpoint: "127.0.0.1:6443", Serving: victim},
		}, false, 40 * time.Millisecond},
		{"proxy, graceful: the serving apiserver decides", []workload.Request{
			{Start: at(0), End: at(10 * time.Millisecond), Endpoint: "127.0.0.1:6443", Serving: victim},
			{Start: at(0), End: at(50 * time.Millisecond), Endpoint: "127.0.0.1:6443", Serving: "10.250.0.2:6443"},
		}, true, 50 * time.Millisecond},
		{"direct never", []workload.Request{
			{Start: at(0), End: at(10 * time.Millisecond), Endpoint: victim},
		}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := firstGetElsewhere(workload.Results{Gets: tc.gets}, t0, victim, tc.graceful, servers)
			switch {
			case tc.want == 0 && ok:
				t.Errorf("got %v, want none", got.Sub(t0))
			case tc.want != 0 && (!ok || got.Sub(t0) != tc.want):
				t.Errorf("got %v (%v), want %v", got.Sub(t0), ok, tc.want)
			}
		})
	}
}

func TestMarkdown(t *testing.T) {
	down := 0.5
	r := &Results{Date: "2026-01-02 03:04 UTC", Machine: "2 cores", Versions: map[string]string{"haproxy": "2.6"}}
	r.Overhead.Config = overheadConfig{Rounds: 1, GetSeq: 10, GetSparse: 5, SparseGap: 50 * time.Millisecond, GetConc: 10, Concurrency: 2, Lists: 1, ListObjects: 1, ListBytes: 1, NewConn: 1}
	r.Overhead.Rows = []OverheadRow{
		{Op: opGetSeq, Path: pathHAProxy, P50ms: 1.5, P50Ratio: 1.25, ProxyCPUMicros: 30, CPUVsHAProxy: 1},
		{Op: opGetSeq, Path: pathLocalProxy, P50ms: 1.5, P50Ratio: 1.25, ProxyCPUMicros: 45, CPUVsHAProxy: 1.5},
	}
	r.Failover.Rows = []FailoverRow{
		{Fault: "kill", Path: pathHAProxy, HasHealth: true, Observed: 11, Window: 90, MarkedDown: &down},
		{Fault: "kill", Path: pathNginx, Observed: 11, Window: 90},
		{Fault: "hang", Path: pathLocalProxy, Error: "localproxy exited | badly"},
	}
	wantLines(t, r.markdown(),
		"| get-seq | haproxy | 1.50ms | 1.25× |", "30µs | 1.00× |",
		"| get-seq | localproxy | 1.50ms | 1.25× |", "45µs | 1.50× |",
		"10 sequential GETs of a small ConfigMap, 5 more each after a pause of 50ms,",
		"| kill | haproxy | 0.50s | none in 11s |",
		"| kill | nginx | n/a | none in 11s |",
		"error: localproxy exited / badly",
		"haproxy 2.6",
	)
}

func TestFaultRow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	end := at(60)
	res := []ncResult{
		{start: at(-2), end: at(-1.9), ok: false}, // before the fault
		{start: at(-0.1), end: at(2.9), ok: false},
		{start: at(1), end: at(1.2), ok: true},
		{start: at(4), end: at(7), ok: false},
		{start: at(8), end: at(8.5), ok: true},
	}
	row := faultRow(res, t0, end)
	if row.Requests != 4 || row.Failed != 2 || row.FailedBefore != 1 || row.Outage != 4.1 || row.StillFailing || row.SlowestOKms != 500 {
		t.Errorf("faultRow = %+v", row)
	}
	row = faultRow(append(res, ncResult{start: at(56), end: at(59), ok: false}), t0, end)
	if !row.StillFailing || row.Outage != 56.1 {
		t.Errorf("failure in the tail: %+v", row)
	}
	if row := faultRow(nil, t0, end); row.Outage != 0 || row.Requests != 0 {
		t.Errorf("no requests: %+v", row)
	}
}

func TestFillNewConnRatios(t *testing.T) {
	rows := []NewConnRow{
		{Fault: "hang", Path: pathLocalProxy, Failed: 10, Outage: 2},
		{Fault: "hang", Path: pathHAProxy, Failed: 40, Outage: 8},
		{Fault: "kill", Path: pathLocalProxy, Failed: 0},
		{Fault: "kill", Path: pathHAProxy, Failed: 5, Outage: 1},
	}
	fillNewConnRatios(rows)
	if rows[0].FailedRatio != 0.25 || rows[0].OutageRatio != 0.25 || rows[1].FailedRatio != 1 || rows[2].FailedRatio != 0 {
		t.Errorf("ratios = %+v", rows)
	}
}

func TestSumCounter(t *testing.T) {
	text := `# HELP apifailover_localproxy_dials_total Connection attempts.
# TYPE apifailover_localproxy_dials_total counter
apifailover_localproxy_dials_total{endpoint="10.250.0.1:6443",result="error"} 3
apifailover_localproxy_dials_total{endpoint="10.250.0.1:6443",result="ok"} 120
apifailover_localproxy_dials_total{endpoint="10.250.0.2:6443",result="ok"} 7
apifailover_localproxy_dials_totalx{endpoint="10.250.0.1:6443",result="ok"} 1000
`
	n, err := sumCounter(bufio.NewScanner(strings.NewReader(text)), "apifailover_localproxy_dials_total", `endpoint="10.250.0.1:6443"`)
	if err != nil || n != 123 {
		t.Errorf("sumCounter = %d, %v; want 123", n, err)
	}
}

func TestNginxSessionsTo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions.log")
	log := `1700000000.123 200 "10.250.0.1:6443"
1700000000.223 200 "10.250.0.2:6443"
1700000001.001 200 "10.250.0.1:6443, 10.250.0.3:6443"
1700000002.001 502 "10.250.0.11:6443"
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := nginxSessionsTo(path, "10.250.0.1:6443"); err != nil || n != 2 {
		t.Errorf("nginxSessionsTo = %d, %v; want 2", n, err)
	}
	if n, err := nginxSessionsTo(filepath.Join(t.TempDir(), "none"), "10.250.0.1:6443"); err != nil || n != 0 {
		t.Errorf("no log: %d, %v", n, err)
	}
}

func TestNewConnMarkdown(t *testing.T) {
	sent := 12
	down := 1
	r := &Results{Date: "2026-01-02 03:04 UTC", NewConn: &NewConnResults{
		Config: newConnConfig{Rate: 20, TimeoutS: 3, WindowS: 60, LoadedS: 60, Burners: 2},
		Rows: []NewConnRow{
			{Fault: "hang", Path: pathLocalProxy, Failed: 3, Requests: 1200, Outage: 1.5, SentToVictim: &sent, FailedRatio: 0.1, OutageRatio: 0.05, SlowestOKms: 900},
			{Fault: "hang", Path: pathNginx, Failed: 30, Requests: 1200, Outage: 59, StillFailing: true},
			{Fault: "kill", Path: pathHAProxy, Error: "haproxy exited | badly"},
		},
		Loaded: []NewConnLoadedRow{{Path: pathLocalProxy, Failed: 0, Requests: 1200, P50ms: 5, P99ms: 50, Downs: &down, Suspects: &down}, {Path: pathNginx, Requests: 1200}},
	}}
	wantLines(t, r.markdown(),
		"### New connection per request",
		"| hang | localproxy | 3/1200 | 0.10× | 1.50s | 0.05× | 12 | 900ms |",
		"| hang | nginx | 30/1200 | - | ≥59.00s | - | n/a | 0ms |",
		"error: haproxy exited / badly",
		"| localproxy | 0/1200 | - | 5.0ms | 50.0ms | - | 1 | 1 |",
		"| nginx | 0/1200 | - | 0.0ms | 0.0ms | - | n/a | n/a |",
	)
}

func TestSink(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	cert := srv.TLS.Certificates[0]
	srv.Close()
	s := newSink(cert)
	addr := freePort(t)
	if err := s.listen(addr); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, sinkBuffer)
	if _, err := transfer(addr, sinkDiscard, 3*sinkBuffer+5, buf); err != nil {
		t.Errorf("upload: %v", err)
	}
	if _, err := transfer(addr, sinkSource, 3*sinkBuffer+5, buf); err != nil {
		t.Errorf("download: %v", err)
	}
	idle, err := sinkDial(addr, sinkIdle, 0, time.Second)
	if err != nil {
		t.Fatalf("idle: %v", err)
	}
	h := &idleConns{conns: []net.Conn{idle}}
	if n := h.held(); n != 1 {
		t.Errorf("held = %d, want 1", n)
	}
	// Health checks: TLS, any GET answered 200.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get("https://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hc.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Errorf("health check: %d %q", resp.StatusCode, body)
	}
	s.close() // with the idle connection open
	if !waitUntil(context.Background(), 5*time.Second, func() bool { return h.held() == 0 }) {
		t.Error("idle connection still held after the sink closed")
	}
	h.close()
}

func TestProcMem(t *testing.T) {
	rss, fds, err := procMem([]int{os.Getpid()})
	if err != nil || rss <= 0 || fds < 3 {
		t.Errorf("procMem(self) = %d KiB, %d fds, %v", rss, fds, err)
	}
	if _, _, err := procMem([]int{1 << 30}); err == nil {
		t.Error("procMem of no process: no error")
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal: busy = 100+2+50+3+5.
	if got := parseMachineBusy("cpu  100 2 50 9000 7 3 5 11 0 0"); got != 1600*time.Millisecond {
		t.Errorf("parseMachineBusy = %v, want 1.6s", got)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7", "cpu 1 2 x 4 5 6 7", "cpu 1 2"} {
		if got := parseMachineBusy(bad); got != 0 {
			t.Errorf("parseMachineBusy(%q) = %v, want 0", bad, got)
		}
	}
	if machineBusy() <= 0 {
		t.Error("machineBusy() of this machine: none")
	}
}

func TestFillDatapathRatios(t *testing.T) {
	rows := []DatapathThroughputRow{
		{Direction: dirUpload, Path: pathDirect, MiBPerSec: 2000, MachineCPUPerGiB: 0.8},
		{Direction: dirUpload, Path: pathLocalProxy, MiBPerSec: 1000, ProxyCPUPerGiB: 0.5, MachineCPUPerGiB: 1.25},
		{Direction: dirUpload, Path: pathHAProxy, MiBPerSec: 500, ProxyCPUPerGiB: 1},
		{Direction: dirDownload, Path: pathLocalProxy, MiBPerSec: 800, ProxyCPUPerGiB: 0.4},
	}
	fillDatapathRatios(rows)
	if r := rows[1]; r.VsHAProxy != 2 || r.VsDirect != 0.5 || r.CPUVsHAProxy != 0.5 || r.CPUBoundVsDirect != 0.64 {
		t.Errorf("localproxy upload: %+v", r)
	}
	if r := rows[3]; r.VsHAProxy != 0 || r.VsDirect != 0 {
		t.Errorf("download without baselines: %+v", r)
	}
	idle := []DatapathIdleRow{
		{Path: pathLocalProxy, Conns: 1000, KiBPerConn: 30},
		{Path: pathHAProxy, Conns: 1000, KiBPerConn: 20},
		{Path: pathLocalProxy, Conns: 10000, KiBPerConn: 30},
	}
	fillIdleRatios(idle)
	if idle[0].KiBVsHAProxy != 1.5 || idle[2].KiBVsHAProxy != 0 {
		t.Errorf("idle ratios: %+v", idle)
	}
}

func TestFillShortRatios(t *testing.T) {
	rows := []DatapathShortRow{
		{Path: pathDirect, MachineCPUUS: 200},
		{Path: pathLocalProxy, ProxyCPUUS: 150, MachineCPUUS: 450},
		{Path: pathHAProxy, ProxyCPUUS: 100, MachineCPUUS: 400},
	}
	fillShortRatios(rows)
	want := [][3]float64{{0, 0.5, 1}, {1.5, 1.125, 2.25}, {1, 1, 2}} // CPU vs HAProxy, machine vs HAProxy, machine vs direct
	for i, r := range rows {
		got := [3]float64{r.CPUVsHAProxy, r.MachineVsHAProxy, r.MachineVsDirect}
		for j := range got {
			if math.Abs(got[j]-want[i][j]) > 0.01 {
				t.Errorf("%s: ratios %v, want %v", r.Path, got, want[i])
				break
			}
		}
	}
}

func TestDatapathMarkdown(t *testing.T) {
	r := &Results{Date: "2026-01-02 03:04 UTC", Datapath: &DatapathResults{
		Config: datapathConfig{MiB: 1024, Rounds: 4, IdleConns: []int{1000, 9800}, Requested: []int{1000, 10000}, NofileLimit: 20000, HAProxyMaxconn: 9820, ShortConns: 4000, LocalProxyLoopbackCC: "reno"},
		Short: []DatapathShortRow{
			{Path: pathLocalProxy, Conns: 4000, WallUS: 312.4, ProxyCPUUS: 146.25, CPUVsHAProxy: 1.34, MachineCPUUS: 420.5, MachineVsHAProxy: 1.1, MachineVsDirect: 1.9},
			{Path: pathDirect, Conns: 4000, WallUS: 120, MachineCPUUS: 221.3, MachineVsDirect: 1},
		},
		Throughput: []DatapathThroughputRow{{Direction: dirUpload, Path: pathLocalProxy, MiBPerSec: 1234.4, VsHAProxy: 1.1, VsDirect: 0.5, ProxyCPUPerGiB: 0.8, CPUVsHAProxy: 0.9, MachineCPUPerGiB: 1.5, MachineBusy: 0.97, CPUBoundVsDirect: 0.6}, {Direction: dirUpload, Path: pathDirect, MiBPerSec: 2500, VsDirect: 1, MachineCPUPerGiB: 0.9, MachineBusy: 0.99, CPUBoundVsDirect: 1}},
		Link:       &DatapathLinkResults{Rate: "10gbit", TCP: LinkTCP{CongestionControl: "bbr", SinkCongestionControl: "bbr", Rmem: "4096 131072 6291456", Wmem: "4096 16384 4194304", SinkRmem: "4096 131072 33554432", SinkWmem: "4096 16384 4194304"}, Throughput: []DatapathThroughputRow{{Direction: dirDownload, Path: pathLocalProxy, MiBPerSec: 1071.2, VsHAProxy: 1.69, VsDirect: 0.96, ProxyCPUPerGiB: 0.523, CPUVsHAProxy: 0.4, MachineCPUPerGiB: 1.56, MachineBusy: 0.82, CPUBoundVsDirect: 0.78}}},
		Idle: []DatapathIdleRow{
			{Path: pathNginx, Processes: 3, RSSKiB: 10240, FDs: 20},
			{Path: pathNginx, Conns: 1000, Held: 990, Processes: 3, RSSKiB: 20480, FDs: 2000, KiBPerConn: 10.34, FDsPerConn: 2, KiBVsHAProxy: 0.5, Note: "held 990 of 1000 (10 failed to open)"},
			{Path: pathHAProxy, Conns: 1000, Error: "gone | away"},
		},
	}}
	md := r.markdown()
	wantLines(t, md,
		"### Data path",
		"| upload | localproxy | 1234 | 1.10× | 0.50× | 0.800 | 0.90× | 1.500 | 97% | 0.60× |",
		"| upload | direct | 2500 | - | 1.00× | - | - | 0.900 | 99% | 1.00× |",
		"localproxy sets the congestion control of its client sockets on loopback (--loopback-congestion-control=reno); every other socket has the network namespace's.",
		"Throughput across a 10gbit link: ",
		"TCP congestion control, the machine's: bbr on this side (what sends the uploads across the link, and both ways on loopback, but for localproxy's client sockets there, which use reno (its --loopback-congestion-control)), bbr behind the link (what sends the downloads). net.ipv4.tcp_rmem and tcp_wmem: 4096 131072 6291456 and 4096 16384 4194304 here, 4096 131072 33554432 and 4096 16384 4194304 behind the link.",
		"| download | localproxy | 1071 | 1.69× | 0.96× | 0.523 | 0.40× | 1.560 | 82% | 0.78× |",
		"| nginx | 0 | 0 | 3 | 10.0 MiB | 20 | - | - | - |",
		"| nginx (held 990 of 1000 (10 failed to open)) | 1000 | 990 | 3 | 20.0 MiB | 2000 | 10.3 KiB | 0.50× | 2.00 |",
		"| haproxy | 1000 | error: gone / away |",
		"Short connections: 4000 per contender, one at a time, in 4 interleaved rounds",
		"| localproxy | 4000 | 312 | 146.2 | 1.34× | 420.5 | 1.10× | 1.90× |",
		"| direct | 4000 | 120 | - | - | 221.3 | - | 1.00× |",
		"raised to 9820",
		"Asked for 1000, 10000 idle connections; with at most 20000 files per process here",
		"measured at 1000, 9800.",
	)
	r.Datapath.Link.TCP = LinkTCP{CongestionControl: "cubic", Set: true, Rmem: "1 2 3", Wmem: "4 5 6"}
	wantLines(t, r.markdown(), "TCP congestion control, set for this measurement (-datapath-link-cc): cubic on this side (what sends the uploads across the link, and both ways on loopback, but for localproxy's client sockets there, which use reno (its --loopback-congestion-control)), unknown behind the link (what sends the downloads). net.ipv4.tcp_rmem and tcp_wmem: 1 2 3 and 4 5 6 here, unknown and unknown behind the link.")
	if strings.Index(md, "Throughput across") < strings.Index(md, "| upload | direct |") {
		t.Error("the link's table comes before the loopback's")
	}
	if fit, most := fitIdleConns([]int{1000, 10000, 20000}, 20000); most != 9800 || !slices.Equal(fit, []int{1000, 9800}) {
		t.Errorf("fitIdleConns = %v, %d", fit, most)
	}
}

// wantLines reports each of wants that md lacks.
func wantLines(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// freePort returns a loopback address free a moment ago.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// watchFlaps counts changes only: an endpoint first seen down (not probed
// yet) is no down; one that goes down after being up is.
func TestWatchFlapsCountsChanges(t *testing.T) {
	seq := []map[string]endpointView{
		{"a": {Down: true}, "b": {Down: true, Suspect: true}},
		{"a": {}, "b": {}},
		{"a": {Down: true}, "b": {Suspect: true}},
	}
	var mu sync.Mutex
	i := 0
	views := func() (map[string]endpointView, error) {
		mu.Lock()
		defer mu.Unlock()
		v := seq[min(i, len(seq)-1)]
		i++
		return v, nil
	}
	fc := watchFlaps(t.Context(), views)
	for {
		mu.Lock()
		n := i
		mu.Unlock()
		if n > len(seq) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	downs, suspects := fc.result()
	if downs != 1 || suspects != 1 {
		t.Errorf("downs %d, suspects %d; want 1 and 1", downs, suspects)
	}
}
