// Package chaos is a seeded soak: random faults (Plan) on a real control
// plane (hack/testbed) under load from real client-go clients, half
// through transport.Wrap and half through an in-process localproxy, with
// invariants checked at the end that prove nothing was lost. make chaos
// runs it; make test runs a 2-minute soak.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport"
)

// Options configure a soak.
type Options struct {
	// Seed makes the fault schedule; the same seed and Duration give the
	// same schedule.
	Seed uint64
	// Duration of the soak, warm-up and cool-down included.
	Duration time.Duration
	// Out is the directory of summary.json and the logs. Required.
	Out string
	// Log receives progress lines. Required.
	Log io.Writer
	// Bed configures the test bed (InstallDeps, Dir, Version, ...);
	// APIServers is set to 3.
	Bed testbed.Options
}

// Failure classes.
const (
	classFault      = "fault-window"
	classAllDown    = "all-down"
	classUnexplain  = "unexplained"
	failoverGrace   = 3 * time.Second // after a fault is lifted, its failures may still end
	workloadsPerWay = 2               // workloads per path
	workloadWrite   = 100 * time.Millisecond
	workloadGet     = 50 * time.Millisecond
	leakSlack       = 10    // goroutines or fds above baseline tolerated
	minSuccess      = 0.999 // outside the all-down phase
	// successEnforcedFrom: a soak this long or longer fails on a path
	// below minSuccess; a shorter one reports it (TargetsMissed). Over
	// 2 minutes a path's ratio rests on about 7 faults and 10,000
	// requests, so one fault on the apiserver it uses decides it: 20%
	// packet loss there gets it counted down, and the writes in flight on
	// the connections cut then (a dozen) fail, as an L4 proxy cannot
	// replay them. 10 minutes hold about 50 faults.
	successEnforcedFrom = 10 * time.Minute
	// getRetries is client-go's default rest.Request.MaxRetries, which
	// kubelet's, kubectl's and controllers' GETs have: a GET cut in flight
	// (a path closing the connection to a server it counted down, which
	// an L4 proxy cannot replay) is sent again after 1s within its
	// deadline. Writes are sent once. Summary.RetriedGets counts them.
	getRetries = 10
	stopLimit  = 60 * time.Second // for the informers to see the last creates
)

// Retried counts the GETs of a path that client-go sent again.
type Retried struct {
	GETs     int `json:"gets"`
	Answered int `json:"answered"`
}

