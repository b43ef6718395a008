package chaos

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/apifailover/apifailover/localproxy"
)

// Bad input: while the faults run (from badInputFrom to badInputTo of the
// soak), local clients send localproxy what no API client sends, on its
// listen address (the bed's LocalProxy address, an L4 proxy: the bytes go
// on to an apiserver) and on its health address (served by localproxy
// itself):
//
//   - slowloris: slowlorisProxy connections to the listen address held
//     open by sending one byte every slowlorisEvery, half of them the
//     first bytes of a TLS ClientHello (the apiserver waits for the rest,
//     its TLS handshake timeout is 32s), half a completed TLS handshake
//     followed by an HTTP request's header lines (kube-apiserver's
//     ReadHeaderTimeout is 32s); and slowlorisHealth connections to the
//     health address sending a request line a byte at a time. A
//     connection the server closes is opened again after a second or two.
//   - garbage: every garbageEvery, a connection to one of the two
//     addresses in turn that sends up to 64 KiB of random bytes and reads
//     until the server closes it (or 5s);
//   - oversized: every oversizedEvery, in turn: a request with a 1 MiB
//     header to the health server (plain HTTP; it reads 8 KiB of
//     headers), to an apiserver through the proxy (HTTP/1.1 over TLS, no
//     credentials: within kube-apiserver's MaxHeaderBytes of 1 MiB and
//     Go's 4 KiB of slack, so it is answered), the same with a 2 MiB
//     header (beyond it), and 1 MiB of random bytes to the listen
//     address.
//
// Meanwhile a kubelet-like prober asks /readyz every readyzEvery on a new
// connection, throughout the soak, and the proxy's open connections, its
// health server's, and the file descriptors of this process and of the
// localproxy processes are sampled every sampleEvery.
const (
	badInputFrom   = 0.15 // of the soak's duration
	badInputTo     = 0.75
	slowlorisProxy = 200
	// slowlorisHealth is over three times localproxy.HealthMaxConnections
	// (64): beyond the cap each new connection takes the slot of the one
	// longest without a request in progress that the server waits on, so
	// the slowloris clients evict one another and the probes are served.
	// A connection the server has not read yet keeps its slot, so the
	// attack's opening burst of 200 cannot evict a probe accepted just
	// before it, whose request the server had not read: that cut 1 of
	// 480 probes (EOF) in one CI run, and this was 48 until the cap
	// changed. TestHealthServerCapsConnections and
	// TestCapListenerBurstKeepsAConnectionTheServerHasNotRead cover it.
	slowlorisHealth = 200
	slowlorisEvery  = 3 * time.Second
	garbageEvery    = 250 * time.Millisecond
	oversizedEvery  = 2 * time.Second
	oversizedBytes  = 1 << 20
	readyzEvery     = 250 * time.Millisecond
	// readyzLimit is how long a /readyz may take: the bound, a
	// quarter of kubelet's default probe timeout.
	readyzLimit = time.Second
	sampleEvery = 250 * time.Millisecond
	// loadConns bounds the connections the normal load may hold through
	// localproxy at once besides the attack's: one HTTP/2 connection per
	// client configuration most of the time, but when no apiserver
	// answers (the all-down phase) net/http dials once per request
	// waiting for a connection, and localproxy holds each new one for a
	// moment: up to 64 GETs in flight per workload, its writer, 10
	// workers, 2 informers, the manager and kubectl, about 150 through
	// localproxy; 72 were seen at once. An attack connection the proxy
	// kept after the attacker closed it would count here too: the attack
	// opens more than a thousand.
	loadConns = 250
	// releasedSlack is what the load may hold beyond its count before the
	// attack once the attack stopped, outside the all-down phase
	// (kubectl's connection, a failover's redials).
	releasedSlack = 40
	// releaseWithin bounds how long the proxy takes to close what the
	// attack opened once it stopped.
	releaseWithin = 20 * time.Second
)

