package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/apifailover/apifailover/hack/plots"
	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
)

// fault is one failure injected into the apiserver serving a path.
type fault struct {
	name    string
	what    string
	inject  func(*testbed.APIServer) error
	restore func(context.Context, *testbed.APIServer) error
	// graceful: the server goes on answering for a while after the fault
	// (see answeredElsewhere).
	graceful bool
}

var allFaults = []fault{
	{name: "kill", what: "SIGKILL",
		inject:  (*testbed.APIServer).Kill,
		restore: restart},
	{name: "hang", what: "SIGSTOP (connections accepted, nothing answers)",
		inject:  (*testbed.APIServer).Hang,
		restore: func(_ context.Context, s *testbed.APIServer) error { return s.Resume() }},
	{name: "blackhole", what: "iptables DROP both ways",
		inject:  (*testbed.APIServer).Blackhole,
		restore: func(_ context.Context, s *testbed.APIServer) error { return s.Restore() }},
	{name: "graceful", what: "SIGTERM: /readyz fails, serves 2s more, exits",
		inject: (*testbed.APIServer).Terminate,
		// Restart waits for the exit, then starts it again.
		restore:  restart,
		graceful: true},
}

func restart(ctx context.Context, s *testbed.APIServer) error { return s.Restart(ctx) }

// Failover timings.
const (
	// connsSampleAfter is when the connections still open to the faulted
	// apiserver are counted.
	connsSampleAfter = 10 * time.Second
	// afterResume is how long the load runs once the path has resumed.
	afterResume = time.Second
	// directWindow bounds the observation of the direct path, which has
	// nowhere to fail over to.
	directWindow = 20 * time.Second
	// catchUp bounds the wait for the informer to see every created
	// object when the load stops.
	catchUp = 15 * time.Second
	// settleLimit bounds the waits for a path and its load to settle.
	settleLimit = 40 * time.Second
)

// FailoverRow is one fault on one path in the results. Times are seconds
// after the fault; nil means it did not happen within the window.
type FailoverRow struct {
	Fault  string `json:"fault"`
	Path   string `json:"path"`
	Victim string `json:"victim"`
	// MarkedDown is when the path's health view counted the victim down
	// (nil: never, or no health view: nginx and direct have none).
	MarkedDown *float64 `json:"marked_down_s"`
	HasHealth  bool     `json:"has_health_view"`
	// FirstGetElsewhere is when the first GET sent after the fault was
	// answered by another apiserver (see answeredElsewhere).
	FirstGetElsewhere *float64 `json:"first_get_elsewhere_s"`
	// LongestGetGap is the longest time without a successful GET between
	// the fault and the end of the window: how long the client was blind.
	LongestGetGap float64 `json:"longest_get_gap_s"`
	// InformerResume is when the informer first saw an object created
	// after the fault.
	InformerResume *float64 `json:"informer_resume_s"`
	Gets           int      `json:"gets"`
	GetsFailed     int      `json:"gets_failed"`
	// GetsSkipped counts GET ticks dropped while 64 GETs were stuck.
	GetsSkipped   int `json:"gets_skipped"`
	Creates       int `json:"creates"`
	CreatesFailed int `json:"creates_failed"`
	// Relists counts the informer's lists after the fault (0: its watch
	// resumed from its resource version).
	Relists int `json:"relists"`
	// EventsLost counts created objects the informer had not seen 15s
	// after the load stopped.
	EventsLost int `json:"events_lost"`
	// ConnsToVictim counts the path's connections to the faulted
	// apiserver that were open at the fault and still are (established or
	// half-closed by the server) 10s later: client connections for the
	// in-process paths, the proxy's upstream connections for the proxies.
	// ConnsToVictimAll counts every open one, including connections opened
	// after the fault (a proxy's health checks, new client connections
	// sent to the faulted server).
	ConnsToVictim    int `json:"conns_to_victim_at_10s"`
	ConnsToVictimAll int `json:"conns_to_victim_at_10s_all"`
	// Window is the longest the run would observe; Observed how long it
	// did (until the client resumed and the path marked the victim down).
	Window   float64 `json:"window_s"`
	Observed float64 `json:"observed_s"`
	Error    string  `json:"error,omitempty"`
	// samples are the run's requests for its chart (charts.go).
	samples []plots.Sample
}

func secs(d time.Duration) *float64 {
	v := round(d.Seconds(), 3)
	return &v
}

// waitUntil polls cond every 100ms until it holds, ctx ends or limit
// passes.
func waitUntil(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return true
}

