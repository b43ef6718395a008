package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/apifailover/apifailover/hack/peers"
	"github.com/apifailover/apifailover/localproxy"
)

// The data-path measurement: what the L4 contenders cost to carry bytes
// and to hold connections. Each contender runs a fresh instance, side by
// side with the others, in front of its own listener of the sink (see
// sink.go), configured as in front of the apiservers (the same flags and
// kubespray configuration, the sink as the only server); direct talks to
// the sink itself.

// datapathPaths are the contenders of the data-path measurement, in report
// order; direct is the throughput's limit.
var datapathPaths = []string{pathDirect, pathLocalProxy, pathHAProxy, pathNginx}

// Directions of the throughput rows.
const (
	dirUpload   = "upload"
	dirDownload = "download"
)

const (
	// idleSettle is how long the contenders rest before their memory is
	// read.
	idleSettle = 2 * time.Second
	// idleDialers open the idle connections in parallel.
	idleDialers = 32
	// sinkBasePort is the sink's first port; each contender has its own.
	sinkBasePort = 7450
	// idleMaxFailures ends the opening of idle connections through a
	// contender that refuses them.
	idleMaxFailures = 50
)

// datapathConfig sizes the measurement.
type datapathConfig struct {
	// MiB is the volume per direction and contender, split over Rounds.
	MiB    int `json:"mib_per_direction"`
	Rounds int `json:"rounds"`
	// IdleConns are the counts of idle connections held, ascending.
	IdleConns []int `json:"idle_conns"`
	// Requested are the counts asked for when they did not fit under
	// NofileLimit.
	Requested []int `json:"requested_idle_conns,omitempty"`
	// NofileLimit is the file descriptor limit of the proxies.
	NofileLimit uint64 `json:"nofile_limit"`
	// HAProxyMaxconn replaces kubespray's HAProxy connection limits
	// (4000, 1000 per server) in the data-path instance.
	HAProxyMaxconn int `json:"haproxy_maxconn"`
	// LocalProxyMaxConns is localproxy's --max-connections where the
	// default (10000) is too low, else 0.
	LocalProxyMaxConns int `json:"localproxy_max_connections,omitempty"`
	// ShortConns is the count of short connections per contender, split
	// over Rounds (0: none).
	ShortConns int `json:"short_conns"`
	// Link is the rate of the link the throughput is measured across
	// again (-datapath-link, tc's notation; "": not measured), LinkBits
	// the same in bits per second.
	Link     string `json:"link,omitempty"`
	LinkBits uint64 `json:"link_bits_per_s,omitempty"`
	// LinkCC is the TCP congestion control the link's measurement runs
	// with (-datapath-link-cc; "": the machine's).
	LinkCC string `json:"link_congestion_control,omitempty"`
	// LocalProxyLoopbackCC is localproxy's --loopback-congestion-control,
	// which the bench passes (localproxyArgs): its client sockets on
	// loopback use it; every other socket the namespace's default.
	LocalProxyLoopbackCC string `json:"localproxy_loopback_congestion_control,omitempty"`
}

// shortBytes is what the sink sends on a short connection.
const shortBytes = 2 << 10