// BadInputReport is the bad input's figures.
type BadInputReport struct {
	// From and To: the attack, in seconds since the load started.
	From float64 `json:"from_s"`
	To   float64 `json:"to_s"`
	// Slowloris connections opened (each reconnection counts), to the
	// listen address and to the health address, and the most open at
	// once.
	SlowlorisOpened       int64 `json:"slowloris_opened"`
	SlowlorisHealthOpened int64 `json:"slowloris_health_opened"`
	MaxAttackConns        int64 `json:"max_attack_conns"`
	// Garbage and Oversized: connections sent, by how they ended
	// ("closed": the server closed it; "answered": it answered first;
	// "431": a 431 status; "held": still open after 5s; "error: ...").
	Garbage   map[string]int `json:"garbage"`
	Oversized map[string]int `json:"oversized"`
	// Proxy connections (the client connections of the localproxy
	// processes, their sockets on the listen port): the most before the
	// attack, during it, and after it. ProxyConnsExcess is the most it
	// held during the attack beyond the attack's own connections to it
	// open at that moment (their peer is attackSource), against the
	// bound loadConns: what the normal load held, and any attack
	// connection the proxy failed to close when the attacker did (its
	// socket in CLOSE_WAIT).
	ProxyConnsBefore int64 `json:"proxy_conns_before"`
	ProxyConnsMax    int64 `json:"proxy_conns_max"`
	ProxyConnsExcess int64 `json:"proxy_conns_excess"`
	ProxyConnsBound  int64 `json:"proxy_conns_excess_bound"`
	ProxyConnsAfter  int64 `json:"proxy_conns_after"`
	// ProxyRejected: connections localproxy closed without proxying
	// them, by reason (connections_rejected_total; no_endpoint and
	// holdoff come from the faults, the all-down phase above all).
	ProxyRejected map[string]float64 `json:"proxy_rejected"`
	// Health connections (its gauge) and those it closed at once as its
	// cap (HealthMaxConnections) was reached with every slot serving a
	// request.
	HealthConnsMax float64 `json:"health_conns_max"`
	HealthConnsCap int     `json:"health_conns_cap"`
	HealthRejected float64 `json:"health_rejected"`
	// HealthEvicted: connections it closed to make room for a new one
	// (evicted_total): the slowloris clients' above all.
	HealthEvicted float64 `json:"health_evicted"`
	// The descriptors of this process (the clients, the attack) and of
	// the live localproxy processes, summed: all of them, whose peak
	// includes the kernel pipes of splices under way and those the
	// runtime pools (closed when collected), and their TCP sockets
	// (countSockets). SocketsExcess is the most sockets beyond those
	// before the attack and those of the attack at that moment (see
	// finish), against SocketsBound; SocketsExcessAt says when and what
	// they were.
	SocketsBefore   int     `json:"sockets_before"`
	SocketsMax      int     `json:"sockets_max"`
	SocketsExcess   int     `json:"sockets_excess"`
	SocketsExcessAt string  `json:"sockets_excess_at"` // when, and what made it up
	SocketsBound    int     `json:"sockets_excess_bound"`
	FDsBefore       int     `json:"fds_before"`
	FDsMax          int     `json:"fds_max"`
	PipesMax        int     `json:"pipes_max"`
	FDsAfter        int     `json:"fds_after"`
	ReleasedSeconds float64 `json:"released_s"`
	// Readyz: probes (the whole soak), answered 200 and 503 within
	// readyzLimit, not answered within it, and the slowest answer.
	Readyz         int      `json:"readyz"`
	ReadyzOK       int      `json:"readyz_200"`
	Readyz503      int      `json:"readyz_503"`
	ReadyzMissed   int      `json:"readyz_missed"`
	ReadyzSlowest  float64  `json:"readyz_slowest_s"`
	ReadyzMissedAt []string `json:"readyz_missed_at,omitempty"`
}

