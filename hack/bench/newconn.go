package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// The new-connection measurement: clients that open a new TCP+TLS
// connection for every request (a shell loop of kubectl calls, a CNI
// plugin) through the L4 contenders, side by side, while the apiserver
// they send new connections to fails, and on a loaded machine with no
// fault.

// newConnPaths are the contenders a kubelet or kubectl would sit behind,
// in report order.
var newConnPaths = []string{pathLocalProxy, pathHAProxy, pathNginx}

// newConnURLPath is what the clients GET: cheap, no object, answered by
// the apiserver itself.
const newConnURLPath = "/version"

// Timings of the new-connection runs.
const (
	// newConnLeadIn is how long the clients run before the fault.
	newConnLeadIn = 5 * time.Second
	// newConnTail: a failure among the requests sent this long before the
	// end of the window means the contender was still failing.
	newConnTail = 5 * time.Second
	// newConnProgress is how often a long step prints a progress line.
	newConnProgress = 10 * time.Second
	// viewPoll is how often the loaded run reads the health views.
	viewPoll = 100 * time.Millisecond
)

// newConnConfig sizes the measurement.
type newConnConfig struct {
	// Rate is requests per second per contender.
	Rate int `json:"rate_per_s"`
	// Timeout is each request's deadline.
	Timeout time.Duration `json:"-"`
	// Window is how long each fault is observed.
	Window time.Duration `json:"-"`
	// Loaded is how long the loaded run lasts (0: none).
	Loaded time.Duration `json:"-"`
	// Burners is the number of CPU-burning processes of the loaded run.
	Burners int `json:"burners"`

	TimeoutS float64 `json:"timeout_s"`
	WindowS  float64 `json:"window_s"`
	LoadedS  float64 `json:"loaded_s"`
}

// NewConnRow is one fault on one contender in the results.
type NewConnRow struct {
	Fault  string `json:"fault"`
	Path   string `json:"path"`
	Victim string `json:"victim"`
	// Requests counts the requests that ended after the fault, Failed
	// those of them that failed (error, non-200 or deadline).
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	// FailedBefore counts failures in the lead-in, before the fault.
	FailedBefore int `json:"failed_before_fault"`
	// Outage is from the sending of the first failed request to the
	// sending of the last one (0: at most one failed).
	Outage float64 `json:"outage_s"`
	// StillFailing: requests sent in the last 5s of the window failed, so
	// the outage lasted at least until the end of the window.
	StillFailing bool `json:"still_failing"`
	// SentToVictim counts the connections the contender sent (or tried to
	// send) to the faulted apiserver after the fault (clientPath.sent);
	// nil where it cannot tell.
	SentToVictim *int `json:"sent_to_victim"`
	// SlowestOKms is the slowest successful request after the fault.
	SlowestOKms float64 `json:"slowest_ok_ms"`
	// Ratios against HAProxy in the same fault run (0: either is 0).
	FailedRatio float64 `json:"failed_vs_haproxy"`
	OutageRatio float64 `json:"outage_vs_haproxy"`
	Error       string  `json:"error,omitempty"`
}

// NewConnLoadedRow is one contender in the loaded run without a fault.
type NewConnLoadedRow struct {
	Path     string  `json:"path"`
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	// Downs and Suspects count the times an apiserver went down or
	// suspect in the contender's health view, read every 100ms (shorter
	// episodes can be missed); nil without a health view.
	Downs    *int `json:"downs"`
	Suspects *int `json:"suspects"`
	// Ratios against HAProxy (0: either is 0).
	FailedRatio float64 `json:"failed_vs_haproxy"`
	P99Ratio    float64 `json:"p99_vs_haproxy"`
	Error       string  `json:"error,omitempty"`
}

// NewConnResults is the measurement in results.json.
type NewConnResults struct {
	Config newConnConfig      `json:"config"`
	Faults map[string]string  `json:"faults"`
	Rows   []NewConnRow       `json:"rows"`
	Loaded []NewConnLoadedRow `json:"loaded"`
	Error  string             `json:"error,omitempty"`
}