// Summary is the soak's result, written to summary.json.
type Summary struct {
	Seed       uint64  `json:"seed"`
	Duration   float64 `json:"duration_s"`
	Schedule   []Step  `json:"schedule"`
	Replay     string  `json:"replay"`
	Operations int     `json:"operations"`
	// Failures by class: fault-window, all-down, unexplained.
	Failures map[string]int `json:"failures"`
	// FailuresByFault counts the fault-window failures by the fault
	// (kind) and path: "hang/localproxy".
	FailuresByFault map[string]int `json:"failures_by_fault"`
	// FailureSamples holds the first error of each FailuresByFault key.
	FailureSamples map[string]string `json:"failure_samples"`
	// FailureErrors counts the fault-window failures by path, method
	// (GET or a write) and kind of error (errorKind): what a client saw,
	// and whether client-go would have sent a GET again.
	FailureErrors map[string]int `json:"failure_errors"`
	// MaxFailoverSeconds is, per fault kind and path ("hang/localproxy"),
	// the longest stretch inside a window of that kind (and failoverGrace
	// after it) in which a client of the path got no answer
	// (maxFailover).
	MaxFailoverSeconds map[string]float64 `json:"max_failover_seconds"`
	// SuccessRatio counts every request but those failed in the all-down
	// phase.
	SuccessRatio float64 `json:"success_ratio"`
	// EventsLost: acknowledged creates an informer never saw, plus
	// objects in the apiserver an informer never saw.
	EventsLost int `json:"events_lost"`
	// InFlightAtStop: objects of the create each writer had in flight when
	// the load stopped (not recorded by the workload), which the informer
	// may not have seen before it stopped; not counted as lost.
	InFlightAtStop int `json:"in_flight_at_stop"`
	// Phantoms: objects an informer saw that the apiserver does not have.
	Phantoms int `json:"phantoms"`
	// Duplicates: logical creates (generateName, one operation id each)
	// that made more than one object.
	Duplicates int `json:"duplicates"`
	// AckedMissing: acknowledged creates the apiserver does not have.
	AckedMissing     int            `json:"acked_missing"`
	Relists          int            `json:"relists"`
	LeakedGoroutines int            `json:"leaked_goroutines"`
	LeakedFDs        int            `json:"leaked_fds"`
	MaxRSSBytes      int64          `json:"max_rss_bytes"`
	SecretsInLogs    int            `json:"secrets_in_logs"`
	ByPath           map[string]int `json:"operations_by_path"`
	// SuccessByPath is SuccessRatio per path.
	SuccessByPath map[string]float64 `json:"success_ratio_by_path"`
	// RetriedGets is, by path, the GETs client-go sent more than once
	// (getRetries) and how many of them were answered in the end: each
	// is a try that failed on a connection error, which the success
	// ratios do not show.
	RetriedGets map[string]Retried `json:"retried_gets"`
	// Violations are the invariants that failed: the soak fails.
	Violations []string `json:"violations"`
	// TargetsMissed are the paths below the success target in a soak
	// shorter than successEnforcedFrom: reported, the soak does not fail
	// on them (a longer one does: Violations).
	TargetsMissed []string `json:"targets_missed"`
	// Timeline is what timeline.svg draws (see WriteTimeline).
	Timeline Timeline `json:"timeline"`
	// Joins, CertFaults and Handovers are the figures of those faults
	// (faults_*.go); what they break is among Violations.
	Joins      []JoinReport   `json:"joins"`
	CertFaults []CertReport   `json:"cert_faults"`
	Handovers  HandoverReport `json:"handovers"`
	// LocalProxy is what was measured of the localproxy processes
	// (MaxRSSBytes and the leaks above are this process's: the clients).
	LocalProxy LocalProxyReport `json:"localproxy"`
	// Load is the CRUD workers, the caches, the bad input, the
	// EndpointSlice churn and the CPU (load.go).
	Load LoadReport `json:"load"`
}

// window is a fault as it happened.
type window struct {
	kind       Kind
	server     int // as Step.Server
	start, end time.Time
}

// run is one soak in progress.
type run struct {
	opts Options
	bed  *testbed.Bed
	say  func(format string, args ...any)
	logs syncBuffer // the clients' logs (localproxy's are files of their own)
	// proberBin is the kubelet-like /readyz prober (hack/chaos/prober).
	proberBin string
	// proxyBin is cmd/localproxy built with the race detector; lpBase
	// and lpEnd its goroutines and descriptors before the load and once
	// the clients stopped.
	proxyBin          string
	lpBaseG, lpBaseFD int
	lpEndG, lpEndFD   int
	// began is when the load started: the schedule's time zero.
	began time.Time
	// events are the paths' pool events.
	events eventLog
	// faults holds what joins, certificate faults and hand-overs need
	// and report.
	faults faultState
	// load is the load beyond the workloads (load.go), once it ran.
	load *load
}