// runFailover runs the workload through a fresh instance of path, injects
// f into the apiserver it uses, observes, stops the load and restores the
// apiserver. A returned error means nothing could be measured.
func runFailover(ctx context.Context, e *env, path string, f fault, window time.Duration, say func(string, ...any)) (row FailoverRow, err error) {
	row = FailoverRow{Fault: f.name, Path: path}
	if err := e.bed.Heal(ctx); err != nil {
		return row, fmt.Errorf("heal before the run: %w", err)
	}
	p, err := startPath(ctx, e, path, filepath.Join(e.dir, "failover", f.name, path))
	if err != nil {
		return row, fmt.Errorf("start %s: %w", path, err)
	}
	defer p.close()
	if !waitUntil(ctx, settleLimit, p.settled) {
		return row, fmt.Errorf("%s did not count every apiserver healthy within %s", path, settleLimit)
	}
	p.markBaseline()

	byAddr := make(map[string]*testbed.APIServer)
	for _, s := range e.bed.APIServers() {
		byAddr[s.Addr()] = s
	}
	began := time.Now()
	w, err := workload.Start(ctx, workload.Config{
		RESTConfig: p.config,
		HTTPClient: p.httpClient,
		Namespace:  "failover-" + f.name + "-" + path,
		Serving:    p.serving,
	})
	if err != nil {
		return row, fmt.Errorf("workload: %w", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			w.Stop(sctx)
			cancel()
		}
	}()
	// Steady: GETs and the informer work, and the traffic has stayed on
	// one apiserver for a second.
	var last string
	var lastSince time.Time
	steady := waitUntil(ctx, settleLimit, func() bool {
		r := w.Snapshot()
		_, get := r.FirstGetOK(began)
		_, seen := r.FirstSeenWrite(began)
		s := p.serving()
		if s != last {
			last, lastSince = s, time.Now()
		}
		return get && seen && byAddr[s] != nil && time.Since(lastSince) >= time.Second
	})
	if !steady {
		return row, fmt.Errorf("no steady load within %s (serving %q)", settleLimit, p.serving())
	}
	victim := byAddr[p.serving()]
	row.Victim = victim.Addr()
	if path == pathDirect {
		window = min(window, directWindow)
	}
	row.Window = window.Seconds()

	stale := p.openConns(victim.Addr())
	if err := f.inject(victim); err != nil {
		return row, fmt.Errorf("inject %s into %s: %w", f.name, victim.Name(), err)
	}
	t0 := time.Now()
	say("  %-9s %-10s %s on %s (serving)", f.name, path, f.what, victim.Addr())
	sampled := false
	var resumedAt time.Time
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Now()
		if row.MarkedDown == nil {
			if down, known := p.down(victim.Addr()); known {
				row.HasHealth = true
				if down {
					row.MarkedDown = secs(now.Sub(t0))
				}
			}
		}
		if !sampled && now.Sub(t0) >= connsSampleAfter {
			now := p.openConns(victim.Addr())
			row.ConnsToVictimAll = len(now)
			for id := range now {
				if stale[id] {
					row.ConnsToVictim++
				}
			}
			sampled = true
		}
		if resumedAt.IsZero() {
			r := w.Snapshot()
			_, seen := r.FirstSeenWrite(t0)
			if _, ok := firstGetElsewhere(r, t0, victim.Addr(), f.graceful, byAddr); ok && seen {
				resumedAt = now
			}
		}
		// Done once the client resumed and the path's health view (if it
		// has one) counts the victim down: how long a proxy keeps the
		// dead server in rotation is part of the answer.
		if sampled && !resumedAt.IsZero() && now.Sub(resumedAt) >= afterResume && (row.MarkedDown != nil || !row.HasHealth) {
			break
		}
		if now.Sub(t0) >= window && sampled {
			break
		}
		if p.exited() {
			return row, fmt.Errorf("%s exited during the run", path)
		}
		select {
		case <-ctx.Done():
			return row, ctx.Err()
		case <-tick.C:
		}
	}
	end := time.Now()
	row.Observed = round(end.Sub(t0).Seconds(), 1)
	sctx, cancel := context.WithTimeout(ctx, catchUp)
	r := w.Stop(sctx)
	cancel()
	stopped = true
	row.samples = requestSamples(r, t0)

	if t, ok := firstGetElsewhere(r, t0, victim.Addr(), f.graceful, byAddr); ok {
		row.FirstGetElsewhere = secs(t.Sub(t0))
	}
	if t, ok := r.FirstSeenWrite(t0); ok {
		row.InformerResume = secs(t.Sub(t0))
	}
	row.LongestGetGap = round(r.LongestGetGap(t0, end).Seconds(), 3)
	for _, q := range r.Gets {
		if !q.End.Before(t0) {
			row.Gets++
			if !q.OK() {
				row.GetsFailed++
			}
		}
	}
	for _, q := range r.Writes {
		if !q.End.Before(t0) {
			row.Creates++
			if !q.OK() {
				row.CreatesFailed++
			}
		}
	}
	row.GetsSkipped = r.SkippedGets
	row.Relists = r.ListsSince(t0)
	row.EventsLost = len(r.Lost())

	p.close()
	if err := f.restore(ctx, victim); err != nil {
		return row, fmt.Errorf("restore %s: %w", victim.Name(), err)
	}
	return row, nil
}

// firstGetElsewhere returns when the first GET sent at or after t0 was
// answered by an apiserver other than victim. Where the client reports
// the apiserver (direct, transport) that decides. Through a proxy it is
// known only for faults that leave the victim unable to answer (kill,
// hang, blackhole): any success is elsewhere. For a graceful shutdown the
// victim keeps answering for a while, so the proxy's serving apiserver
// when the GET ended decides.
func firstGetElsewhere(r workload.Results, t0 time.Time, victim string, graceful bool, servers map[string]*testbed.APIServer) (time.Time, bool) {
	var first time.Time
	for _, q := range r.Gets {
		if !q.OK() || q.Start.Before(t0) {
			continue
		}
		switch {
		case servers[q.Endpoint] != nil:
			if q.Endpoint == victim {
				continue
			}
		case graceful:
			if q.Serving == "" || q.Serving == victim {
				continue
			}
		}
		if first.IsZero() || q.End.Before(first) {
			first = q.End
		}
	}
	return first, !first.IsZero()
}