// badInput is the attack and its monitors.
type badInput struct {
	proxyAddr, healthAddr string
	lp                    *proxyHandle // every localproxy instance binds the same addresses
	began                 time.Time    // the load's start
	from, to              time.Time

	open      atomic.Int64 // attack connections open now
	maxOpen   atomic.Int64
	opened    atomic.Int64
	openedH   atomic.Int64
	mu        sync.Mutex // guards rep's maps and readyz fields
	rep       BadInputReport
	attackers sync.WaitGroup
	monitors  sync.WaitGroup
	stopMon   context.CancelFunc
	proberErr error         // guarded by mu
	attackEnd chan struct{} // closed when the attackers are done
}

// startBadInput starts the monitors at once and the attack at from (both
// relative to began), until to.
func startBadInput(ctx context.Context, lp *proxyHandle, proxyAddr string, began time.Time, d time.Duration, proberBin, out string) *badInput {
	b := &badInput{proxyAddr: proxyAddr, healthAddr: lp.health, lp: lp, began: began,
		from: began.Add(time.Duration(float64(d) * badInputFrom)), to: began.Add(time.Duration(float64(d) * badInputTo)),
		attackEnd: make(chan struct{})}
	b.rep = BadInputReport{Garbage: map[string]int{}, Oversized: map[string]int{}, HealthConnsCap: localproxy.HealthMaxConnections,
		From: b.from.Sub(began).Seconds(), To: b.to.Sub(began).Seconds()}
	mctx, cancel := context.WithCancel(ctx)
	b.stopMon = cancel
	if err := b.startProber(mctx, proberBin, out); err != nil {
		b.proberErr = err
	}
	b.monitors.Go(func() { b.sample(mctx) })
	actx, acancel := context.WithDeadline(ctx, b.to)
	go func() {
		defer close(b.attackEnd)
		defer acancel()
		if !sleepUntil(actx, b.from) {
			return
		}
		for i := range slowlorisProxy {
			b.attackers.Go(func() { b.slowloris(actx, i%2 == 1) })
		}
		for range slowlorisHealth {
			b.attackers.Go(func() { b.slowlorisHealth(actx) })
		}
		b.attackers.Go(func() { b.garbage(actx) })
		b.attackers.Go(func() { b.oversized(actx) })
		b.attackers.Wait()
	}()
	return b
}

// sleepUntil waits until t or ctx's end; false if ctx ended.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// jittered returns d times a random factor in [1, 1.5).
func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/2+1))
}

// attackSource is the address every attack connection comes from, so
// that its sockets are told apart from the load's (which come from
// 127.0.0.1) in /proc/net/tcp, whatever the scheduling of the attack's
// goroutines.
const attackSource = "127.0.0.2"

// socketCount is what a moment's TCP sockets of this process and of the
// localproxy instances hold: a snapshot of /proc/net/tcp, then each
// process's descriptors, and only the sockets found in both (one opened
// or closed between the two reads counts nowhere).
type socketCount struct {
	// all: every such socket; byInstance: the localproxy instances'
	// (the serving one first).
	all        int
	byInstance []int
	// attacker: this process's sockets from attackSource;
	// proxyAccepted and healthAccepted: those the localproxy instances
	// accepted from it on their listen and health ports, established (a
	// socket in CLOSE_WAIT, whose attacker closed it, is not the
	// attack's any more); conns: every client connection they hold.
	attacker                      int
	proxyAccepted, healthAccepted int64
	conns                         int64
	// kinds says what the sockets are, by process (see kind).
	kinds func() string
}

