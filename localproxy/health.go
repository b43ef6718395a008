package localproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/apifailover/apifailover/transport/upstream"
)

// Status is the JSON document served on /status.
type Status struct {
	// Origin is the API server name clients use.
	Origin string `json:"origin"`
	// PID is the process that answered. During a hand-over two processes
	// share the health port (SO_REUSEPORT) and either may answer.
	PID int `json:"pid"`
	// Ready: at least one endpoint is healthy and the proxy is not
	// shutting down.
	Ready bool `json:"ready"`
	// ShuttingDown: the listeners are closed and connections drain.
	ShuttingDown bool     `json:"shuttingDown"`
	Listeners    []string `json:"listeners"`
	// Zone is the proxy's own topology zone: API servers in it are
	// preferred after local ones. Empty: none.
	Zone string `json:"zone,omitempty"`
	// ZoneSource says where Zone came from: config, node (the Node's
	// topology.kubernetes.io/zone label) or none.
	ZoneSource string `json:"zoneSource"`
	// Node is the Node whose label the zone is learned from, if any
	// (Config.NodeName).
	Node string `json:"node,omitempty"`
	// ZoneProblem says why the Node's last read learned no zone: it
	// could not be read (RBAC, not found, no API server) or has no label.
	ZoneProblem string `json:"zoneProblem,omitempty"`
	// ActiveConnections is the number of open client connections.
	ActiveConnections int64 `json:"activeConnections"`
	// Upstreams lists every endpoint in candidate order (best first).
	Upstreams []UpstreamStatus `json:"upstreams"`
	// Removed lists endpoints that left the pool while client connections
	// to them are still open: drained until the server closes them or
	// their deadline passes.
	Removed []RemovedUpstream `json:"removed,omitempty"`
}

// RemovedUpstream is an endpoint no longer in the pool that still has
// connections.
type RemovedUpstream struct {
	Addr  string `json:"addr"`
	Conns int    `json:"conns"`
	// CloseBy is when the proxy closes what is left (zero: closing now).
	CloseBy time.Time `json:"closeBy,omitzero"`
}

// UpstreamStatus is one endpoint in /status: upstream.Status with its
// sources and state as strings, so that the document decodes too.
type UpstreamStatus struct {
	upstream.Status
	// Sources as in upstream.Source.String, e.g. "static,discovery".
	Sources string `json:"sources"`
	// State as in upstream.State.String, e.g. "healthy".
	State string `json:"state"`
}

// Status returns what /status serves.
func (p *Proxy) Status() Status {
	s := Status{
		Origin:            p.cfg.Origin,
		PID:               os.Getpid(),
		Ready:             p.isReady(),
		ShuttingDown:      p.stopping.Load(),
		ActiveConnections: p.active.Load(),
	}
	s.Zone = p.pool.Zone()
	switch {
	case p.cfg.Pool.Zone != "":
		s.ZoneSource = ZoneFromConfig
	case p.zone != nil:
		s.Node, s.ZoneSource, s.ZoneProblem = p.cfg.NodeName, zoneSource(s.Zone, ZoneFromNode), p.zone.status()
	default:
		s.ZoneSource = ZoneFromNone
	}
	inPool := make(map[string]bool)
	for _, u := range p.pool.Status() {
		inPool[u.Addr] = true
		s.Upstreams = append(s.Upstreams, UpstreamStatus{Status: u, Sources: u.Sources.String(), State: u.State.String()})
	}
	s.Removed = p.removedUpstreams(inPool)
	for _, a := range p.Addrs() {
		s.Listeners = append(s.Listeners, a.String())
	}
	return s
}

func (p *Proxy) isReady() bool { return !p.stopping.Load() && p.pool.Healthy() }

// errNotRunning is Live's error before the proxy listens.
var errNotRunning = errors.New("not running yet: the listeners are not bound")

// Live reports what /healthz does: nil while every accept loop runs and
// accepts (or has failed for less than acceptStuckAfter) and the pool's
// probe loop ran recently (started a round or a probe: a round with
// nothing due, every endpoint quarantined and waiting for its re-probe,
// counts); otherwise an error that says what is wrong. Before Ready it
// reports that the proxy does not run yet. Whether an API server is
// healthy does not count: a proxy restarted for that would fail the
// same way, and its clients would lose their connections.
func (p *Proxy) Live() error {
	select {
	case <-p.ready:
	default:
		return errNotRunning
	}
	return p.live(p.runAt)
}

// live is Live once the proxy runs.
func (p *Proxy) live(startedAt time.Time) error {
	if n, want := int(p.accepting.Load()), len(p.cfg.ListenAddresses); n < want && !p.stopping.Load() {
		return fmt.Errorf("%d of %d accept loops running", n, want)
	}
	if err := p.stuckAccepting(time.Now()); err != nil {
		return err
	}
	if p.cfg.Pool.Prober == nil || p.cfg.LivenessThreshold < 0 {
		return nil
	}
	every, stale := livenessThreshold(p.probeSchedule, p.cfg.LivenessThreshold)
	last := p.pool.LastProbeActivity()
	if last.IsZero() {
		last = startedAt
	}
	age := time.Since(last)
	if age > stale {
		return fmt.Errorf("no health probe for %v (expected every %v; liveness threshold %v)", age.Round(time.Millisecond), every, stale)
	}
	return nil
}

// probeRoundsEvery is the longest the pool's probe loop waits between
// two rounds, jitter aside: its QuietInterval while every endpoint is
// quiet (the held prober's 5s), if that is longer than its Interval.
func probeRoundsEvery(pc upstream.Config) time.Duration {
	return max(pc.Interval, pc.QuietInterval)
}

