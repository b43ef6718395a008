package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
)

// Ports of the hand-over subtests, apart from the in-process proxy's
// 7445/7446 and from each other.
const (
	handoverPort       = 17471 // reuse-port hand-over
	handoverHealthPort = 17472
	socketPort         = 17473 // socket activation
	socketHealthPort   = 17474
	staticPort         = 17475 // static pod, in place
	staticHealthPort   = 17476
	// handoverRounds is how many times each subtest replaces the process.
	handoverRounds = 3
)

// lpProcess is one cmd/localproxy process of the hand-over subtests.
type lpProcess struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan error
	done   bool
	err    error
}

// startLP starts bin with args (and the bed's endpoints, CA and name),
// logging JSON to dir/name.log. With passed set, it is started the way
// systemd starts a socket-activated service: the socket as file
// descriptor 3, LISTEN_FDS=1, LISTEN_FDNAMES and LISTEN_PID set to the
// PID of the process itself (the shell sets it to its own PID, $$, and
// execs the binary, which keeps that PID).
func startLP(t *testing.T, bed *testbed.Bed, bin, dir, name string, passed *os.File, args ...string) *lpProcess {
	t.Helper()
	var eps []string
	for _, s := range bed.APIServers() {
		eps = append(eps, s.Addr())
	}
	args = append([]string{
		"--endpoints=" + strings.Join(eps, ","),
		"--ca-file=" + bed.CAFile(),
		"--tls-server-name=" + bed.OriginName(),
		"--enable-discovery=false",
		"--probe=readyz",
		"--shutdown-timeout=3s",
		"--log-format=json",
	}, args...)
	p := &lpProcess{name: name, log: filepath.Join(dir, name+".log"), exited: make(chan error, 1)}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	if passed != nil {
		p.cmd = exec.Command("sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin}, args...)...)
		p.cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=proxy")
		p.cmd.ExtraFiles = []*os.File{passed}
	} else {
		p.cmd = exec.Command(bin, args...)
	}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("%s log:\n%s", name, b)
		}
	})
	return p
}

// stop sends SIGTERM and waits for the exit, killing after 20 s.
func (p *lpProcess) stop() error {
	if p.done {
		return p.err
	}
	p.done = true
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.err = err
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		p.err = errors.New("did not exit within 20s of SIGTERM")
	}
	return p.err
}

// logHas reports whether the process logged a line holding every part.
func (p *lpProcess) logHas(parts ...string) bool {
	b, _ := os.ReadFile(p.log)
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}

// handoverLoad is what runs through the proxy while it is replaced:
// kubectl loops (a new process and new connections each run), a loop of
// fresh TLS connections to the API server through the proxy (each a
// connection attempt that must be neither refused nor reset), and a
// client-go workload: GETs, creates and an informer that must not relist.
type handoverLoad struct {
	t      *testing.T
	stopCh chan struct{}
	wg     sync.WaitGroup
	w      *workload.Workload

	kubectlRuns, kubectlFailed atomic.Int64
	dials, dialFailed, refused atomic.Int64
	slowestDial                atomic.Int64 // nanoseconds, connect and TLS handshake
	mu                         sync.Mutex
	errs                       []string
}