// Run runs a soak and returns its summary; the error says which
// invariants failed (the summary is written either way when the soak got
// that far).
func Run(ctx context.Context, opts Options) (*Summary, error) {
	if opts.Duration <= 0 || opts.Out == "" || opts.Log == nil {
		return nil, errors.New("chaos: Duration, Out and Log are required")
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, err
	}
	began := time.Now()
	r := &run{opts: opts}
	r.say = func(format string, args ...any) {
		fmt.Fprintf(opts.Log, "%7.1fs  %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	plan := Plan(opts.Seed, opts.Duration, 3)
	replay := fmt.Sprintf("make chaos SEED=%d DURATION=%s", opts.Seed, opts.Duration)
	r.say("seed %d, %s (replay: %s); schedule, in seconds after the load starts:\n%s", opts.Seed, opts.Duration, replay, FormatPlan(plan))

	bindir, err := os.MkdirTemp("", "chaos-localproxy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bindir)
	r.say("building cmd/localproxy with the race detector, and the /readyz prober")
	if r.proxyBin, err = testbed.GoBuild(ctx, bindir, "./cmd/localproxy", true); err != nil {
		return nil, err
	}
	if r.proberBin, err = testbed.GoBuild(ctx, bindir, "./hack/chaos/prober", false); err != nil {
		return nil, err
	}

	bopts := opts.Bed
	bopts.APIServers = 3
	if bopts.Log == nil {
		bopts.Log = io.Discard
	}
	bed, err := testbed.Start(ctx, bopts)
	if err != nil {
		return nil, err
	}
	defer bed.Close()
	r.bed = bed
	r.say("test bed up: %d kube-apiservers", len(bed.APIServers()))
	baseG, baseFD := runtime.NumGoroutine(), countFDs()

	s := &Summary{Seed: opts.Seed, Duration: opts.Duration.Seconds(), Schedule: plan, Replay: replay,
		Failures: map[string]int{classFault: 0, classAllDown: 0, classUnexplain: 0}, FailuresByFault: map[string]int{}, FailureSamples: map[string]string{}, FailureErrors: map[string]int{}, ByPath: map[string]int{}, RetriedGets: map[string]Retried{}}
	var violations []string
	violate := func(format string, args ...any) {
		v := fmt.Sprintf(format, args...)
		violations = append(violations, v)
		r.say("VIOLATION: %s", v)
	}

	results, windows, err := r.soak(ctx, plan)
	if err != nil {
		return nil, err
	}
	s.Timeline = r.timeline(results, windows)
	s.MaxFailoverSeconds = maxFailover(results, windows)

	// The truth: what the apiservers hold, read once every fault is gone.
	if err := bed.Heal(ctx); err != nil {
		return nil, fmt.Errorf("heal after the soak: %w", err)
	}
	cs, err := kubernetes.NewForConfig(bed.RESTConfig(testbed.Direct(1)))
	if err != nil {
		return nil, err
	}
	allDown := 0
	var total, failed int
	pathTotal, pathFailed := map[string]int{}, map[string]int{}
	// tally counts name's requests by path and classifies its failures.
	tally := func(name string, res workload.Results) {
		path := name[:strings.IndexByte(name, '-')]
		for _, rq := range res.Gets {
			if rq.Attempts > 1 {
				rt := s.RetriedGets[path]
				rt.GETs++
				if rq.OK() {
					rt.Answered++
				}
				s.RetriedGets[path] = rt
			}
		}
		for i, rq := range slices.Concat(res.Gets, res.Writes) {
			total++
			s.ByPath[path]++
			if rq.OK() {
				pathTotal[path]++
				continue
			}
			c, kind := classify(rq, windows)
			s.Failures[c]++
			switch c {
			case classAllDown:
				allDown++
				continue
			case classFault:
				key := string(kind) + "/" + path
				method := "GET"
				if i >= len(res.Gets) {
					method = "write"
				}
				s.FailureErrors[path+"/"+method+"/"+errorKind(rq.Err)]++
				if s.FailuresByFault[key]++; s.FailureSamples[key] == "" {
					s.FailureSamples[key] = rq.Err.Error()
				}
			case classUnexplain:
				r.say("unexplained failure on %s: %s..%s: %v", name, rq.Start.Format("15:04:05.000"), rq.End.Format("15:04:05.000"), rq.Err)
			}
			failed++
			pathTotal[path]++
			pathFailed[path]++
		}
	}
	for name, res := range results {
		ns := name
		if res.Synced.IsZero() {
			// No informer (kubectl, the CRUD workers): nothing seen to
			// compare; the workers' objects are checked in load.go.
			tally(name, res)
			continue
		}
		list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", ns, err)
		}
		// The writer creates one object at a time; the create in flight
		// when the load stopped is recorded nowhere (the workload does not
		// count a request it cancelled), may still have been made, and its
		// event may come after the informer stopped: not a lost event.
		lastSeq := 0
		for _, w := range res.Writes {
			lastSeq = max(lastSeq, w.Seq)
		}
		truth := map[string]bool{}
		inFlight := map[string]bool{}
		for _, cm := range list.Items {
			if cm.Name == "kube-root-ca.crt" {
				continue
			}
			truth[cm.Name] = true
			if seq, err := strconv.Atoi(cm.Labels[workload.SeqLabel]); err == nil && seq > lastSeq {
				inFlight[cm.Name] = true
			}
		}
		seen := map[string]bool{}
		for _, sg := range res.Seen {
			seen[sg.Name] = true
		}
		lost := len(res.Lost())
		for n := range truth {
			switch {
			case seen[n]:
			case inFlight[n]:
				s.InFlightAtStop++
			default:
				lost++
				r.say("lost: %s/%s exists in the apiserver, its informer never saw it", ns, n)
			}
		}
		phantoms := 0
		for n := range seen {
			if !truth[n] {
				phantoms++
			}
		}
		acked := 0
		for _, n := range res.Created() {
			if !truth[n] {
				acked++
			}
		}
		s.EventsLost += lost
		s.Phantoms += phantoms
		s.AckedMissing += acked
		s.Duplicates += len(res.Duplicates())
		s.Relists += res.Relists()
		tally(name, res)
	}
	s.Operations = total
	if n := total - allDown; n > 0 {
		s.SuccessRatio = float64(n-failed) / float64(n)
	}
	s.SuccessByPath = map[string]float64{}
	for path, n := range pathTotal {
		s.SuccessByPath[path] = float64(n-pathFailed[path]) / float64(n)
	}
	if s.EventsLost > 0 {
		violate("%d events lost (created but never seen by an informer)", s.EventsLost)
	}
	if s.Phantoms > 0 {
		violate("%d phantom objects in informer caches", s.Phantoms)
	}
	if s.Duplicates > 0 {
		violate("%d logical creates made more than one object", s.Duplicates)
	}
	if s.AckedMissing > 0 {
		violate("%d acknowledged creates missing from the apiserver", s.AckedMissing)
	}
	if n := s.Failures[classUnexplain]; n > 0 {
		violate("%d failures outside every fault window", n)
	}
	misses, enforced := successMisses(s.SuccessByPath, opts.Duration)
	for _, miss := range misses {
		miss += fmt.Sprintf(" (all-down phase excluded; fault-window failures %v)", s.FailuresByFault)
		if enforced {
			violate("%s", miss)
			continue
		}
		s.TargetsMissed = append(s.TargetsMissed, miss)
		r.say("TARGET MISSED (not enforced below %s): %s", successEnforcedFrom, miss)
	}
	// The localproxy processes have all exited (soak stopped the last):
	// their logs are complete, read once for the hand-overs and the
	// secrets.
	lpLogs := r.faults.lp.logs()
	for _, v := range r.reportFaults(s, results, windows, lpLogs) {
		violate("%s", v)
	}

	// Everything the soak started is stopped: back to the baseline.
	g, fd := settledCounts(baseG, baseFD)
	s.LeakedGoroutines, s.LeakedFDs = max(g-baseG, 0), max(fd-baseFD, 0)
	if s.LeakedGoroutines > leakSlack {
		violate("%d goroutines above the baseline of %d after the clients stopped", s.LeakedGoroutines, baseG)
	}
	if s.LeakedFDs > leakSlack {
		violate("%d file descriptors above the baseline of %d after the clients stopped", s.LeakedFDs, baseFD)
	}
	s.MaxRSSBytes = procStatusBytes(os.Getpid(), "VmHWM:")

	// localproxy, a process of its own: its memory, its races, how each
	// instance ended, and what the serving one held once the clients
	// stopped.
	s.LocalProxy = r.faults.lp.report()
	lr := &s.LocalProxy
	lr.BaselineGoroutines, lr.BaselineFDs = r.lpBaseG, r.lpBaseFD
	lr.LeakedGoroutines, lr.LeakedFDs = max(r.lpEndG-r.lpBaseG, 0), max(r.lpEndFD-r.lpBaseFD, 0)
	if r.lpEndG < 0 || r.lpEndFD < 0 {
		violate("localproxy's goroutines (/metrics) or descriptors (/proc) could not be read after the clients stopped")
	}
	for _, v := range lr.violations() {
		violate("%s", v)
	}
	if lr.Events == 0 {
		violate("no pool event read from localproxy's logs (%s): their format may have changed", strings.Join(lr.Logs, ", "))
	}

	logs := r.logs.String()
	if err := os.WriteFile(filepath.Join(opts.Out, "clients.log"), []byte(logs), 0o644); err != nil {
		return nil, err
	}
	for _, secret := range []string{bed.AdminToken(), bed.Token(testbed.LocalProxyIdentity)} {
		if secret != "" {
			s.SecretsInLogs += strings.Count(logs, secret) + strings.Count(lpLogs, secret)
		}
	}
	if s.SecretsInLogs > 0 {
		violate("a bearer token of the test bed appears %d times in the logs", s.SecretsInLogs)
	}
	if r.load != nil {
		s.Load = r.load.report
		s.Load.OperationIDs, s.Load.DuplicateOperationIDs, err = opIDs(ctx, cs)
		if err != nil {
			return nil, err
		}
		if s.Load.DuplicateOperationIDs > 0 {
			violate("%d operation ids labelled more than one object", s.Load.DuplicateOperationIDs)
		}
		for _, v := range r.load.violations {
			violate("%s", v)
		}
	}
	s.Violations = violations
	if err := WriteTimeline(s, filepath.Join(opts.Out, "timeline.svg")); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(opts.Out, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	r.say("failures in fault windows by fault and path: %v; by path, method and error: %v; first errors: %q", s.FailuresByFault, s.FailureErrors, s.FailureSamples)
	r.say("success by path (all-down phase excluded): %v; GETs client-go sent again (answered in the end): %v", s.SuccessByPath, s.RetriedGets)
	r.say("longest time without an answer in a fault window, by fault and path (s): %v", s.MaxFailoverSeconds)
	r.say("%d operations (%v), failures %v, success %.5f; lost %d, phantoms %d, duplicates %d, acked missing %d, relists %d; leaked goroutines %d, fds %d; max RSS %d MiB; secrets in logs %d",
		s.Operations, s.ByPath, s.Failures, s.SuccessRatio, s.EventsLost, s.Phantoms, s.Duplicates, s.AckedMissing, s.Relists,
		s.LeakedGoroutines, s.LeakedFDs, s.MaxRSSBytes>>20, s.SecretsInLogs)
	r.say("localproxy: %d instances, peak RSS %d MiB (bound %d MiB; by instance %v MiB), leaked goroutines %d (baseline %d), fds %d (baseline %d), data races %d, exits %v, %d pool events read from its logs",
		lr.Instances, lr.MaxRSS>>20, lr.RSSBound>>20, mib(lr.RSSByInstance), lr.LeakedGoroutines, lr.BaselineGoroutines, lr.LeakedFDs, lr.BaselineFDs, lr.DataRaces, lr.Exits, lr.Events)
	if len(violations) > 0 {
		return s, fmt.Errorf("chaos: %d invariants failed (%s):\n%s", len(violations), replay, strings.Join(violations, "\n"))
	}
	return s, nil
}

// soak starts the clients, runs the plan, stops the clients and returns
// their results by workload name (path-n) and the fault windows.
func (r *run) soak(ctx context.Context, plan []Step) (map[string]workload.Results, []window, error) {
	bed := r.bed
	log := funcr.New(func(prefix, args string) { r.logs.WriteString(prefix + " " + args + "\n") }, funcr.Options{Verbosity: 4})

	// The transport path.
	f, err := transport.Wrap(ctx, bed.RESTConfig(testbed.Origin), transport.Options{Logger: log.WithName("transport")})
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()

	// The localproxy path: cmd/localproxy, a process of its own; a
	// hand-over replaces the instance.
	lp, err := r.startLocalProxy(ctx, r.proxyBin)
	if err != nil {
		return nil, nil, err
	}
	defer lp.close()
	r.faults.tr, r.faults.lp = f, lp
	lcfg := bed.RESTConfig(testbed.LocalProxy)
	lhc, err := rest.HTTPClientFor(lcfg)
	if err != nil {
		return nil, nil, err
	}
	defer lhc.CloseIdleConnections()
	if err := waitHealthy(ctx, func() bool { st, ok := lp.status(); return ok && st.Ready && f.Pool().Healthy() }); err != nil {
		return nil, nil, err
	}
	// localproxy's baseline once its discovery (through itself) listed
	// every apiserver: its discovery connection is open.
	if err := waitFor(ctx, time.Minute, func() bool { return discovered(lp.poolStatus(), len(bed.APIServers())) }); err != nil {
		return nil, nil, fmt.Errorf("localproxy did not discover the apiservers: %w", err)
	}
	if err := waitFor(ctx, 10*time.Second, func() bool {
		r.lpBaseG, r.lpBaseFD = lp.counts(ctx)
		return r.lpBaseG >= 0 && r.lpBaseFD >= 0
	}); err != nil {
		return nil, nil, fmt.Errorf("localproxy's goroutines (/metrics) and descriptors (/proc) could not be read: %w", err)
	}
	defer f.Pool().Subscribe(notMadeUp(r.events.recorder(pathTransport)))()
	lp.setRecorder(notMadeUp(r.events.recorder(pathLocalProxy)))

	suffix := strconv.FormatInt(time.Now().Unix(), 36)
	ws := map[string]*workload.Workload{}
	for i := range workloadsPerWay {
		for _, way := range []struct {
			name string
			cfg  *rest.Config
			hc   *http.Client
		}{{pathTransport, f.Config(), f.HTTPClient()}, {pathLocalProxy, lcfg, lhc}} {
			name := fmt.Sprintf("%s-%d-%s", way.name, i+1, suffix)
			w, err := workload.Start(ctx, workload.Config{
				RESTConfig: way.cfg, HTTPClient: way.hc, Namespace: name, GenerateName: true, OpIDPrefix: name + "-",
				WriteInterval: workloadWrite, GetInterval: workloadGet, GetRetries: getRetries,
			})
			if err != nil {
				for _, w := range ws {
					w.Stop(ctx)
				}
				return nil, nil, fmt.Errorf("workload %s: %w", name, err)
			}
			ws[name] = w
		}
	}
	l, err := r.startLoad(ctx, f, map[string]clientPath{pathTransport: {f.Config(), f.HTTPClient()}, pathLocalProxy: {lcfg, lhc}}, log, suffix)
	if err != nil {
		for _, w := range ws {
			w.Stop(ctx)
		}
		return nil, nil, fmt.Errorf("load: %w", err)
	}
	r.load = l
	kubectlNS := fmt.Sprintf("%s-1-%s", pathKubectl, suffix)
	kl, err := r.startKubectl(ctx, kubectlNS)
	if err != nil {
		for _, w := range ws {
			w.Stop(ctx)
		}
		l.finish(ctx)
		return nil, nil, fmt.Errorf("kubectl loop: %w", err)
	}
	r.say("load: %d workloads (%d through transport.Wrap, %d through localproxy), each an informer, a generateName create every %s and a GET every %s; kubectl get through localproxy every %s; %s",
		len(ws), workloadsPerWay, workloadsPerWay, workloadWrite, workloadGet, kubectlEvery, l.describe())

	// The schedule's clock starts now, with the load.
	r.began = time.Now()
	l.startFaulted(ctx, r, f, lp, plan)
	windows, err := r.inject(ctx, plan, r.began)
	results := map[string]workload.Results{kubectlNS: {Gets: kl.wait()}}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopLimit)
	defer cancel()
	for name, w := range ws {
		results[name] = w.Stop(stopCtx)
	}
	for path, res := range l.finish(stopCtx) {
		results[fmt.Sprintf("%s-workers-%s", path, suffix)] = res
	}
	lhc.CloseIdleConnections()
	r.lpEndG, r.lpEndFD = lp.settledCounts(stopCtx, r.lpBaseG, r.lpBaseFD)
	if err != nil {
		return nil, nil, err
	}
	return results, windows, nil
}

// inject runs the plan: each step's fault from its time for its
// duration, then waits for the end of the soak.
func (r *run) inject(ctx context.Context, plan []Step, began time.Time) ([]window, error) {
	servers := r.bed.APIServers()
	var windows []window
	wait := func(until time.Duration) error {
		t := time.NewTimer(time.Until(began.Add(until)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	for _, st := range plan {
		if err := wait(st.At); err != nil {
			return windows, err
		}
		w := window{kind: st.Kind, server: st.Server, start: time.Now()}
		r.say("FAULT %s", strings.TrimSpace(st.String()))
		lift, err := r.fault(ctx, st, servers)
		if err != nil {
			return windows, fmt.Errorf("%v: %w", st, err)
		}
		if st.Kind == Join {
			w.server = r.faults.lastJoined()
		}
		if err := wait(st.End()); err != nil {
			return windows, err
		}
		if err := lift(); err != nil {
			return windows, fmt.Errorf("lifting %v: %w", st, err)
		}
		w.end = time.Now()
		windows = append(windows, w)
		r.say("lifted %s after %.1fs", st.Kind, w.end.Sub(w.start).Seconds())
	}
	return windows, wait(r.opts.Duration)
}

// fault injects st's fault and returns what lifts it.
func (r *run) fault(ctx context.Context, st Step, servers []*testbed.APIServer) (func() error, error) {
	switch st.Kind {
	case AllDown:
		for _, s := range servers {
			if err := s.Kill(); err != nil {
				return nil, err
			}
		}
		return func() error { return r.bed.Heal(ctx) }, nil
	case Join:
		return r.join(ctx)
	case Handover:
		return r.handover(ctx)
	}
	s := servers[st.Server]
	restore := s.Restore
	var err error
	switch st.Kind {
	case Kill:
		err = s.Kill()
		restore = func() error { return s.Restart(ctx) }
	case Hang:
		err = s.Hang()
		restore = s.Resume
	case Blackhole:
		err = s.Blackhole()
	case Reject:
		err = s.Reject()
	case Lossy:
		err = s.Lossy(0.2)
	case Slow:
		err = s.Slow(testbed.Slowness{})
		restore = s.Fast
	case Graceful:
		err = s.Terminate()
		restore = func() error { return s.Restart(ctx) }
	case MisnamedCert, NotYetValidCert:
		return r.certFault(ctx, st, s)
	default:
		err = fmt.Errorf("unknown fault %q", st.Kind)
	}
	return restore, err
}

// successMisses returns, by path in order, the success ratios below
// minSuccess, and whether a soak of duration d fails on them
// (successEnforcedFrom).
func successMisses(byPath map[string]float64, d time.Duration) (misses []string, enforced bool) {
	for _, path := range slices.Sorted(maps.Keys(byPath)) {
		if ratio := byPath[path]; ratio < minSuccess {
			misses = append(misses, fmt.Sprintf("%s: success ratio %.5f below the target %.3f", path, ratio, minSuccess))
		}
	}
	return misses, d >= successEnforcedFrom
}

// maxFailover returns, per fault kind and path ("hang/localproxy"), the
// longest stretch inside a window of that kind, from its start until
// failoverGrace after its end, in which one of the path's clients got no
// answer: how long it waited for the failover (the all-down phase: for
// the apiservers to come back), in seconds. The clients are the
// workloads (a GET every 50ms, a create every 100ms) and kubectl (once a
// second: it never waits less than that); the CRUD workers are left
// out, whose cycles of every 2s leave gaps of their own.
func maxFailover(results map[string]workload.Results, windows []window) map[string]float64 {
	out := map[string]float64{}
	for name, res := range results {
		if strings.Contains(name, "-workers-") {
			continue
		}
		path := name[:strings.IndexByte(name, '-')]
		var ts []time.Time
		for _, rq := range slices.Concat(res.Gets, res.Writes) {
			if rq.OK() {
				ts = append(ts, rq.End)
			}
		}
		if len(ts) == 0 {
			continue
		}
		slices.SortFunc(ts, time.Time.Compare)
		for _, w := range windows {
			to := w.end.Add(failoverGrace)
			if last := ts[len(ts)-1]; last.Before(to) {
				to = last // the load stopped
			}
			if to.Before(w.start) {
				continue
			}
			longest, prev := time.Duration(0), w.start
			i, _ := slices.BinarySearchFunc(ts, w.start, time.Time.Compare)
			for ; i < len(ts) && !ts[i].After(to); i++ {
				longest, prev = max(longest, ts[i].Sub(prev)), ts[i]
			}
			longest = max(longest, to.Sub(prev))
			key := string(w.kind) + "/" + path
			out[key] = max(out[key], seconds(longest))
		}
	}
	return out
}

// classify says why a failed request failed: it overlapped the all-down
// phase, another fault's window (plus the grace after it; kind is the
// fault's), or neither.
func classify(rq workload.Request, windows []window) (class string, kind Kind) {
	class = classUnexplain
	for _, w := range windows {
		if rq.End.Before(w.start) || rq.Start.After(w.end.Add(failoverGrace)) {
			continue
		}
		if w.kind == AllDown {
			return classAllDown, AllDown
		}
		class, kind = classFault, w.kind
	}
	return class, kind
}

func waitHealthy(ctx context.Context, ok func() bool) error {
	if err := waitFor(ctx, time.Minute, ok); err != nil {
		return fmt.Errorf("clients not healthy: %w", err)
	}
	return nil
}

// settledCounts returns the goroutine and fd counts of this process once
// they stop falling towards (g, fd) (or after 15s): goroutines of closed
// connections take a moment to go.
func settledCounts(g, fd int) (int, int) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ng, nfd := runtime.NumGoroutine(), countFDs()
		if (ng <= g+leakSlack && nfd <= fd+leakSlack) || time.Now().After(deadline) {
			return ng, nfd
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countFDs() int { return len(fdLinks(os.Getpid())) }

// mib is each of b in MiB.
func mib(b []int64) []int64 {
	out := make([]int64, len(b))
	for i, v := range b {
		out[i] = v >> 20
	}
	return out
}

// syncBuffer is a strings.Builder safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) WriteString(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(v)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// errorKind names the kind of a request's error by what its message
// says; client-go sends a GET again after "EOF", "reset" and "lost"
// (IsProbableEOF, IsConnectionReset, IsHTTP2ConnectionLost), not after
// "force closed".
func errorKind(err error) string {
	if err == nil {
		return "none"
	}
	msg := err.Error()
	for _, k := range []struct{ kind, in string }{
		{"force closed", "client connection force closed"},
		{"lost", "client connection lost"},
		{"reset", "connection reset"},
		{"refused", "connection refused"},
		{"EOF", "EOF"},
		{"broken pipe", "broken pipe"},
		{"429", "too many requests"},
		{"timeout", "deadline exceeded"},
		{"timeout", "Timeout"},
		{"timeout", "timeout"},
	} {
		if strings.Contains(msg, k.in) {
			return k.kind
		}
	}
	return "other"
}