// LivenessThresholdError is New's error for a Config.LivenessThreshold
// that the probe loop's own pace would pass: /healthz would fail between
// two rounds of a healthy pool, and the node's liveness probe restart a
// proxy that is fine.
type LivenessThresholdError struct {
	// Threshold is the Config's; Least what it must be more than.
	Threshold, Least time.Duration
	// Why says where Least comes from.
	Why string
}

func (e *LivenessThresholdError) Error() string {
	return fmt.Sprintf("localproxy: LivenessThreshold %v: want more than %v (%s)", e.Threshold, e.Least, e.Why)
}

// CheckLivenessThreshold returns the *LivenessThresholdError New would
// return for cfg, or nil, for a command that names its own flag before it
// starts; cfg's other problems are New's to report.
func CheckLivenessThreshold(cfg Config) error {
	if cfg.LivenessThreshold <= 0 {
		return nil
	}
	cfg.Endpoints = append([]string(nil), cfg.Endpoints...)
	if cfg.setDefaults() != nil {
		return nil
	}
	pool, err := upstream.New(cfg.Pool)
	if err != nil {
		return nil
	}
	return checkLivenessThreshold(pool.Config(), cfg.LivenessThreshold)
}

// checkLivenessThreshold refuses a threshold not above the probe loop's
// longest wait between rounds (jitter included) plus a probe's timeout.
func checkLivenessThreshold(pc upstream.Config, threshold time.Duration) error {
	if threshold <= 0 || pc.Prober == nil {
		return nil
	}
	every := probeRoundsEvery(pc)
	jitter := max(pc.Jitter, 0)
	longest := every + time.Duration(jitter*float64(every))
	if threshold > longest+pc.Timeout {
		return nil
	}
	why := fmt.Sprintf("the health-check loop starts a round every %v ±%.0f%%", pc.Interval, jitter*100)
	if every > pc.Interval {
		why = fmt.Sprintf("the health-check loop starts a round every %v ±%.0f%% while every API server is healthy, every %v otherwise", every, jitter*100, pc.Interval)
	}
	return &LivenessThresholdError{Threshold: threshold, Least: longest + pc.Timeout, Why: why + fmt.Sprintf(", and a probe may take %v", pc.Timeout)}
}

// livenessThreshold is how often the pool's probe loop starts a round at
// least, and how long /healthz lets it go silent: threshold if set,
// otherwise three of its longest waits plus a probe's timeout. A default
// from Interval alone failed /healthz for the last 1.5s of each quiet
// 5s round of the held prober.
func livenessThreshold(pc upstream.Config, threshold time.Duration) (every, stale time.Duration) {
	every = probeRoundsEvery(pc)
	if threshold > 0 {
		return every, threshold
	}
	return every, 3*every + pc.Timeout
}

// newHealthServer serves /healthz, /readyz, /metrics and /status, GET and
// HEAD only, with the timeouts and sizes of healthcap.go.
func (p *Proxy) newHealthServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := p.live(p.runAt); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case p.stopping.Load():
			http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
		case !p.pool.Healthy():
			http.Error(w, "not ready: no healthy endpoint", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(p.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(p.Status())
	})
	if p.cfg.Profiling {
		handleProfiling(mux)
	}
	return &http.Server{
		Handler:           healthRequests(mux),
		ReadHeaderTimeout: p.cfg.health.readHeaderTimeout,
		ReadTimeout:       healthReadTimeout,
		WriteTimeout:      healthWriteTimeout,
		IdleTimeout:       healthIdleTimeout,
		MaxHeaderBytes:    healthMaxHeaderBytes,
		// "OPTIONS *" goes to healthRequests (405) too, instead of
		// net/http's answer, which reads the request body.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     nil,
	}
}

// healthAllow lists the methods the health server answers.
const healthAllow = "GET, HEAD, OPTIONS"

// healthRequests answers 405 with an Allow header to methods other than
// GET, HEAD and OPTIONS, and reads no request body: a request that has one
// (nothing served here wants it) is answered and its connection closed,
// where net/http would read up to 256 KiB of it first to keep the
// connection. OPTIONS is answered like HEAD, with the status GET would
// have and an Allow header: HAProxy's "option httpchk" checks with OPTIONS
// by default, and extractedprism answered it. "OPTIONS *" gets 200.
func healthRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			w.Header().Set("Connection", "close")
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodOptions:
			w.Header().Set("Allow", healthAllow)
			if r.RequestURI == "*" {
				w.WriteHeader(http.StatusOK)
				return
			}
			r = r.Clone(r.Context())
			r.Method = http.MethodHead
			w = bodiless{w}
		default:
			w.Header().Set("Allow", healthAllow)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bodiless drops the body of an answer to OPTIONS, which net/http would
// send (it drops only a HEAD request's).
type bodiless struct{ http.ResponseWriter }

func (b bodiless) Write(p []byte) (int, error) { return len(p), nil }

// serveHealth serves srv on ln until ctx is done, then shuts it down.
// A local process must not exhaust the proxy's file descriptors through
// the health port: beyond the cap (HealthMaxConnections), connections are
// closed as soon as they are accepted; those within it are closed by the
// server's timeouts when they dawdle.
func (p *Proxy) serveHealth(ctx context.Context, srv *http.Server, ln net.Listener) {
	cl := newCapListener(ln, HealthMaxConnections, p.m.healthActive, p.m.healthRejected, p.m.healthEvicted, p.log)
	srv.ConnState = cl.connState
	ln = cl
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			p.log.Error(err, "health server stopped")
		}
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	<-errc
}