// countSockets counts the sockets of this process and of the localproxy
// instances pids now.
func (b *badInput) countSockets(pids []int) socketCount {
	tab := readTCPTable()
	from := procIP(attackSource)
	self := tab.sockets(os.Getpid())
	c := socketCount{all: len(self), byInstance: make([]int, len(pids))}
	byPid := [][]tcpSocket{self}
	for _, s := range self {
		if s.localIP == from {
			c.attacker++
		}
	}
	for i, pid := range pids {
		socks := tab.sockets(pid)
		byPid = append(byPid, socks)
		c.all += len(socks)
		c.byInstance[i] = len(socks)
		for _, s := range socks {
			switch {
			case s.localPort == b.lp.port && s.remoteIP == from && s.state == "01":
				c.proxyAccepted++
			case s.localPort == b.lp.port+1 && s.remoteIP == from && s.state == "01":
				c.healthAccepted++
			}
			if b.lp.isClient(s) {
				c.conns++
			}
		}
	}
	c.kinds = func() string {
		var parts []string
		for i, socks := range byPid {
			kinds := map[string]int{}
			for _, s := range socks {
				kinds[b.kind(s, from)]++
			}
			who := "this process"
			if i > 0 {
				who = fmt.Sprintf("localproxy pid %d", pids[i-1])
			}
			parts = append(parts, fmt.Sprintf("%s: %v", who, kinds))
		}
		return strings.Join(parts, "; ")
	}
	return c
}

// kind says what a socket is: listening, or its ports and state, and
// whether the attack's.
func (b *badInput) kind(s tcpSocket, attack string) string {
	name := func(port int) string {
		switch port {
		case b.lp.port:
			return "the listen port"
		case b.lp.port + 1:
			return "the health port"
		}
		return fmt.Sprintf("port %d", port)
	}
	var k string
	switch {
	case s.state == "0A":
		return "listening"
	case s.localPort == b.lp.port || s.localPort == b.lp.port+1:
		k = "accepted on " + name(s.localPort)
	default:
		k = "to " + name(s.remotePort)
	}
	if s.localIP == attack || s.remoteIP == attack {
		k = "attack " + k
	}
	return k + ", state " + s.state
}

// dial opens an attack connection from attackSource, counted while open.
func (b *badInput) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(attackSource)}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	n := b.open.Add(1)
	for {
		m := b.maxOpen.Load()
		if n <= m || b.maxOpen.CompareAndSwap(m, n) {
			break
		}
	}
	return &countedConn{Conn: c, b: b}, nil
}

type countedConn struct {
	net.Conn
	b    *badInput
	once sync.Once
}

// Close closes the connection and stops counting it.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.b.open.Add(-1) })
	return err
}

// clientHello is the start of a TLS ClientHello: a handshake record of
// 512 bytes, of which the slowloris sends one byte at a time.
var clientHello = append([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}, make([]byte, 501)...)

// slowloris holds one connection to the listen address open, one byte
// every slowlorisEvery, and opens it again when the server closes it.
func (b *badInput) slowloris(ctx context.Context, useTLS bool) {
	for ctx.Err() == nil {
		c, err := b.dial(ctx, b.proxyAddr)
		if err == nil {
			b.opened.Add(1)
			var payload []byte
			if useTLS {
				tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) // an attacker does not verify
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = tc.HandshakeContext(hctx)
				cancel()
				c = tc
				payload = []byte("GET /api HTTP/1.1\r\nHost: kubernetes\r\nX-Slow: " + strings.Repeat("a", 4096))
			} else {
				payload = clientHello
			}
			if err == nil {
				trickle(ctx, c, payload)
			}
			c.Close()
		}
		if !sleepUntil(ctx, time.Now().Add(jittered(time.Second))) {
			return
		}
	}
}