// ncResult is one request.
type ncResult struct {
	start, end time.Time
	ok         bool
}

// newConnClient sends a GET on a new connection at a fixed rate, each in
// its own goroutine with its own deadline, so that a stuck request delays
// none of the others.
type newConnClient struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex // guards res
	res    []ncResult
}

func startNewConnClient(ctx context.Context, get func(context.Context) error, rate int, timeout time.Duration) *newConnClient {
	ctx, cancel := context.WithCancel(ctx)
	c := &newConnClient{cancel: cancel}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				// The request's deadline does not end with the client:
				// stop lets the requests in flight finish.
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
				defer rcancel()
				start := time.Now()
				err := get(rctx)
				c.mu.Lock()
				c.res = append(c.res, ncResult{start: start, end: time.Now(), ok: err == nil})
				c.mu.Unlock()
			}()
		}
	}()
	return c
}

// snapshot returns the requests finished so far.
func (c *newConnClient) snapshot() []ncResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.res)
}

// stop sends no more requests, waits for those in flight and returns
// every request, in the order they ended.
func (c *newConnClient) stop() []ncResult {
	c.cancel()
	c.wg.Wait()
	return c.snapshot()
}

// failedSince counts the requests ended at or after t and the failed ones.
func failedSince(res []ncResult, t time.Time) (failed, total int) {
	for _, r := range res {
		if !r.end.Before(t) {
			total++
			if !r.ok {
				failed++
			}
		}
	}
	return failed, total
}

// faultRow summarizes the requests of one contender around a fault at t0
// observed until end.
func faultRow(res []ncResult, t0, end time.Time) NewConnRow {
	var row NewConnRow
	var first, last time.Time
	var slowest time.Duration
	for _, r := range res {
		if r.end.Before(t0) {
			if !r.ok {
				row.FailedBefore++
			}
			continue
		}
		row.Requests++
		if r.ok {
			slowest = max(slowest, r.end.Sub(r.start))
			continue
		}
		row.Failed++
		if first.IsZero() || r.start.Before(first) {
			first = r.start
		}
		if r.start.After(last) {
			last = r.start
		}
		if !r.start.Before(end.Add(-newConnTail)) {
			row.StillFailing = true
		}
	}
	if !first.IsZero() {
		row.Outage = round(last.Sub(first).Seconds(), 2)
	}
	row.SlowestOKms = ms(slowest)
	return row
}

// fillNewConnRatios sets every row's ratios against HAProxy's row of the
// same fault.
func fillNewConnRatios(rows []NewConnRow) {
	base := make(map[string]NewConnRow)
	for _, r := range rows {
		if r.Path == pathHAProxy && r.Error == "" {
			base[r.Fault] = r
		}
	}
	for i, r := range rows {
		if b, ok := base[r.Fault]; ok {
			rows[i].FailedRatio = ratio(float64(r.Failed), float64(b.Failed))
			rows[i].OutageRatio = ratio(r.Outage, b.Outage)
		}
	}
}

// newConnContenders are the started contenders and their clients' GET.
type newConnContenders struct {
	paths []*clientPath
	gets  []func(context.Context) error
}

func (c *newConnContenders) close() {
	for _, p := range c.paths {
		p.close()
	}
}

// startContenders starts a fresh instance of each contender under
// dir and waits until each counts every apiserver healthy.
func startContenders(ctx context.Context, e *env, names []string, dir string) (*newConnContenders, error) {
	c := &newConnContenders{}
	for _, name := range names {
		p, err := startPath(ctx, e, name, filepath.Join(dir, name))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		c.paths = append(c.paths, p)
		get, err := newConnGetter(p.config, newConnURLPath)
		if err != nil {
			c.close()
			return nil, err
		}
		c.gets = append(c.gets, get)
	}
	for _, p := range c.paths {
		if !waitUntil(ctx, settleLimit, p.settled) {
			c.close()
			return nil, fmt.Errorf("%s did not count every apiserver healthy within %s", p.name, settleLimit)
		}
	}
	return c, nil
}