// DatapathThroughputRow is one direction through one contender.
type DatapathThroughputRow struct {
	Direction string  `json:"direction"`
	Path      string  `json:"path"`
	MiB       float64 `json:"mib"`
	MiBPerSec float64 `json:"mib_per_s"`
	// ProxyCPUPerGiB is the CPU time of the proxy's processes per GiB
	// carried; 0 for direct.
	ProxyCPUPerGiB float64 `json:"proxy_cpu_s_per_gib,omitempty"`
	// MachineCPUPerGiB is the whole machine's busy CPU time (/proc/stat:
	// every process, the kernel's TCP work for both connections, the
	// sink and the client) per GiB carried; MachineBusy the share of all
	// cores it kept busy while the bytes moved.
	MachineCPUPerGiB float64 `json:"machine_cpu_s_per_gib"`
	MachineBusy      float64 `json:"machine_busy"`
	// Ratios against HAProxy and direct in the same run (0: unknown).
	VsHAProxy    float64 `json:"mib_per_s_vs_haproxy"`
	VsDirect     float64 `json:"mib_per_s_vs_direct"`
	CPUVsHAProxy float64 `json:"cpu_vs_haproxy"`
	// CPUBoundVsDirect is direct's machine CPU per GiB over this
	// path's: where the direct path keeps every core busy (MachineBusy
	// near 1), the most of direct's throughput this path can reach on
	// this machine, however little the proxy itself spends: the bytes
	// cross the kernel's TCP stack twice.
	CPUBoundVsDirect float64 `json:"cpu_bound_vs_direct"`
	Error            string  `json:"error,omitempty"`
}

// DatapathShortRow is Conns short connections through one contender,
// one at a time: the sink's request, its answer and shortBytes, its
// close.
type DatapathShortRow struct {
	Path  string `json:"path"`
	Conns int    `json:"conns"`
	// WallUS is a connection's mean time from the dial to the sink's
	// close, in µs.
	WallUS float64 `json:"wall_us"`
	// ProxyCPUUS is the CPU time of the proxy's processes per
	// connection, in µs; 0 for direct.
	ProxyCPUUS float64 `json:"proxy_cpu_us,omitempty"`
	// MachineCPUUS is the whole machine's busy CPU time per connection
	// (the client's, the sink's and the kernel's work included), in µs.
	MachineCPUUS float64 `json:"machine_cpu_us"`
	// Ratios against HAProxy's and direct's rows (0: unknown).
	CPUVsHAProxy     float64 `json:"proxy_cpu_vs_haproxy"`
	MachineVsDirect  float64 `json:"machine_cpu_vs_direct"`
	MachineVsHAProxy float64 `json:"machine_cpu_vs_haproxy"`
}

// DatapathIdleRow is one contender holding Conns idle connections (0: at
// rest).
type DatapathIdleRow struct {
	Path  string `json:"path"`
	Conns int    `json:"conns"`
	// Held counts the connections that reached the sink and were still
	// open when the memory was read.
	Held      int   `json:"held"`
	Processes int   `json:"processes"`
	RSSKiB    int64 `json:"rss_kib"`
	FDs       int   `json:"fds"`
	// Per held connection, above the contender at rest.
	KiBPerConn float64 `json:"rss_kib_per_conn,omitempty"`
	FDsPerConn float64 `json:"fds_per_conn,omitempty"`
	// KiBVsHAProxy is KiBPerConn against HAProxy's at the same count.
	KiBVsHAProxy float64 `json:"rss_per_conn_vs_haproxy"`
	// Note says when fewer than Conns were held.
	Note  string `json:"note,omitempty"`
	Error string `json:"error,omitempty"`
}

// DatapathResults is the measurement in results.json.
type DatapathResults struct {
	Config     datapathConfig          `json:"config"`
	Throughput []DatapathThroughputRow `json:"throughput"`
	Short      []DatapathShortRow      `json:"short_connections,omitempty"`
	Idle       []DatapathIdleRow       `json:"idle"`
	// Link is the throughput across a shaped link (link.go); nil: not
	// measured.
	Link  *DatapathLinkResults `json:"link,omitempty"`
	Error string               `json:"error,omitempty"`
}

// DatapathLinkResults is the throughput measured across a link.
type DatapathLinkResults struct {
	// Rate is the link's rate each way, in tc's notation.
	Rate       string                  `json:"rate"`
	TCP        LinkTCP                 `json:"tcp"`
	Throughput []DatapathThroughputRow `json:"throughput"`
	Error      string                  `json:"error,omitempty"`
}

// dpContender is one contender in front of its sink listener.
type dpContender struct {
	name string
	addr string // where clients connect
	// pids are the proxy's processes; nil for direct.
	pids func() []int
	stop func()
}