// trickle sends payload one byte every slowlorisEvery until the server
// answers or closes, or ctx ends.
func trickle(ctx context.Context, c net.Conn, payload []byte) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 512)
	for i := 0; ctx.Err() == nil; i++ {
		if _, err := c.Write(payload[i%len(payload) : i%len(payload)+1]); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(jittered(slowlorisEvery)))
		if _, err := c.Read(buf); !isTimeout(err) {
			return // answered or closed
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// slowlorisHealth holds one connection to the health address, sending a
// request line a byte at a time.
func (b *badInput) slowlorisHealth(ctx context.Context) {
	for ctx.Err() == nil {
		c, err := b.dial(ctx, b.healthAddr)
		if err == nil {
			b.openedH.Add(1)
			trickle(ctx, c, []byte("GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
			c.Close()
		}
		if !sleepUntil(ctx, time.Now().Add(jittered(time.Second))) {
			return
		}
	}
}

// garbage sends random bytes, to each address in turn.
func (b *badInput) garbage(ctx context.Context) {
	t := time.NewTicker(garbageEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		addr, what := b.proxyAddr, "proxy"
		if i%2 == 1 {
			addr, what = b.healthAddr, "health"
		}
		junk := make([]byte, 1+rand.IntN(64<<10))
		for j := range junk {
			junk[j] = byte(rand.Uint32())
		}
		b.note(b.rep.Garbage, what+" "+b.send(ctx, addr, junk, false))
	}
}

// oversized sends a request with a 1 MiB header or 1 MiB of random bytes,
// in turn: to the health server, to an apiserver through the proxy over
// TLS, to the listen address in the clear.
func (b *badInput) oversized(ctx context.Context) {
	t := time.NewTicker(oversizedEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		header := "X-Big: " + strings.Repeat("x", oversizedBytes) + "\r\n"
		switch i % 4 {
		case 0:
			b.note(b.rep.Oversized, "health "+b.send(ctx, b.healthAddr, []byte("GET /readyz HTTP/1.1\r\nHost: localhost\r\n"+header+"\r\n"), false))
		case 1:
			b.note(b.rep.Oversized, "proxy-tls "+b.send(ctx, b.proxyAddr, []byte("GET /api HTTP/1.1\r\nHost: kubernetes\r\n"+header+"\r\n"), true))
		case 2:
			// Twice kube-apiserver's MaxHeaderBytes (1 MiB).
			b.note(b.rep.Oversized, "proxy-tls-2MiB "+b.send(ctx, b.proxyAddr, []byte("GET /api HTTP/1.1\r\nHost: kubernetes\r\n"+header+header+"\r\n"), true))
		default:
			junk := make([]byte, oversizedBytes)
			for j := range junk {
				junk[j] = byte(rand.Uint32())
			}
			b.note(b.rep.Oversized, "proxy "+b.send(ctx, b.proxyAddr, junk, false))
		}
	}
}

// send writes data on a new connection (over TLS if useTLS) and reads
// the answer until the server closes it or 5s passed; it says how it
// ended.
func (b *badInput) send(ctx context.Context, addr string, data []byte, useTLS bool) string {
	raw, err := b.dial(ctx, addr)
	if err != nil {
		return "dial error"
	}
	defer raw.Close()
	c := raw
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	if useTLS {
		tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) // an attacker does not verify
		if err := tc.HandshakeContext(ctx); err != nil {
			return "tls error"
		}
		c = tc
	}
	werr := make(chan error, 1)
	go func() { _, err := c.Write(data); werr <- err }()
	br := bufio.NewReader(c)
	var status string
	if line, err := br.ReadString('\n'); err == nil && strings.HasPrefix(line, "HTTP/1.") {
		if f := strings.Fields(line); len(f) > 1 {
			status = f[1]
		}
	}
	n, rerr := io.Copy(io.Discard, br)
	raw.Close() // ends the write, if it is still blocked
	<-werr
	switch {
	case status != "":
		return status
	case isTimeout(rerr):
		return "held"
	case n > 0:
		return "answered"
	}
	return "closed"
}

func (b *badInput) note(m map[string]int, k string) {
	b.mu.Lock()
	m[k]++
	b.mu.Unlock()
}

// startProber runs the prober (cmd hack/chaos/prober, a process of its
// own as kubelet is) against /readyz until ctx ends: a new connection
// every readyzEvery, readyzLimit to answer. Its results come back as
// lines on its standard output, its log is _output/chaos/prober.log.
func (b *badInput) startProber(ctx context.Context, bin, out string) error {
	f, err := os.Create(filepath.Join(out, "prober.log"))
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, "-url=http://"+b.healthAddr+"/readyz", "-every="+readyzEvery.String(), "-timeout="+readyzLimit.String())
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // not outliving the soak
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdout = &lineWriter{w: f, line: b.onProbe}
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("the /readyz prober: %w", err)
	}
	b.monitors.Go(func() {
		defer f.Close()
		if err := cmd.Wait(); err != nil && ctx.Err() == nil {
			b.mu.Lock()
			b.proberErr = fmt.Errorf("the /readyz prober exited: %w", err)
			b.mu.Unlock()
		}
	})
	return nil
}