func (c *newConnContenders) startClients(ctx context.Context, cfg newConnConfig) []*newConnClient {
	var out []*newConnClient
	for _, get := range c.gets {
		out = append(out, startNewConnClient(ctx, get, cfg.Rate, cfg.Timeout))
	}
	return out
}

// progress is the failed/total line of every contender since t.
func (c *newConnContenders) progress(clients []*newConnClient, t time.Time) string {
	var parts []string
	for i, cl := range clients {
		failed, total := failedSince(cl.snapshot(), t)
		parts = append(parts, fmt.Sprintf("%s %d/%d failed", c.paths[i].name, failed, total))
	}
	return strings.Join(parts, ", ")
}

// observe waits d, printing the contenders' progress since t every
// newConnProgress; false if ctx ended or a contender exited.
func (c *newConnContenders) observe(ctx context.Context, clients []*newConnClient, t time.Time, d time.Duration, label string, say func(string, ...any)) error {
	end := t.Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(left, newConnProgress)):
		}
		for _, p := range c.paths {
			if p.exited() {
				return fmt.Errorf("%s exited during the run", p.name)
			}
		}
		say("    %s +%.0fs: %s", label, time.Since(t).Seconds(), c.progress(clients, t))
	}
}

// chooseVictim picks the apiserver to fault: localproxy's preferred one
// (where it sends new connections) when it runs, else the bed's first.
// HAProxy and nginx balance new connections over every apiserver
// (leastconn with none open), so any one takes a third of them.
func chooseVictim(e *env, c *newConnContenders) (*testbed.APIServer, string) {
	servers := e.bed.APIServers()
	for _, p := range c.paths {
		if p.name != pathLocalProxy || p.views == nil {
			continue
		}
		v, err := p.views()
		if err != nil {
			break
		}
		for _, s := range servers {
			if v[s.Addr()].Preferred {
				return s, "localproxy's preferred"
			}
		}
	}
	return servers[0], "the first"
}

// runNewConnFault runs the clients through fresh contenders, injects f
// into the victim after the lead-in, observes for the window and restores
// the victim. A returned error means nothing could be measured.
func runNewConnFault(ctx context.Context, e *env, names []string, f fault, cfg newConnConfig, say func(string, ...any)) ([]NewConnRow, error) {
	if err := e.bed.Heal(ctx); err != nil {
		return nil, fmt.Errorf("heal before the run: %w", err)
	}
	c, err := startContenders(ctx, e, names, filepath.Join(e.dir, "newconn", f.name))
	if err != nil {
		return nil, err
	}
	defer c.close()
	clients := c.startClients(ctx, cfg)
	stopped := false
	defer func() {
		if !stopped {
			for _, cl := range clients {
				cl.stop()
			}
		}
	}()
	began := time.Now()
	if err := c.observe(ctx, clients, began, newConnLeadIn, f.name+" lead-in", func(string, ...any) {}); err != nil {
		return nil, err
	}
	victim, why := chooseVictim(e, c)
	sentBefore := make([]int, len(c.paths))
	for i, p := range c.paths {
		sentBefore[i], _ = p.sent(victim.Addr())
	}
	say("  %s: %s into %s (%s apiserver); before it: %s", f.name, f.what, victim.Addr(), why, c.progress(clients, began))
	if err := f.inject(victim); err != nil {
		return nil, fmt.Errorf("inject %s into %s: %w", f.name, victim.Name(), err)
	}
	t0 := time.Now()
	if err := c.observe(ctx, clients, t0, cfg.Window, f.name, say); err != nil {
		return nil, err
	}
	end := time.Now()
	var res [][]ncResult
	for _, cl := range clients {
		res = append(res, cl.stop())
	}
	stopped = true
	// nginx writes a session's line when the session has ended.
	time.Sleep(500 * time.Millisecond)
	var rows []NewConnRow
	for i, p := range c.paths {
		row := faultRow(res[i], t0, end)
		row.Fault, row.Path, row.Victim = f.name, p.name, victim.Addr()
		if n, ok := p.sent(victim.Addr()); ok {
			d := n - sentBefore[i]
			row.SentToVictim = &d
		}
		rows = append(rows, row)
	}
	c.close()
	if err := f.restore(ctx, victim); err != nil {
		return rows, fmt.Errorf("restore %s: %w", victim.Name(), err)
	}
	return rows, nil
}