// startDatapathContender starts contender name in front of the sink at
// sinkAddr, configured as in front of the apiservers, with room for
// cfg's idle connections.
func startDatapathContender(ctx context.Context, e *env, name, dir, sinkAddr string, cfg datapathConfig) (*dpContender, error) {
	if name == pathDirect {
		return &dpContender{name: name, addr: sinkAddr, stop: func() {}}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var p *proc
	var err error
	c := &dpContender{name: name}
	settled := func() bool { return true }
	switch name {
	case pathLocalProxy:
		c.addr = "127.0.0.1:" + strconv.Itoa(localproxyListenPort)
		args := localproxyArgs([]string{sinkAddr}, e.bed.CAFile(), e.bed.OriginName(), "")
		if cfg.LocalProxyMaxConns > 0 {
			args = append(args, "--max-connections="+strconv.Itoa(cfg.LocalProxyMaxConns))
		}
		p, err = startProc(ctx, "localproxy", filepath.Join(dir, "localproxy.log"), c.addr, e.localproxyBin, args...)
		settled = func() bool {
			st, err := localproxyStatus()
			return err == nil && len(st.Upstreams) == 1 && st.Upstreams[0].State == "healthy"
		}
	case pathHAProxy:
		c.addr = haproxyListen
		var sock string
		p, sock, err = startHAProxy(ctx, dir, []string{"sink"}, []string{sinkAddr}, cfg.HAProxyMaxconn)
		settled = func() bool {
			st, err := haproxyServerStates(sock)
			return err == nil && st["sink"] == "UP"
		}
	case pathNginx:
		c.addr = nginxListen
		p, err = startNginx(ctx, dir, []string{sinkAddr}, "")
	default:
		return nil, fmt.Errorf("%s is not an L4 contender", name)
	}
	if err != nil {
		return nil, err
	}
	c.stop = p.stop
	c.pids = func() []int { return []int{p.pid()} }
	if name == pathNginx {
		c.pids = nginxTree(p)
	}
	reaches := func() bool {
		conn, err := sinkDial(c.addr, sinkIdle, 0, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}
	if !waitUntil(ctx, settleLimit, func() bool { return settled() && reaches() }) {
		p.stop()
		return nil, fmt.Errorf("%s did not count the sink healthy and reach it within %s", name, settleLimit)
	}
	return c, nil
}

// procMem sums VmRSS (KiB) and open file descriptors over pids.
func procMem(pids []int) (rssKiB int64, fds int, err error) {
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			return 0, 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("VmRSS of %d: %w", pid, err)
				}
				rssKiB += n
			}
		}
		ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		if err != nil {
			return 0, 0, err
		}
		fds += len(ents)
	}
	return rssKiB, fds, nil
}

// nofileLimit raises this process's file descriptor limit (soft and
// hard) to n, as far as it may: the processes it starts afterwards inherit
// it. It returns the limit it got.
func nofileLimit(n uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	want := r
	want.Max = max(r.Max, n)
	want.Cur = want.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return want.Cur, nil
	}
	// No privilege to raise the hard limit (a container): up to it.
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	return r.Cur, nil
}

// fdSpare is what a proxy needs besides two file descriptors per
// connection (listeners, health checks, logs, epoll, HAProxy's own
// margin).
const fdSpare = 300

// fitIdleConns caps every count of idle connections at what a
// single-process proxy can hold with limit file descriptors (two per
// connection), in hundreds.
func fitIdleConns(counts []int, limit uint64) (fit []int, most int) {
	most = (int(limit) - fdSpare) / 2 / 100 * 100
	for _, n := range counts {
		fit = append(fit, min(n, most))
	}
	return slices.Compact(fit), most
}

// dpSample is the throughput of one direction through one contender.
type dpSample struct {
	bytes   int64
	wall    time.Duration
	cpu     time.Duration
	machine time.Duration
}