// probeResult is a line of the prober's output.
type probeResult struct {
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`
	Status  int       `json:"status"`
	Error   string    `json:"error"`
}

// onProbe counts one probe of the prober.
func (b *badInput) onProbe(line []byte) {
	var r probeResult
	if err := json.Unmarshal(line, &r); err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rep.Readyz++
	switch {
	case r.Error != "":
		b.rep.ReadyzMissed++
		if len(b.rep.ReadyzMissedAt) < 20 {
			b.rep.ReadyzMissedAt = append(b.rep.ReadyzMissedAt, fmt.Sprintf("%.1fs: %s", r.Start.Sub(b.began).Seconds(), r.Error))
		}
	case r.Status == http.StatusOK:
		b.rep.ReadyzOK++
	case r.Status == http.StatusServiceUnavailable:
		b.rep.Readyz503++
	default:
		b.rep.ReadyzMissed++
	}
	if r.Error == "" {
		b.rep.ReadyzSlowest = max(b.rep.ReadyzSlowest, r.Seconds)
	}
}

// sample records the proxy's and the health server's open connections
// and the descriptors of this process and localproxy's: their peak
// before the attack and during it.
func (b *badInput) sample(ctx context.Context) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		pids := b.lp.pids()
		a := b.countSockets(pids)
		sockets := a.all
		fds, _, pipes := countFDKinds(append(pids, os.Getpid())...)
		// Either instance may answer during a hand-over: each has its
		// own cap.
		mfs, _ := b.lp.metrics(ctx)
		health := metricSum(mfs, "apifailover_localproxy_health_connections_active", "")[""]
		b.mu.Lock()
		switch {
		case now.Before(b.from):
			b.rep.ProxyConnsBefore = max(b.rep.ProxyConnsBefore, a.conns)
			b.rep.FDsBefore = max(b.rep.FDsBefore, fds)
			b.rep.SocketsBefore = max(b.rep.SocketsBefore, sockets)
		case now.Before(b.to.Add(time.Second)):
			b.rep.ProxyConnsMax = max(b.rep.ProxyConnsMax, a.conns)
			b.rep.ProxyConnsExcess = max(b.rep.ProxyConnsExcess, a.conns-a.proxyAccepted)
			b.rep.FDsMax = max(b.rep.FDsMax, fds)
			b.rep.SocketsMax = max(b.rep.SocketsMax, sockets)
			// The attack's sockets: the attacker's, those localproxy
			// accepted from it, and one upstream socket for each of
			// those on the listen address.
			if excess := sockets - b.rep.SocketsBefore - a.attacker - 2*int(a.proxyAccepted) - int(a.healthAccepted); excess > b.rep.SocketsExcess {
				b.rep.SocketsExcess = excess
				b.rep.SocketsExcessAt = fmt.Sprintf("%.1fs: %d sockets, %d of them localproxy's (by instance, the serving one first: %v), %d before the attack; the attack's: %d of the attacker, %d accepted on the listen address, %d on the health address; localproxy's client connections %d; %s",
					now.Sub(b.began).Seconds(), sockets, sum(a.byInstance), a.byInstance, b.rep.SocketsBefore, a.attacker, a.proxyAccepted, a.healthAccepted, a.conns, a.kinds())
			}
			b.rep.PipesMax = max(b.rep.PipesMax, pipes)
			b.rep.HealthConnsMax = max(b.rep.HealthConnsMax, health)
		}
		b.mu.Unlock()
	}
}

// metricSum sums the samples of the metric name in mfs by the value of
// label (all under "" if label is "").
func metricSum(mfs map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	out := map[string]float64{}
	if mf := mfs[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			k := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					k = lp.GetValue()
				}
			}
			switch {
			case m.Gauge != nil:
				out[k] += m.GetGauge().GetValue()
			case m.Counter != nil:
				out[k] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// finish waits for the attack to end, checks that what it opened is
// released, stops the monitors and returns the report and the violated
// invariants.
func (b *badInput) finish(ctx context.Context) (BadInputReport, []string) {
	<-b.attackEnd
	ended := time.Now()
	// What the attack opened is closed: the proxy's connections come
	// back to what the load held before it.
	b.mu.Lock()
	before := b.rep.ProxyConnsBefore
	b.mu.Unlock()
	var after int64
	for {
		after = b.lp.clientConns()
		if after <= before+releasedSlack || time.Since(ended) > releaseWithin || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.stopMon()
	b.monitors.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.rep
	r.Garbage, r.Oversized = maps.Clone(b.rep.Garbage), maps.Clone(b.rep.Oversized)
	r.ReleasedSeconds = time.Since(ended).Seconds()
	r.ProxyConnsAfter, r.FDsAfter = after, countFDs()
	r.SlowlorisOpened, r.SlowlorisHealthOpened, r.MaxAttackConns = b.opened.Load(), b.openedH.Load(), b.maxOpen.Load()
	// The serving instance's counters (those of instances replaced by a
	// hand-over are gone with them).
	var mfs map[string]*dto.MetricFamily
	_ = waitFor(ctx, 10*time.Second, func() bool {
		var err error
		mfs, err = b.lp.metrics(ctx)
		return err == nil
	})
	r.ProxyRejected = metricSum(mfs, "apifailover_localproxy_connections_rejected_total", "reason")
	r.HealthRejected = metricSum(mfs, "apifailover_localproxy_health_connections_rejected_total", "")[""]
	r.HealthEvicted = metricSum(mfs, "apifailover_localproxy_health_connections_evicted_total", "")[""]
	// Bounds: beyond the attack's connections open at the moment, the
	// proxy holds at most the load's (loadConns); the sockets (this
	// process's and localproxy's) grow by three per attack connection to the listen address and two
	// per health connection, and by at most three per load connection
	// (the client's, the proxy's two) or one (transport.Wrap's). Pipes
	// are not bounded here: a splice takes one from the runtime's pool
	// for as long as it moves bytes, and the pool keeps them until a
	// collection (the race detector's pool drops a share of what is put
	// back, to be closed by finalizers); the leak check at the end counts
	// every descriptor.
	r.ProxyConnsBound = loadConns
	r.SocketsBound = 3 * loadConns
	var v []string
	if b.proberErr != nil {
		v = append(v, "bad input: "+b.proberErr.Error())
	}
	if r.ProxyConnsExcess > r.ProxyConnsBound {
		v = append(v, fmt.Sprintf("bad input: localproxy held %d connections beyond the attack's during it, above the bound %d", r.ProxyConnsExcess, r.ProxyConnsBound))
	}
	if r.SocketsExcess > r.SocketsBound {
		v = append(v, fmt.Sprintf("bad input: %d sockets beyond the attack's and those before it, above the bound %d", r.SocketsExcess, r.SocketsBound))
	}
	if r.HealthConnsMax > float64(r.HealthConnsCap) {
		v = append(v, fmt.Sprintf("bad input: the health server held %.0f connections, above its cap %d", r.HealthConnsMax, r.HealthConnsCap))
	}
	if r.ProxyConnsAfter > r.ProxyConnsBefore+releasedSlack {
		v = append(v, fmt.Sprintf("bad input: localproxy still held %d connections %.0fs after the attack (%d before it)", r.ProxyConnsAfter, r.ReleasedSeconds, r.ProxyConnsBefore))
	}
	if r.ReadyzMissed > 0 {
		v = append(v, fmt.Sprintf("bad input: %d of %d /readyz probes not answered within %s (first: %v)", r.ReadyzMissed, r.Readyz, readyzLimit, r.ReadyzMissedAt))
	}
	if r.MaxAttackConns == 0 {
		v = append(v, "bad input: the attack opened no connection")
	}
	return r, v
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}
