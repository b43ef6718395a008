package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Overhead operations.
const (
	opGetSeq    = "get-seq"
	opGetSparse = "get-sparse"
	opGetConc   = "get-concurrent"
	opList      = "list"
	opNewConn   = "get-new-connection"
)

var opDescriptions = map[string]string{
	opGetSeq:    "GET one small ConfigMap, one request at a time, one HTTP/2 connection",
	opGetSparse: "the same GET, one at a time with a pause between (-sparse-gap): a node agent's pace",
	opGetConc:   "the same GET from concurrent goroutines sharing one client",
	opList:      "LIST the namespace's ConfigMaps",
	opNewConn:   "the same GET on a new TCP+TLS connection each time (kubectl-like clients)",
}

const (
	benchNamespace = "bench-overhead"
	smallConfigMap = "small"
)

// overheadConfig sizes the overhead measurement. Every count is per path,
// split evenly over the rounds.
type overheadConfig struct {
	Rounds    int `json:"rounds"`
	GetSeq    int `json:"get_seq"`
	GetSparse int `json:"get_sparse"`
	// SparseGap is the pause before each sparse GET.
	SparseGap   time.Duration `json:"sparse_gap_ns"`
	GetConc     int           `json:"get_concurrent"`
	Concurrency int           `json:"concurrency"`
	Lists       int           `json:"lists"`
	ListObjects int           `json:"list_objects"`
	ListBytes   int           `json:"list_object_bytes"`
	NewConn     int           `json:"get_new_connection"`
}

// sample is what one op measured on one path: request latencies and the
// wall and proxy CPU time they took.
type sample struct {
	lat    []time.Duration
	wall   time.Duration
	cpu    time.Duration
	failed int
}

func (s *sample) add(o sample) {
	s.lat = append(s.lat, o.lat...)
	s.wall += o.wall
	s.cpu += o.cpu
	s.failed += o.failed
}

// OverheadRow is one op on one path in the results.
type OverheadRow struct {
	Op       string  `json:"op"`
	Path     string  `json:"path"`
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	PerSec   float64 `json:"per_second"`
	// Ratios against the direct path's figure of the same op, measured in
	// the same run: >1 means slower (latency) or faster (throughput).
	P50Ratio    float64 `json:"p50_vs_direct"`
	P99Ratio    float64 `json:"p99_vs_direct"`
	PerSecRatio float64 `json:"per_second_vs_direct"`
	// ProxyCPUMicros is the CPU time the proxy processes used per
	// request, their use at rest (IdleCPUms per second of the op's wall
	// time) taken off; 0 for in-process paths.
	ProxyCPUMicros float64 `json:"proxy_cpu_us_per_request,omitempty"`
	// CPUVsHAProxy is ProxyCPUMicros against HAProxy's for the same op in
	// the same run (0: unknown).
	CPUVsHAProxy float64 `json:"proxy_cpu_vs_haproxy,omitempty"`
	// ProxyCPURounds is ProxyCPUMicros of each round alone, in round
	// order; CPUVsHAProxyRounds the lowest and highest of the rounds'
	// ratios against HAProxy's figure of the same round: how far one
	// round's ratio strays from the run's on this machine, i.e. whether
	// a ratio near 1 is within the noise (zero: unknown).
	ProxyCPURounds     []float64  `json:"proxy_cpu_us_per_round,omitempty"`
	CPUVsHAProxyRounds [2]float64 `json:"proxy_cpu_vs_haproxy_rounds_min_max,omitzero"`
	// IdleCPUms is the proxy's CPU use at rest: milliseconds per second.
	IdleCPUms float64 `json:"proxy_idle_cpu_ms_per_s,omitempty"`
	Error     string  `json:"error,omitempty"`
	// latencies are quantiles of the latencies, for the CDF (charts.go).
	latencies []float64
}

// seedOverhead creates the namespace, the small ConfigMap and the objects
// the LIST returns, through apiserver-1.
func seedOverhead(ctx context.Context, cs kubernetes.Interface, cfg overheadConfig) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	cms := cs.CoreV1().ConfigMaps(benchNamespace)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: smallConfigMap}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	payload := strings.Repeat("x", cfg.ListBytes)
	for i := range cfg.ListObjects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("item-%04d", i)}, Data: map[string]string{"payload": payload}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// overheadClient is one path's clients for the overhead ops.
type overheadClient struct {
	path *clientPath
	cs   kubernetes.Interface
	// getNewConn GETs the small ConfigMap on a new connection; nil when
	// the path cannot (transport.Wrap pools its own).
	getNewConn func(context.Context) error
	// idleRate is the proxy's CPU use at rest (health checks, discovery),
	// CPU seconds per second; subtracted from the per-request figures.
	idleRate float64
}

// idlePeriod is how long the proxies' CPU use at rest is measured.
const idlePeriod = 5 * time.Second