// measureThroughput moves cfg.MiB each way through every contender, in
// rounds that rotate the contenders' order.
func measureThroughput(ctx context.Context, cs []*dpContender, cfg datapathConfig, say func(string, ...any)) ([]DatapathThroughputRow, error) {
	buf := make([]byte, sinkBuffer)
	dirs := []string{dirUpload, dirDownload}
	acc := make(map[string]map[string]*dpSample)
	for _, d := range dirs {
		acc[d] = make(map[string]*dpSample)
		for _, c := range cs {
			acc[d][c.name] = &dpSample{}
		}
	}
	per := int64(cfg.MiB) << 20 / int64(cfg.Rounds)
	// Warm up: nothing recorded.
	for _, c := range cs {
		if _, err := transfer(c.addr, sinkDiscard, 8<<20, buf); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	for round := range cfg.Rounds {
		began := time.Now()
		for i := range cs {
			c := cs[(i+round)%len(cs)]
			for _, d := range dirs {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				var cpu0 time.Duration
				if c.pids != nil {
					cpu0 = cpuTime(c.pids())
				}
				mode := byte(sinkDiscard)
				if d == dirDownload {
					mode = sinkSource
				}
				busy0 := machineBusy()
				wall, err := transfer(c.addr, mode, per, buf)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", c.name, d, err)
				}
				s := acc[d][c.name]
				s.bytes += per
				s.wall += wall
				s.machine += machineBusy() - busy0
				if c.pids != nil {
					s.cpu += cpuTime(c.pids()) - cpu0
				}
			}
		}
		say("  throughput round %d/%d done in %s", round+1, cfg.Rounds, time.Since(began).Round(time.Millisecond))
	}
	var rows []DatapathThroughputRow
	for _, d := range dirs {
		for _, c := range cs {
			s := acc[d][c.name]
			mib := float64(s.bytes) / (1 << 20)
			r := DatapathThroughputRow{Direction: d, Path: c.name, MiB: mib, MiBPerSec: round(mib/s.wall.Seconds(), 1),
				MachineCPUPerGiB: round(s.machine.Seconds()/(mib/1024), 3),
				MachineBusy:      round(s.machine.Seconds()/(s.wall.Seconds()*float64(runtime.NumCPU())), 2)}
			if c.pids != nil {
				r.ProxyCPUPerGiB = round(s.cpu.Seconds()/(mib/1024), 3)
			}
			rows = append(rows, r)
		}
	}
	fillDatapathRatios(rows)
	return rows, nil
}