// flapCounter counts the times each apiserver goes down or suspect in a
// health view read every viewPoll.
type flapCounter struct {
	stop func()
	done chan struct{}

	downs, suspects int
}

func watchFlaps(ctx context.Context, views func() (map[string]endpointView, error)) *flapCounter {
	ctx, cancel := context.WithCancel(ctx)
	fc := &flapCounter{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(fc.done)
		prev := make(map[string]endpointView)
		tick := time.NewTicker(viewPoll)
		defer tick.Stop()
		for {
			if v, err := views(); err == nil {
				for addr, now := range v {
					// Only changes count: an endpoint first seen down
					// (not probed yet, just discovered) was never up.
					if was, seen := prev[addr]; seen {
						if now.Down && !was.Down {
							fc.downs++
						}
						if now.Suspect && !was.Suspect {
							fc.suspects++
						}
					}
					prev[addr] = now
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return fc
}

// result stops the counter and returns its counts.
func (fc *flapCounter) result() (downs, suspects int) {
	fc.stop()
	<-fc.done
	return fc.downs, fc.suspects
}

// startBurners starts n processes that spin on a CPU each until stop.
func startBurners(n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("CPU burner: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// runNewConnLoaded runs the clients through fresh contenders for
// cfg.Loaded while cfg.Burners processes keep the CPUs busy, with no
// fault, counting the health views' downs and suspects.
func runNewConnLoaded(ctx context.Context, e *env, names []string, cfg newConnConfig, say func(string, ...any)) ([]NewConnLoadedRow, error) {
	if err := e.bed.Heal(ctx); err != nil {
		return nil, fmt.Errorf("heal before the run: %w", err)
	}
	c, err := startContenders(ctx, e, names, filepath.Join(e.dir, "newconn", "loaded"))
	if err != nil {
		return nil, err
	}
	defer c.close()
	stopBurners, err := startBurners(cfg.Burners)
	if err != nil {
		return nil, err
	}
	defer stopBurners()
	flaps := make([]*flapCounter, len(c.paths))
	for i, p := range c.paths {
		if p.views != nil {
			flaps[i] = watchFlaps(ctx, p.views)
		}
	}
	// A transport.Wrap client with default options beside them: its
	// health view is its pool (held probes, as the localproxy's).
	lt, err := startLoadedTransport(ctx, e, cfg)
	if err != nil {
		return nil, fmt.Errorf("transport client: %w", err)
	}
	say("  loaded: %d CPU burners, clients at %d/s through %s and a transport.Wrap client for %s", cfg.Burners, cfg.Rate, strings.Join(names, ", "), cfg.Loaded)
	clients := c.startClients(ctx, cfg)
	t := time.Now()
	oerr := c.observe(ctx, clients, t, cfg.Loaded, "loaded", say)
	rows := []NewConnLoadedRow{lt.stop()}
	for i, cl := range clients {
		res := cl.stop()
		row := NewConnLoadedRow{Path: c.paths[i].name}
		var lat []time.Duration
		for _, r := range res {
			row.Requests++
			if !r.ok {
				row.Failed++
				continue
			}
			lat = append(lat, r.end.Sub(r.start))
		}
		slices.Sort(lat)
		row.P50ms, row.P99ms = ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99))
		if flaps[i] != nil {
			d, s := flaps[i].result()
			row.Downs, row.Suspects = &d, &s
		}
		rows = append(rows, row)
	}
	if oerr != nil {
		return rows, oerr
	}
	var base *NewConnLoadedRow
	for i := range rows {
		if rows[i].Path == pathHAProxy {
			base = &rows[i]
		}
	}
	if base != nil {
		b := *base
		for i := range rows {
			rows[i].FailedRatio = ratio(float64(rows[i].Failed), float64(b.Failed))
			rows[i].P99Ratio = ratio(rows[i].P99ms, b.P99ms)
		}
	}
	return rows, nil
}

// runNewConn is the whole measurement: every fault, then the loaded run.
// It returns what could not be measured.
func runNewConn(ctx context.Context, e *env, paths []string, faults []string, cfg newConnConfig, say func(string, ...any)) (*NewConnResults, []string) {
	var names []string
	for _, p := range newConnPaths {
		if slices.Contains(paths, p) {
			names = append(names, p)
		}
	}
	cfg.TimeoutS, cfg.WindowS, cfg.LoadedS = cfg.Timeout.Seconds(), cfg.Window.Seconds(), cfg.Loaded.Seconds()
	r := &NewConnResults{Config: cfg, Faults: make(map[string]string)}
	if len(names) == 0 {
		return r, nil
	}
	var failures []string
	e.sessionLogs = true
	defer func() { e.sessionLogs = false }()
	say("new connections: GET %s on a new connection %d times a second, %s deadline, through %s", newConnURLPath, cfg.Rate, cfg.Timeout, strings.Join(names, ", "))
	for _, name := range faults {
		if ctx.Err() != nil {
			break
		}
		f := faultByName(name)
		r.Faults[f.name] = f.what
		t := time.Now()
		rows, err := runNewConnFault(ctx, e, names, *f, cfg, say)
		if err != nil {
			failures = append(failures, fmt.Sprintf("new connections %s: %v", f.name, err))
			say("    %s: could not measure: %v", f.name, err)
			if rows == nil {
				for _, n := range names {
					rows = append(rows, NewConnRow{Fault: f.name, Path: n, Error: err.Error()})
				}
			}
		}
		for _, row := range rows {
			say("    %s/%s: failed %d/%d, outage %.2fs, sent to %s: %s, slowest OK %.0fms (%s)", f.name, row.Path, row.Failed, row.Requests,
				row.Outage, row.Victim, fmtCount(row.SentToVictim), row.SlowestOKms, time.Since(t).Round(time.Second))
		}
		r.Rows = append(r.Rows, rows...)
	}
	fillNewConnRatios(r.Rows)
	if cfg.Loaded > 0 && ctx.Err() == nil {
		rows, err := runNewConnLoaded(ctx, e, names, cfg, say)
		if err != nil {
			failures = append(failures, "new connections loaded: "+err.Error())
			r.Error = err.Error()
			say("    loaded: could not measure: %v", err)
		}
		for _, row := range rows {
			say("    loaded/%s: failed %d/%d, p50 %.1fms, p99 %.1fms, downs %s, suspects %s", row.Path, row.Failed, row.Requests,
				row.P50ms, row.P99ms, fmtCount(row.Downs), fmtCount(row.Suspects))
		}
		r.Loaded = rows
	}
	return r, failures
}

func fmtCount(n *int) string {
	if n == nil {
		return "n/a"
	}
	return strconv.Itoa(*n)
}

// localproxyDials sums apifailover_localproxy_dials_total for addr (every
// result) from localproxy's /metrics.
func localproxyDials(addr string) (int, error) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(localproxyHealthPort) + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return sumCounter(bufio.NewScanner(resp.Body), "apifailover_localproxy_dials_total", `endpoint="`+addr+`"`)
}

// sumCounter adds up the samples of metric (Prometheus text format) whose
// labels contain label.
func sumCounter(sc *bufio.Scanner, metric, label string) (int, error) {
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, metric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, label) {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", line, err)
		}
		total += v
	}
	return int(total), sc.Err()
}

// nginxSessionsTo counts the sessions in nginx's session log
// (nginxSessionFormat) that were sent to addr, alone or before the next
// upstream.
func nginxSessionsTo(path, addr string) (int, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		_, rest, ok := strings.Cut(sc.Text(), `"`)
		if !ok {
			continue
		}
		for _, u := range strings.Split(strings.TrimSuffix(rest, `"`), ",") {
			if strings.TrimSpace(u) == addr {
				n++
				break
			}
		}
	}
	return n, sc.Err()
}