// measureIdle measures every proxy's CPU use with no client traffic.
func measureIdle(ctx context.Context, clients []*overheadClient, d time.Duration) {
	before := make([]time.Duration, len(clients))
	for i, c := range clients {
		if c.path.pids != nil {
			before[i] = cpuTime(c.path.pids())
		}
	}
	began := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	wall := time.Since(began)
	for i, c := range clients {
		if c.path.pids != nil {
			c.idleRate = (cpuTime(c.path.pids()) - before[i]).Seconds() / wall.Seconds()
		}
	}
}

func newOverheadClient(p *clientPath) (*overheadClient, error) {
	cfg := rest.CopyConfig(p.config)
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit
	cs, err := kubernetes.NewForConfigAndClient(cfg, p.httpClient)
	if err != nil {
		return nil, err
	}
	oc := &overheadClient{path: p, cs: cs}
	if p.name != pathTransport {
		oc.getNewConn, err = newConnGetter(cfg, "/api/v1/namespaces/"+benchNamespace+"/configmaps/"+smallConfigMap)
		if err != nil {
			return nil, err
		}
	}
	return oc, nil
}

// run measures op n times; gap is the sparse GETs' pause.
func (oc *overheadClient) run(ctx context.Context, op string, n, conc int, gap time.Duration) sample {
	var cpu0 time.Duration
	if oc.path.pids != nil {
		cpu0 = cpuTime(oc.path.pids())
	}
	began := time.Now()
	var s sample
	switch op {
	case opGetSeq:
		s = oc.sequential(ctx, n, oc.get)
	case opGetSparse:
		s = oc.paced(ctx, n, gap, oc.get)
	case opGetConc:
		s = oc.concurrent(ctx, n, conc, oc.get)
	case opList:
		s = oc.sequential(ctx, n, oc.list)
	case opNewConn:
		s = oc.sequential(ctx, n, oc.getNewConn)
	}
	s.wall = time.Since(began)
	if oc.path.pids != nil {
		idle := time.Duration(oc.idleRate * float64(s.wall))
		s.cpu = max(cpuTime(oc.path.pids())-cpu0-idle, 0)
	}
	return s
}

func (oc *overheadClient) get(ctx context.Context) error {
	_, err := oc.cs.CoreV1().ConfigMaps(benchNamespace).Get(ctx, smallConfigMap, metav1.GetOptions{})
	return err
}

func (oc *overheadClient) list(ctx context.Context) error {
	_, err := oc.cs.CoreV1().ConfigMaps(benchNamespace).List(ctx, metav1.ListOptions{})
	return err
}

// newConnGetter returns a GET of path on cfg's host that opens a new
// TCP+TLS connection for every request, as kubectl-like clients and CNI
// plugins do, authenticated with cfg's bearer token. A response other
// than 200 is an error.
func newConnGetter(cfg *rest.Config, path string) (func(context.Context) error, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	url := strings.TrimSuffix(cfg.Host, "/") + path
	auth := "Bearer " + cfg.BearerToken
	return func(ctx context.Context) error {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig:   tlsCfg.Clone(),
			ForceAttemptHTTP2: true,
			DisableKeepAlives: true,
		}}
		defer hc.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", auth)
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}, nil
}

const requestTimeout = 10 * time.Second

func timed(ctx context.Context, do func(context.Context) error) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	t := time.Now()
	err := do(rctx)
	return time.Since(t), err
}

func (oc *overheadClient) sequential(ctx context.Context, n int, do func(context.Context) error) sample {
	s := sample{lat: make([]time.Duration, 0, n)}
	for range n {
		if ctx.Err() != nil {
			break
		}
		d, err := timed(ctx, do)
		if err != nil {
			s.failed++
			continue
		}
		s.lat = append(s.lat, d)
	}
	return s
}

// paced is sequential with a pause of gap before each request; the
// pauses are in the sample's wall time (the proxies' use at rest over
// them is taken off their CPU), not in its latencies.
func (oc *overheadClient) paced(ctx context.Context, n int, gap time.Duration, do func(context.Context) error) sample {
	var s sample
	for range n {
		select {
		case <-ctx.Done():
			return s
		case <-time.After(gap):
		}
		one := oc.sequential(ctx, 1, do)
		s.lat = append(s.lat, one.lat...)
		s.failed += one.failed
	}
	return s
}

func (oc *overheadClient) concurrent(ctx context.Context, n, conc int, do func(context.Context) error) sample {
	var next atomic.Int64
	results := make(chan sample, conc)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s sample
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				d, err := timed(ctx, do)
				if err != nil {
					s.failed++
					continue
				}
				s.lat = append(s.lat, d)
			}
			results <- s
		}()
	}
	wg.Wait()
	close(results)
	var all sample
	for s := range results {
		all.add(s)
	}
	return all
}

// percentile returns the q-quantile (0 < q <= 1) of sorted durations by
// nearest rank; 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// summarize turns the samples of one op on one path into a row (ratios
// are filled later).
func summarize(op, path string, s sample) OverheadRow {
	lat := slices.Clone(s.lat)
	slices.Sort(lat)
	r := OverheadRow{Op: op, Path: path, Requests: len(lat) + s.failed, Failed: s.failed,
		P50ms: ms(percentile(lat, 0.50)), P99ms: ms(percentile(lat, 0.99))}
	if s.wall > 0 {
		r.PerSec = round(float64(len(lat))/s.wall.Seconds(), 1)
	}
	r.ProxyCPUMicros = cpuPerRequest(s)
	return r
}