func startHandoverLoad(t *testing.T, ctx context.Context, bed *testbed.Bed, dir string, port int, ns string) *handoverLoad {
	t.Helper()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	kubeconfig := filepath.Join(dir, ns+".kubeconfig")
	if err := bed.WriteKubeconfig(kubeconfig, testbed.LocalProxy, testbed.Admin); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "https://"+proxyAddr) {
		t.Fatalf("kubeconfig %s does not point at %s", kubeconfig, proxyAddr)
	}
	if err := os.WriteFile(kubeconfig, []byte(strings.ReplaceAll(string(b), "https://"+proxyAddr, "https://"+addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &handoverLoad{t: t, stopCh: make(chan struct{})}

	cfg := rest.CopyConfig(bed.RESTConfigAs(testbed.LocalProxy, testbed.Admin))
	cfg.Host = "https://" + addr
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.w, err = workload.Start(ctx, workload.Config{RESTConfig: cfg, HTTPClient: hc, Namespace: ns, RequestTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("workload: %v", err)
	}

	for i := range 2 {
		l.wg.Go(func() { l.kubectlLoop(ctx, bed, kubeconfig, ns, i) })
	}
	pem, err := os.ReadFile(bed.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	l.wg.Go(func() { l.dialLoop(addr, &tls.Config{RootCAs: roots, ServerName: bed.OriginName()}) })
	return l
}

func (l *handoverLoad) failed(format string, args ...any) {
	l.mu.Lock()
	l.errs = append(l.errs, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *handoverLoad) stopped() bool {
	select {
	case <-l.stopCh:
		return true
	default:
		return false
	}
}

// kubectlLoop runs kubectl through the proxy until stopped: get --raw
// /readyz, get namespaces, create configmap, in turn.
func (l *handoverLoad) kubectlLoop(ctx context.Context, bed *testbed.Bed, kubeconfig, ns string, id int) {
	for n := 0; !l.stopped(); n++ {
		var args []string
		switch n % 3 {
		case 0:
			args = []string{"get", "--raw", "/readyz"}
		case 1:
			args = []string{"get", "namespaces", "-o", "name"}
		default:
			args = []string{"create", "configmap", "-n", ns, fmt.Sprintf("kubectl-%d-%d", id, n)}
		}
		l.kubectlRuns.Add(1)
		if _, err := kubectlAt(ctx, bed, kubeconfig, args...); err != nil {
			l.kubectlFailed.Add(1)
			if strings.Contains(err.Error(), "refused") {
				l.refused.Add(1)
			}
			l.failed("%v", err)
		}
	}
}

// dialLoop opens a new connection through the proxy every 10 ms and
// completes a TLS handshake with the API server behind it.
func (l *handoverLoad) dialLoop(addr string, tc *tls.Config) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !l.stopped() {
		l.dials.Add(1)
		d := &net.Dialer{Timeout: 10 * time.Second}
		began := time.Now()
		c, err := tls.DialWithDialer(d, "tcp", addr, tc)
		if took := int64(time.Since(began)); took > l.slowestDial.Load() {
			l.slowestDial.Store(took)
		}
		if err == nil {
			c.Close()
		} else {
			l.dialFailed.Add(1)
			if errors.Is(err, syscall.ECONNREFUSED) {
				l.refused.Add(1)
			}
			l.failed("connection to %s: %v", addr, err)
		}
		select {
		case <-l.stopCh:
		case <-tick.C:
		}
	}
}

// waitRuns waits until n more kubectl runs have finished.
func (l *handoverLoad) waitRuns(t *testing.T, ctx context.Context, n int64) {
	t.Helper()
	want := l.kubectlRuns.Load() + n
	e := &env{t: t, ctx: ctx}
	if err := e.waitFor(fmt.Sprintf("%d kubectl runs", n), observeLimit, func() bool { return l.kubectlRuns.Load() >= want }); err != nil {
		t.Fatal(err)
	}
}

// stop ends the load and checks it: no failed kubectl run, no failed or
// refused connection, no client-go request refused, the informer saw
// every create without relisting.
func (l *handoverLoad) stop(ctx context.Context) {
	t := l.t
	close(l.stopCh)
	l.wg.Wait()
	sctx, cancel := context.WithTimeout(ctx, catchUp)
	defer cancel()
	r := l.w.Stop(sctx)
	t.Logf("kubectl: %d runs, %d failed; connections: %d opened, %d failed, %d refused, slowest connect+handshake %.3fs",
		l.kubectlRuns.Load(), l.kubectlFailed.Load(), l.dials.Load(), l.dialFailed.Load(), l.refused.Load(), time.Duration(l.slowestDial.Load()).Seconds())
	t.Logf("client-go: %d GETs (%d failed), %d creates (%d failed), %d seen, %d lost, %d lists (%d relists), %d resumed watches, %d watch errors",
		len(r.Gets), r.FailedGets(), len(r.Writes), r.FailedWrites(), len(r.Seen), len(r.Lost()), r.Lists, r.Relists(), r.Watches, r.WatchErrors)
	for _, e := range l.errs {
		t.Error(e)
	}
	if n := l.kubectlFailed.Load(); n > 0 {
		t.Errorf("%d of %d kubectl runs failed", n, l.kubectlRuns.Load())
	}
	if n := l.refused.Load(); n > 0 {
		t.Errorf("%d connection attempts refused", n)
	}
	if n := r.Relists(); n > 0 {
		t.Errorf("the informer relisted %d times: its watch should have resumed from its resource version", n)
	}
	if lost := r.Lost(); len(lost) > 0 {
		t.Errorf("the informer never saw %d created ConfigMaps: %v", len(lost), firstN(lost, 10))
	}
	// client-go keeps one HTTP/2 connection for all its requests; the old
	// process closes it when its drain (--shutdown-timeout) ends, and a
	// request in flight at that moment fails (a create is not retried).
	// That is the drain's known cost, not the hand-over's: such failures
	// are logged; a refused connection fails the test.
	for _, q := range append(append([]workload.Request(nil), r.Gets...), r.Writes...) {
		if q.Err == nil {
			continue
		}
		if errors.Is(q.Err, syscall.ECONNREFUSED) || strings.Contains(q.Err.Error(), "refused") {
			t.Errorf("client-go request at %s refused: %v", q.Start.Format("15:04:05.000"), q.Err)
		} else {
			t.Logf("client-go request at %s failed (its connection was cut at the end of the old process's drain): %v", q.Start.Format("15:04:05.000"), q.Err)
		}
	}
	if l.kubectlRuns.Load() == 0 || l.dials.Load() == 0 || len(r.Gets) == 0 {
		t.Error("the load did not run")
	}
}

// waitReady waits for 200 from /readyz on the health port.
func waitReady(t *testing.T, ctx context.Context, healthPort int) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	e := &env{t: t, ctx: ctx}
	if err := e.waitFor("localproxy "+url, observeLimit, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		t.Fatal(err)
	}
}

// testHandoverReusePort replaces a running localproxy binary by a new one
// handoverRounds times the way a DaemonSet surge upgrade does: the new
// process binds the same addresses (SO_REUSEPORT), then the old one gets
// SIGTERM, waits for the new one's /readyz, hands new connections over and
// drains. kubectl, fresh TLS connections and a client-go informer run
// through it all along: no kubectl run fails, no connection is refused,
// the informer does not relist.
func testHandoverReusePort(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	args := []string{"--bind-port=" + strconv.Itoa(handoverPort), "--health-port=" + strconv.Itoa(handoverHealthPort), "--handover-timeout=10s"}
	old := startLP(t, bed, bin, dir, "localproxy-0", nil, args...)
	waitReady(t, ctx, handoverHealthPort)

	load := startHandoverLoad(t, ctx, bed, dir, handoverPort, "handover-reuseport")
	load.waitRuns(t, ctx, 6)
	e := &env{t: t, ctx: ctx}
	for i := 1; i <= handoverRounds; i++ {
		next := startLP(t, bed, bin, dir, fmt.Sprintf("localproxy-%d", i), nil, args...)
		if err := e.waitFor(next.name+" listening", observeLimit, func() bool { return next.logHas(`"proxy listening"`) }); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if err := old.stop(); err != nil {
			t.Errorf("%s after SIGTERM: %v", old.name, err)
		}
		t.Logf("%s replaced by %s: exited %.3fs after SIGTERM", old.name, next.name, time.Since(began).Seconds())
		if !old.logHas(`"successor listening; handing over"`, `"ready":true`) {
			t.Errorf("%s did not log that it handed over to a ready successor", old.name)
		}
		old = next
		load.waitRuns(t, ctx, 6)
	}
	load.stop(ctx)
}

// testHandoverSocketActivation restarts localproxy handoverRounds times
// under socket activation: a launcher (this test) holds the listening
// socket the way systemd's .socket unit does and passes it to each new
// process as file descriptor 3 with LISTEN_FDS/LISTEN_PID; the old
// process is stopped (SIGTERM, exit) before the new one starts, as
// systemctl restart does. Connection attempts in between wait in the
// socket's backlog: no kubectl run fails, none is refused, the informer
// does not relist.
func testHandoverSocketActivation(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(socketPort)))
	if err != nil {
		t.Fatal(err)
	}
	sock, err := ln.(*net.TCPListener).File()
	ln.Close() // sock holds the socket now, as systemd does
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	args := []string{"--bind-port=" + strconv.Itoa(socketPort), "--health-port=" + strconv.Itoa(socketHealthPort)}
	e := &env{t: t, ctx: ctx}
	start := func(i int) *lpProcess {
		p := startLP(t, bed, bin, dir, fmt.Sprintf("localproxy-%d", i), sock, args...)
		if err := e.waitFor(p.name+" listening on the passed socket", observeLimit, func() bool {
			return p.logHas(`"listening on sockets passed by systemd"`) && p.logHas(`"proxy listening"`)
		}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cur := start(0)
	waitReady(t, ctx, socketHealthPort)

	load := startHandoverLoad(t, ctx, bed, dir, socketPort, "handover-socket")
	load.waitRuns(t, ctx, 6)
	for i := 1; i <= handoverRounds; i++ {
		began := time.Now()
		if err := cur.stop(); err != nil {
			t.Errorf("%s after SIGTERM: %v", cur.name, err)
		}
		stopped := time.Now()
		cur = start(i)
		t.Logf("restart %d: old process exited %.3fs after SIGTERM, new one accepting %.3fs later",
			i, stopped.Sub(began).Seconds(), time.Since(stopped).Seconds())
		load.waitRuns(t, ctx, 6)
	}
	load.stop(ctx)
}

// testStaticPodInPlace restarts localproxy the way kubelet applies a
// changed static pod manifest: the old process gets SIGTERM and exits
// before the new one starts, with no socket held in between. With no
// successor the old process does not wait (it logs no hand-over) and
// closes its listener at once; connection attempts from then until the
// new process listens are refused, and only then: the gap is measured,
// not hidden (README: Upgrades, Static pod).
func testStaticPodInPlace(t *testing.T, ctx context.Context, bed *testbed.Bed) {
	healBed(t, ctx, bed)
	dir := t.TempDir()
	bin := buildLocalProxy(t, ctx, dir)
	args := []string{"--bind-port=" + strconv.Itoa(staticPort), "--health-port=" + strconv.Itoa(staticHealthPort)}
	e := &env{t: t, ctx: ctx}
	start := func(i int) *lpProcess {
		p := startLP(t, bed, bin, dir, fmt.Sprintf("localproxy-%d", i), nil, args...)
		if err := e.waitFor(p.name+" listening", observeLimit, func() bool { return p.logHas(`"proxy listening"`) }); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := start(0)
	waitReady(t, ctx, staticHealthPort)

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(staticPort))
	type attempt struct {
		at      time.Time
		refused bool
		err     error
	}
	var (
		mu       sync.Mutex
		attempts []attempt
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			at := time.Now()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err == nil {
				c.Close()
			}
			mu.Lock()
			attempts = append(attempts, attempt{at, errors.Is(err, syscall.ECONNREFUSED), err})
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(attempts) }
	if err := e.waitFor("connection attempts", observeLimit, func() bool { return count() >= 20 }); err != nil {
		t.Fatal(err)
	}
	sigterm := time.Now()
	if err := old.stop(); err != nil {
		t.Errorf("%s after SIGTERM: %v", old.name, err)
	}
	exited := time.Now()
	start(1)
	listening := time.Now()
	n := count()
	if err := e.waitFor("connection attempts through the new process", observeLimit, func() bool { return count() >= n+20 }); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if old.logHas(`"successor listening; handing over"`) {
		t.Errorf("%s handed over with no successor", old.name)
	}
	refused := 0
	var first, last time.Time
	for _, a := range attempts {
		switch {
		case a.refused:
			refused++
			if first.IsZero() {
				first = a.at
			}
			last = a.at
			if a.at.Before(sigterm) || a.at.After(listening) {
				t.Errorf("connection attempt at %s refused outside the restart (SIGTERM %s, new process listening %s)",
					a.at.Format("15:04:05.000"), sigterm.Format("15:04:05.000"), listening.Format("15:04:05.000"))
			}
		case a.err != nil:
			t.Errorf("connection attempt at %s: %v", a.at.Format("15:04:05.000"), a.err)
		}
	}
	if refused == 0 {
		t.Errorf("no connection attempt refused between SIGTERM and the new process: the gap this test measures is gone; update README's Static pod part")
	}
	t.Logf("kill then start: old process exited %.3fs after SIGTERM, new one listening %.3fs later; %d of %d connection attempts refused, from %.3fs to %.3fs after SIGTERM",
		exited.Sub(sigterm).Seconds(), listening.Sub(exited).Seconds(), refused, len(attempts), first.Sub(sigterm).Seconds(), last.Sub(sigterm).Seconds())
}