// measureShortConns opens cfg.ShortConns short connections through
// every contender, one at a time, in rounds that rotate the contenders'
// order: what a connection's setup and teardown cost, with little to
// copy.
func measureShortConns(ctx context.Context, cs []*dpContender, cfg datapathConfig, say func(string, ...any)) ([]DatapathShortRow, error) {
	buf := make([]byte, sinkBuffer)
	one := func(addr string) error {
		_, err := transfer(addr, sinkSource, shortBytes, buf)
		return err
	}
	acc := make(map[string]*dpSample)
	for _, c := range cs {
		acc[c.name] = &dpSample{}
		for range 100 { // warm up: nothing recorded
			if err := one(c.addr); err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	per := cfg.ShortConns / cfg.Rounds
	for round := range cfg.Rounds {
		began := time.Now()
		for i := range cs {
			c := cs[(i+round)%len(cs)]
			var cpu0 time.Duration
			if c.pids != nil {
				cpu0 = cpuTime(c.pids())
			}
			busy0 := machineBusy()
			t0 := time.Now()
			for range per {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if err := one(c.addr); err != nil {
					return nil, fmt.Errorf("%s: %w", c.name, err)
				}
			}
			s := acc[c.name]
			s.wall += time.Since(t0)
			s.machine += machineBusy() - busy0
			s.bytes += int64(per) // connections
			if c.pids != nil {
				s.cpu += cpuTime(c.pids()) - cpu0
			}
		}
		say("  short connections round %d/%d done in %s", round+1, cfg.Rounds, time.Since(began).Round(time.Millisecond))
	}
	us := func(d time.Duration, n int64) float64 { return round(float64(d.Microseconds())/float64(n), 1) }
	var rows []DatapathShortRow
	for _, c := range cs {
		s := acc[c.name]
		r := DatapathShortRow{Path: c.name, Conns: int(s.bytes), WallUS: us(s.wall, s.bytes), MachineCPUUS: us(s.machine, s.bytes)}
		if c.pids != nil {
			r.ProxyCPUUS = us(s.cpu, s.bytes)
		}
		rows = append(rows, r)
	}
	fillShortRatios(rows)
	return rows, nil
}

// fillShortRatios sets the short-connection rows' ratios against
// HAProxy's and direct's rows.
func fillShortRatios(rows []DatapathShortRow) {
	for i, r := range rows {
		for _, b := range rows {
			switch b.Path {
			case pathHAProxy:
				rows[i].CPUVsHAProxy = ratio(r.ProxyCPUUS, b.ProxyCPUUS)
				rows[i].MachineVsHAProxy = ratio(r.MachineCPUUS, b.MachineCPUUS)
			case pathDirect:
				rows[i].MachineVsDirect = ratio(r.MachineCPUUS, b.MachineCPUUS)
			}
		}
	}
}

// fillDatapathRatios sets the throughput rows' ratios against HAProxy's
// and direct's rows of the same direction.
func fillDatapathRatios(rows []DatapathThroughputRow) {
	base := func(path, dir string) (DatapathThroughputRow, bool) {
		for _, r := range rows {
			if r.Path == path && r.Direction == dir && r.Error == "" {
				return r, true
			}
		}
		return DatapathThroughputRow{}, false
	}
	for i, r := range rows {
		if h, ok := base(pathHAProxy, r.Direction); ok {
			rows[i].VsHAProxy = ratio(r.MiBPerSec, h.MiBPerSec)
			rows[i].CPUVsHAProxy = ratio(r.ProxyCPUPerGiB, h.ProxyCPUPerGiB)
		}
		if d, ok := base(pathDirect, r.Direction); ok {
			rows[i].VsDirect = ratio(r.MiBPerSec, d.MiBPerSec)
			rows[i].CPUBoundVsDirect = ratio(d.MachineCPUPerGiB, r.MachineCPUPerGiB)
		}
	}
}

// idleConns holds connections through a contender.
type idleConns struct {
	mu    sync.Mutex // guards conns
	conns []net.Conn
}

// open opens n more idle connections through addr, idleDialers at a time,
// printing progress every newConnProgress; it stops early after
// idleMaxFailures failed connections and returns the failures.
func (h *idleConns) open(ctx context.Context, addr string, n int, label string, say func(string, ...any)) int {
	var next, failed, done atomic.Int64
	var wg sync.WaitGroup
	stopProgress := make(chan struct{})
	go func() {
		tick := time.NewTicker(newConnProgress)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				say("    %s: %d/%d opened, %d failed", label, done.Load(), n, failed.Load())
			}
		}
	}()
	for range idleDialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil && failed.Load() < idleMaxFailures {
				c, err := sinkDial(addr, sinkIdle, 0, 5*time.Second)
				if err != nil {
					failed.Add(1)
					continue
				}
				done.Add(1)
				h.mu.Lock()
				h.conns = append(h.conns, c)
				h.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopProgress)
	return int(failed.Load())
}

// held counts the connections still open: a peek that would block finds
// the connection open; end of stream or an error, closed.
func (h *idleConns) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if stillOpen(c) {
			n++
		}
	}
	return n
}

// stillOpen peeks at c without blocking.
func stillOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = n > 0 || errors.Is(err, syscall.EAGAIN)
		return true
	})
	return err == nil && open
}

func (h *idleConns) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
	h.conns = nil
}