// cpuPerRequest is s's proxy CPU per request answered, in µs; 0 for none.
func cpuPerRequest(s sample) float64 {
	if s.cpu <= 0 || len(s.lat) == 0 {
		return 0
	}
	return round(float64(s.cpu.Microseconds())/float64(len(s.lat)), 1)
}

// fillRatios sets every row's ratios against the direct path's row of the
// same op, and its proxy CPU against HAProxy's.
func fillRatios(rows []OverheadRow) {
	base := make(map[string]OverheadRow)
	haproxy := make(map[string]float64)
	haproxyRounds := make(map[string][]float64)
	for _, r := range rows {
		switch r.Path {
		case pathDirect:
			base[r.Op] = r
		case pathHAProxy:
			haproxy[r.Op] = r.ProxyCPUMicros
			haproxyRounds[r.Op] = r.ProxyCPURounds
		}
	}
	for i, r := range rows {
		rows[i].CPUVsHAProxy = ratio(r.ProxyCPUMicros, haproxy[r.Op])
		rows[i].CPUVsHAProxyRounds = roundRatios(r.ProxyCPURounds, haproxyRounds[r.Op])
		b, ok := base[r.Op]
		if !ok {
			continue
		}
		rows[i].P50Ratio = ratio(r.P50ms, b.P50ms)
		rows[i].P99Ratio = ratio(r.P99ms, b.P99ms)
		rows[i].PerSecRatio = ratio(r.PerSec, b.PerSec)
	}
}

// roundRatios is the lowest and highest of the ratios of a's rounds to
// b's rounds of the same number; zero unless both have every round, each
// with a figure.
func roundRatios(a, b []float64) [2]float64 {
	if len(a) == 0 || len(a) != len(b) {
		return [2]float64{}
	}
	lo, hi := math.Inf(1), 0.0
	for i := range a {
		r := ratio(a[i], b[i])
		if r == 0 {
			return [2]float64{}
		}
		lo, hi = min(lo, r), max(hi, r)
	}
	return [2]float64{lo, hi}
}

func ratio(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return round(a/b, 3)
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// measureOverhead runs every op on every path, interleaved: each round
// runs a share of every op on every path, in an order rotated per round,
// so that drift on a shared machine spreads over all paths alike.
// round runs one round of every op through oc (that op's count over
// cfg.Rounds requests; no new connections where oc cannot open them) and
// gives each op's sample to got.
func (oc *overheadClient) round(ctx context.Context, cfg overheadConfig, got func(op string, s sample)) {
	for _, op := range overheadOps {
		if op == opNewConn && oc.getNewConn == nil {
			continue
		}
		got(op, oc.run(ctx, op, opCount(cfg, op)/cfg.Rounds, cfg.Concurrency, cfg.SparseGap))
	}
}

func measureOverhead(ctx context.Context, clients []*overheadClient, cfg overheadConfig, say func(string, ...any)) []OverheadRow {
	acc := make(map[string]map[string]*sample)      // op -> path -> samples
	rounds := make(map[string]map[string][]float64) // op -> path -> CPU µs per request of each round
	for _, op := range overheadOps {
		acc[op] = make(map[string]*sample)
		rounds[op] = make(map[string][]float64)
		for _, c := range clients {
			acc[op][c.path.name] = &sample{}
		}
	}
	// Warm up: connections open, caches filled, nothing recorded.
	for _, c := range clients {
		c.run(ctx, opGetSeq, 20, 1, 0)
		c.run(ctx, opList, 2, 1, 0)
	}
	for round := range cfg.Rounds {
		began := time.Now()
		for i := range clients {
			c := clients[(i+round)%len(clients)]
			c.round(ctx, cfg, func(op string, got sample) {
				acc[op][c.path.name].add(got)
				rounds[op][c.path.name] = append(rounds[op][c.path.name], cpuPerRequest(got))
			})
		}
		say("  overhead round %d/%d done in %s", round+1, cfg.Rounds, time.Since(began).Round(time.Millisecond))
	}
	var rows []OverheadRow
	for _, op := range overheadOps {
		for _, c := range clients {
			s := acc[op][c.path.name]
			if op == opNewConn && c.getNewConn == nil {
				continue
			}
			r := summarize(op, c.path.name, *s)
			if r.ProxyCPUMicros > 0 {
				r.ProxyCPURounds = rounds[op][c.path.name]
			}
			r.latencies = latencyQuantiles(s.lat)
			if c.path.pids != nil {
				r.IdleCPUms = round(c.idleRate*1000, 2)
			}
			if s.failed > 0 {
				r.Error = fmt.Sprintf("%d of %d requests failed", s.failed, r.Requests)
			}
			rows = append(rows, r)
		}
	}
	fillRatios(rows)
	return rows
}