// measureIdleConns reads the memory and file descriptors of contender c at
// rest, then holding each of cfg.IdleConns idle connections.
func measureIdleConns(ctx context.Context, c *dpContender, cfg datapathConfig, say func(string, ...any)) []DatapathIdleRow {
	errRow := func(conns int, err error) []DatapathIdleRow {
		return []DatapathIdleRow{{Path: c.name, Conns: conns, Error: err.Error()}}
	}
	sleep(ctx, idleSettle)
	pids := c.pids()
	rss0, fds0, err := procMem(pids)
	if err != nil {
		return errRow(0, err)
	}
	rows := []DatapathIdleRow{{Path: c.name, Processes: len(pids), RSSKiB: rss0, FDs: fds0}}
	say("  %s at rest: %d processes, RSS %.1f MiB, %d fds", c.name, len(pids), float64(rss0)/1024, fds0)
	var h idleConns
	defer h.close()
	for _, n := range cfg.IdleConns {
		began := time.Now()
		failed := h.open(ctx, c.addr, n-len(h.conns), fmt.Sprintf("%s to %d idle", c.name, n), say)
		sleep(ctx, idleSettle)
		if ctx.Err() != nil {
			return rows
		}
		held := h.held()
		pids := c.pids()
		rss, fds, err := procMem(pids)
		if err != nil {
			return append(rows, errRow(n, err)...)
		}
		r := DatapathIdleRow{Path: c.name, Conns: n, Held: held, Processes: len(pids), RSSKiB: rss, FDs: fds}
		if held > 0 {
			r.KiBPerConn = round(float64(rss-rss0)/float64(held), 2)
			r.FDsPerConn = round(float64(fds-fds0)/float64(held), 2)
		}
		if held < n {
			r.Note = fmt.Sprintf("held %d of %d (%d failed to open)", held, n, failed)
		}
		say("  %s holding %d/%d idle connections (%s): RSS %.1f MiB (%.1f KiB/conn), %d fds (%.2f/conn)",
			c.name, held, n, time.Since(began).Round(time.Millisecond), float64(rss)/1024, r.KiBPerConn, fds, r.FDsPerConn)
		rows = append(rows, r)
		if failed >= idleMaxFailures {
			break
		}
	}
	return rows
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// fillIdleRatios sets every idle row's ratio against HAProxy's at the
// same count.
func fillIdleRatios(rows []DatapathIdleRow) {
	base := make(map[int]float64)
	for _, r := range rows {
		if r.Path == pathHAProxy {
			base[r.Conns] = r.KiBPerConn
		}
	}
	for i, r := range rows {
		rows[i].KiBVsHAProxy = ratio(r.KiBPerConn, base[r.Conns])
	}
}

// runDatapath is the whole measurement; it returns what could not be
// measured.
func runDatapath(ctx context.Context, e *env, paths []string, cfg datapathConfig, say func(string, ...any)) (*DatapathResults, []string) {
	var names []string
	for _, p := range datapathPaths {
		if slices.Contains(paths, p) {
			names = append(names, p)
		}
	}
	cfg.LocalProxyLoopbackCC = localproxy.DefaultLoopbackCongestionControl
	r := &DatapathResults{Config: cfg}
	if len(names) == 0 {
		return r, nil
	}
	fail := func(err error) (*DatapathResults, []string) {
		r.Error = err.Error()
		say("data path: could not measure: %v", err)
		return r, []string{"data path: " + err.Error()}
	}
	// Two file descriptors per idle connection in a proxy; the client
	// holds one each, the sink (a process of its own) the other.
	most := 0
	if len(cfg.IdleConns) > 0 {
		most = slices.Max(cfg.IdleConns)
	}
	limit, err := nofileLimit(uint64(2*most + fdSpare))
	if err != nil {
		return fail(err)
	}
	cfg.NofileLimit = limit
	if fit, top := fitIdleConns(cfg.IdleConns, limit); top < most {
		say("data path: a process may open %d files here, so a proxy holds at most %d connections: idle counts %v instead of %v", limit, top, fit, cfg.IdleConns)
		cfg.Requested, cfg.IdleConns, most = cfg.IdleConns, fit, top
	}
	cfg.HAProxyMaxconn = most + 20
	if most > localproxy.DefaultMaxConnections {
		cfg.LocalProxyMaxConns = most
	}
	r.Config = cfg
	var sinkAddrs []string
	for i := range names {
		sinkAddrs = append(sinkAddrs, "127.0.0.1:"+strconv.Itoa(sinkBasePort+i))
	}
	sinkProc, err := startSink(ctx, filepath.Join(e.dir, "datapath", "sink"), e.bed.ServingCertificate(), sinkAddrs, sinkAddrs[0], peers.ProcOptions{})
	if err != nil {
		return fail(fmt.Errorf("start the sink: %w", err))
	}
	defer sinkProc.stop()
	var cs []*dpContender
	defer func() {
		for _, c := range cs {
			c.stop()
		}
	}()
	say("data path: %s in front of a TCP sink, fresh instances side by side", strings.Join(names, ", "))
	for i, name := range names {
		c, err := startDatapathContender(ctx, e, name, filepath.Join(e.dir, "datapath", name), sinkAddrs[i], cfg)
		if err != nil {
			return fail(fmt.Errorf("start %s: %w", name, err))
		}
		cs = append(cs, c)
	}
	say("  throughput: %d MiB each way through each, %d rounds", cfg.MiB, cfg.Rounds)
	rows, err := measureThroughput(ctx, cs, cfg, say)
	if err != nil {
		return fail(fmt.Errorf("throughput: %w", err))
	}
	r.Throughput = rows
	for _, row := range rows {
		say("    %s/%s: %.0f MiB/s (%s of direct; the CPU allows %s), proxy CPU %.3fs/GiB, machine %.3fs/GiB (%.0f%% busy)", row.Direction, row.Path, row.MiBPerSec, fmtRatio(row.VsDirect), fmtRatio(row.CPUBoundVsDirect), row.ProxyCPUPerGiB, row.MachineCPUPerGiB, 100*row.MachineBusy)
	}
	if cfg.ShortConns > 0 {
		say("  short connections: %d through each, one at a time, %d rounds", cfg.ShortConns, cfg.Rounds)
		short, err := measureShortConns(ctx, cs, cfg, say)
		if err != nil {
			return fail(fmt.Errorf("short connections: %w", err))
		}
		r.Short = short
		for _, row := range short {
			say("    %s: %.0fµs a connection, proxy CPU %.1fµs (%s of HAProxy's), machine %.1fµs (%s of direct's)", row.Path, row.WallUS, row.ProxyCPUUS, fmtRatio(row.CPUVsHAProxy), row.MachineCPUUS, fmtRatio(row.MachineVsDirect))
		}
	}
	if len(cfg.IdleConns) > 0 {
		say("  idle connections: %v through each, one contender at a time", cfg.IdleConns)
	}
	var failures []string
	for _, c := range cs {
		if c.pids == nil || ctx.Err() != nil {
			continue
		}
		rows := measureIdleConns(ctx, c, cfg, say)
		for _, row := range rows {
			if row.Error != "" {
				failures = append(failures, fmt.Sprintf("data path %s, %d idle: %s", row.Path, row.Conns, row.Error))
			}
		}
		r.Idle = append(r.Idle, rows...)
	}
	fillIdleRatios(r.Idle)
	if cfg.LinkBits > 0 && ctx.Err() == nil {
		// The contenders' ports are the link's contenders' too.
		for _, c := range cs {
			c.stop()
		}
		cs = nil
		r.Link = runLink(ctx, e, names, cfg, say)
		if r.Link.Error != "" {
			failures = append(failures, "data path across a link: "+r.Link.Error)
		}
	}
	return r, failures
}
