package upstream

import (
	"github.com/apifailover/apifailover/internal/monotime"

	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Prober checks one endpoint. It must return when ctx is done. Errors caused
// by a certificate that does not verify should wrap ErrCertificate, those
// caused by its validity period only ErrCertificateTime. A success lifts a
// quarantine, so a Prober that can see certificates must verify them.
type Prober interface {
	Probe(ctx context.Context, addr string) error
}

// RTTProber is a Prober that can tell the round trip to the endpoint
// better than the probe's duration, e.g. from PINGs on a held connection
// when the probe itself sent nothing. A zero round trip means it does not
// know: the pool then times the probe, as for any Prober.
type RTTProber interface {
	Prober
	ProbeRTT(ctx context.Context, addr string) (time.Duration, error)
}

// ProberFunc adapts a function to the Prober interface.
type ProberFunc func(ctx context.Context, addr string) error

// Probe calls f(ctx, addr).
func (f ProberFunc) Probe(ctx context.Context, addr string) error { return f(ctx, addr) }

// Defaults for Config fields left zero.
const (
	DefaultInterval = time.Second
	DefaultTimeout  = time.Second
	DefaultRise     = 2
	DefaultFall     = 2
	DefaultJitter   = 0.1

	DefaultQuarantineBackoff    = 5 * time.Second
	DefaultQuarantineBackoffMax = 30 * time.Second
	DefaultMaxConcurrentProbes  = 32
)

// Config configures a Pool. The zero value is usable: no active probes (only
// passive signals), defaults for everything else.
type Config struct {
	// Prober runs the active health checks. If nil, the pool relies on
	// passive signals only and Run just waits for its context.
	Prober Prober
	// Interval between probe rounds. If zero, DefaultInterval (1s).
	Interval time.Duration
	// QuietInterval, if longer than Interval, is the interval between
	// rounds while every endpoint is healthy with no failure counted, not
	// suspect, draining or slow: for a Prober that reports what it sees
	// between probes as it happens (endpoint.ProbeHeld's held
	// connections, through ReportFailure, which kicks a round), rounds
	// every Interval would only confirm what it already reports, and
	// each wakes the client. Any other state brings rounds back to every
	// Interval. If zero, Interval.
	QuietInterval time.Duration
	// Timeout for one probe. If zero, DefaultTimeout (1s). Must not exceed
	// Interval.
	Timeout time.Duration
	// Jitter spreads probe rounds by ±Jitter×Interval. If zero,
	// DefaultJitter (0.1). If negative, no jitter.
	Jitter float64
	// Rise is how many consecutive successes make an unhealthy endpoint
	// healthy again. If zero, DefaultRise (2). An endpoint that was never
	// probed becomes healthy on its first success.
	Rise int
	// Fall is how many consecutive failures make a healthy endpoint
	// unhealthy. If zero, DefaultFall (2). An endpoint that was never
	// probed becomes unhealthy on its first failure.
	Fall int
	// QuarantineBackoff is how long a quarantined endpoint waits for its
	// first re-probe; each failed re-probe doubles the wait, up to
	// QuarantineBackoffMax, each wait spread by ±Jitter. An endpoint
	// quarantined again within QuarantineBackoffMax of leaving quarantine
	// goes on from its last wait (doubled) instead of starting over, so
	// that a certificate failure seen only on real traffic cannot make it
	// flip every interval. If zero, DefaultQuarantineBackoff (5s).
	QuarantineBackoff time.Duration
	// QuarantineBackoffMax caps the wait between re-probes of a
	// quarantined endpoint. If zero, DefaultQuarantineBackoffMax (30s), or
	// QuarantineBackoff if that is longer.
	QuarantineBackoffMax time.Duration
	// MaxConcurrentProbes caps how many probes of a round run at once, so
	// that a pool of thousands of endpoints does not open thousands of
	// connections at the same moment; the round then takes longer, while
	// every probe keeps its own Timeout. With fewer endpoints than the cap
	// all probes of a round start together. If zero,
	// DefaultMaxConcurrentProbes (32). If negative, no cap.
	MaxConcurrentProbes int
	// Zone is the topology zone of this client; endpoints in the same zone
	// are preferred after local ones. If empty, zones are ignored.
	Zone string
	// IsLocal reports whether a host (IP address or name, without port) is
	// this machine. If nil, IP addresses assigned to this host's
	// interfaces count as local (not those of kube-ipvs0, kube-proxy's
	// ClusterIPs), as they are when Run reads them again. Run, with a
	// Prober, asks it again for every endpoint every 30s, between two
	// rounds of probes: it must return quickly. An answer that changed
	// counts once two of those in a row agree.
	IsLocal func(host string) bool
	// Logger receives state changes (V(0)) and probe results (V(4)). The
	// zero value discards.
	Logger logr.Logger
}

func (c *Config) setDefaults() error {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = min(DefaultTimeout, c.Interval)
	}
	if c.Jitter == 0 {
		c.Jitter = DefaultJitter
	}
	if c.Jitter < 0 {
		c.Jitter = 0
	}
	if c.Rise == 0 {
		c.Rise = DefaultRise
	}
	if c.Fall == 0 {
		c.Fall = DefaultFall
	}
	if c.QuarantineBackoff == 0 {
		c.QuarantineBackoff = DefaultQuarantineBackoff
	}
	if c.QuarantineBackoffMax == 0 {
		c.QuarantineBackoffMax = max(DefaultQuarantineBackoffMax, c.QuarantineBackoff)
	}
	if c.MaxConcurrentProbes == 0 {
		c.MaxConcurrentProbes = DefaultMaxConcurrentProbes
	}
	switch {
	case c.Interval < 0:
		return fmt.Errorf("upstream: interval %v must be positive", c.Interval)
	case c.Timeout < 0 || c.Timeout > c.Interval:
		return fmt.Errorf("upstream: timeout %v must be positive and at most the interval %v", c.Timeout, c.Interval)
	case !(c.Jitter < 1): // also NaN
		return fmt.Errorf("upstream: jitter %v must be below 1", c.Jitter)
	case c.Rise < 1:
		return fmt.Errorf("upstream: rise %d must be at least 1", c.Rise)
	case c.Fall < 1:
		return fmt.Errorf("upstream: fall %d must be at least 1", c.Fall)
	case c.QuarantineBackoff < 0:
		return fmt.Errorf("upstream: quarantine backoff %v must be positive", c.QuarantineBackoff)
	case c.QuarantineBackoffMax < c.QuarantineBackoff:
		return fmt.Errorf("upstream: quarantine backoff max %v must be at least the quarantine backoff %v", c.QuarantineBackoffMax, c.QuarantineBackoff)
	}
	return nil
}

// Pool holds the endpoints, their health and the order to try them in. It is
// safe for concurrent use. Start its probes with Run.
type Pool struct {
	cfg Config
	// readLocal reads this host's addresses again, before Run asks
	// IsLocal again; set with the default IsLocal, nil with the caller's.
	readLocal func()
	seed      maphash.Seed
	kick      chan struct{}
	// active is when the probe loop last started a round or a probe, in
	// Unix nanoseconds; zero before the first round.
	active atomic.Int64

	// mu guards the fields below and every endpoint's fields. It is the
	// innermost lock: while holding it the pool calls no code outside this
	// package but its Logger (which must not call back into the pool). It
	// is released before subscribers run (flush), before probes run
	// (probeRound copies the jobs out) and before Config.IsLocal runs (Set
	// calls it first). Callers may hold locks of their own while they call
	// the pool, with one exception: Set, ResetQuarantine, ReportSuccess,
	// ReportFailure and ReportDialRace (and Pick and Candidates when a slow
	// demotion ran out) deliver the events they cause on the calling
	// goroutine, so their callers must not hold a lock that a subscriber
	// takes.
	mu sync.Mutex
	// eps holds every endpoint by canonical address.
	eps map[string]*endpoint
	// order is eps sorted best first; rebuilt when dirty.
	order     []*endpoint
	dirty     bool
	preferred string
	pending   []Event
	// delivering is set while one goroutine delivers pending events; others
	// leave their events to it, which keeps the order.
	delivering bool
	subs       map[int]func(Event)
	nextSub    int
	// slowNext is the earliest end of a slow demotion (zero if none).
	slowNext time.Time
}

// endpoint is the pool's record of one address. Guarded by Pool.mu.
type endpoint struct {
	addr    string
	host    string
	zone    string
	sources Source
	local   bool
	// localChanged: the last read of locality (Pool.refreshLocal) said
	// the other answer than local; the next one that says it too
	// changes local.
	localChanged bool
	tie          uint64
	state        State
	succ         int
	fail         int
	suspect      bool
	draining     bool
	rtt          time.Duration
	tier         int // RTT tier of rtt, with hysteresis; see setRTTLocked
	conns        int
	waiting      int // see AddWaiting
	stalled      int // see AddStalled
	// suspectGen counts the times the endpoint became suspect, so that a
	// probe's success lifts only a suspicion it was asked for (see
	// Suspected).
	suspectGen uint64
	lastErr    error
	since      time.Time
	// Dial races (see slow.go): consecutive races lost as the first
	// candidate, the current demotion's length, and when it ends (zero
	// when not demoted).
	racesLost int
	slowHold  time.Duration
	slowUntil time.Time

	// Quarantine backoff (see Config.QuarantineBackoff). qGen counts the
	// times the endpoint entered quarantine, so that a re-probe's result
	// applies only to the quarantine it was started for.
	qGen     uint64
	qBackoff time.Duration // the current wait; zero: start over
	qNext    time.Time     // when the next re-probe is due
	qLifted  time.Time     // when a probe last lifted the quarantine
}

// New returns a pool with no endpoints. Add them with Set.
func New(cfg Config) (*Pool, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var readLocal func()
	if cfg.IsLocal == nil {
		l := newLocalAddrs(cfg.Logger)
		cfg.IsLocal, readLocal = l.isLocal, l.read
	}
	return &Pool{
		cfg:       cfg,
		readLocal: readLocal,
		seed:      maphash.MakeSeed(),
		kick:      make(chan struct{}, 1),
		eps:       make(map[string]*endpoint),
		subs:      make(map[int]func(Event)),
	}, nil
}

// Config returns the configuration with defaults applied.
func (p *Pool) Config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// Subscribe registers fn for every later event. Events are delivered in
// order, outside the pool's lock, on the goroutine that caused them or on
// one that is delivering earlier events; fn must not block for long. It may
// call the pool's methods, including ones that change it. The returned
// function removes the subscription.
func (p *Pool) Subscribe(fn func(Event)) (cancel func()) {
	p.mu.Lock()
	id := p.nextSub
	p.nextSub++
	p.subs[id] = fn
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.subs, id)
		p.mu.Unlock()
	}
}

// Set replaces the endpoints known from source with specs. Endpoints that no
// source knows any more are removed. Invalid addresses are skipped and
// reported in the returned error; the valid ones are applied.
func (p *Pool) Set(source Source, specs []Spec) error {
	var errs []error
	want := make(map[string]Spec, len(specs))
	for _, s := range specs {
		addr, err := ParseAddr(s.Addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.Addr = addr
		want[addr] = s
	}
	local := make(map[string]bool, len(want))
	for addr := range want {
		local[addr] = p.cfg.IsLocal(hostOf(addr)) // may be slow: not under mu
	}
	now := time.Now()
	added := false
	p.mu.Lock()
	for addr, s := range want {
		e, ok := p.eps[addr]
		if !ok {
			e = p.newEndpointLocked(s, local[addr], now)
			p.eps[addr] = e
			p.emitLocked(Event{Kind: EventAdded, Addr: addr, State: e.state})
			added = true
		}
		if e.sources&source == 0 {
			e.sources |= source
			p.dirty = true
		}
		if s.Zone != "" && s.Zone != e.zone {
			e.zone = s.Zone
			p.dirty = true
			if e.state == StateQuarantined { // its configuration changed
				p.resetQuarantineLocked(e, now)
			}
		}
	}
	for addr, e := range p.eps {
		if _, ok := want[addr]; ok || e.sources&source == 0 {
			continue
		}
		e.sources &^= source
		p.dirty = true
		if e.sources == 0 {
			delete(p.eps, addr)
			p.emitLocked(Event{Kind: EventRemoved, Addr: addr, State: e.state})
			p.cfg.Logger.Info("endpoint removed", "addr", addr, "source", source.String())
		}
	}
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
	if added {
		p.Kick()
	}
	return errors.Join(errs...)
}

func (p *Pool) newEndpointLocked(s Spec, local bool, now time.Time) *endpoint {
	p.dirty = true
	return &endpoint{
		addr:  s.Addr,
		host:  hostOf(s.Addr),
		zone:  s.Zone,
		local: local,
		tie:   maphash.String(p.seed, s.Addr),
		tier:  rttTier(0),
		state: StateUnknown,
		since: now,
	}
}

// ResetQuarantine returns every quarantined endpoint to the unknown state,
// for use when the trust configuration (CA, server name) changed.
func (p *Pool) ResetQuarantine() {
	now := time.Now()
	p.mu.Lock()
	for _, e := range p.eps {
		if e.state == StateQuarantined {
			p.resetQuarantineLocked(e, now)
		}
	}
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
	p.Kick()
}

// ReportSuccess records that real traffic reached addr (a connection was
// established). It counts like a successful probe.
func (p *Pool) ReportSuccess(addr string) {
	p.observe(addr, 0, nil, 0)
}

// ReportFailure records a failure seen on real traffic to addr. Dial, TLS,
// certificate time-validity and lost-connection failures count towards Fall
// and mark the endpoint suspect at once; a certificate failure quarantines
// it; GOAWAY only ranks it lower until its next successful probe. The probe
// loop is woken early.
func (p *Pool) ReportFailure(addr string, f Failure, err error) {
	if err == nil {
		err = errors.New(f.String())
	}
	p.observe(addr, 0, err, f)
	p.Kick()
}

// ReportAnswered records that addr answered real traffic (a first byte
// came back): it lifts a suspicion (see FailureSilent) at once. Unlike
// ReportSuccess it is not a successful probe: it neither counts towards
// Rise nor clears failures, since a server that answers TLS may still fail
// /readyz.
func (p *Pool) ReportAnswered(addr string) {
	p.mu.Lock()
	if e, ok := p.eps[addr]; ok && e.suspect {
		e.suspect = false
		p.dirty = true
		p.rebuildLocked()
	}
	p.mu.Unlock()
	p.flush()
}

// AddWaiting adds n (1 or -1) to the connections to addr waiting for
// their first byte from it: the client spoke, the server has not answered
// yet. Among endpoints otherwise ranked alike (health, locality, RTT tier)
// the one with fewer waiting goes first, before stickiness: a server that
// stops answering keeps its first silent connection waiting, and the next
// connection goes to another (least outstanding, as HAProxy's leastconn
// but counting only what is stuck). With crowdedWaiting or more waiting,
// an endpoint ranks as one RTT tier slower (rankKey.rankedTier), so that
// a server alone in the best tier sends the next connections to the next
// tier when it stops answering.
//
// Each connection calls it twice, so it re-sorts only when the change
// moves addr past a neighbour in the order: the count is no key of the
// preferred endpoint, and the other endpoints' keys are as they were.
func (p *Pool) AddWaiting(addr string, n int) {
	p.addRanked(addr, n, func(e *endpoint) *int { return &e.waiting }, true)
}

// AddStalled adds n (1 or -1) to the connections to addr that have
// waited for their first byte past their deadline and still wait. An
// endpoint with such a connection ranks after those without, right after
// health and before locality and RTT tier: a server that stops answering
// is often the preferred one until then, and the next connection must not
// wait on it while the silence is confirmed (see FailureSilent). It is no
// health mark: probes and Fall are unaffected, and the endpoint ranks as
// before once its connections answer or end.
func (p *Pool) AddStalled(addr string, n int) {
	p.addRanked(addr, n, func(e *endpoint) *int { return &e.stalled }, false)
}

// addRanked adds n to the connection count field picks of addr's
// endpoint (never below zero) and re-ranks: the counts AddWaiting and
// AddStalled keep are rank keys. inPlace: the count is no key of the
// preferred endpoint, so the order stands while addr still ranks between
// its neighbours (inPlaceLocked).
func (p *Pool) addRanked(addr string, n int, field func(*endpoint) *int, inPlace bool) {
	p.mu.Lock()
	if e, ok := p.eps[addr]; ok {
		c := field(e)
		*c = max(0, *c+n)
		if inPlace && !p.dirty && p.inPlaceLocked(e) {
			p.mu.Unlock()
			return
		}
		p.dirty = true
		p.rebuildLocked()
	}
	p.mu.Unlock()
	p.flush()
}

// ConnOpened counts an open connection to addr; ConnClosed uncounts it.
func (p *Pool) ConnOpened(addr string) { p.addConns(addr, 1) }

// ConnClosed uncounts a connection counted with ConnOpened.
func (p *Pool) ConnClosed(addr string) { p.addConns(addr, -1) }

func (p *Pool) addConns(addr string, n int) {
	p.mu.Lock()
	if e, ok := p.eps[addr]; ok {
		e.conns = max(0, e.conns+n)
	}
	p.mu.Unlock()
}

// observe applies one probe result or passive signal.
func (p *Pool) observe(addr string, rtt time.Duration, err error, f Failure) {
	now := time.Now()
	p.mu.Lock()
	if e, ok := p.eps[addr]; ok {
		p.observeLocked(e, rtt, err, f, true, now)
		p.rebuildLocked()
	}
	p.mu.Unlock()
	p.flush()
}

// observeLocked applies one result to e. A success lifts a suspicion only
// if lift is set: a probe begun before the endpoint became suspect (or
// without being told, see Suspected) proves nothing about what made it so.
func (p *Pool) observeLocked(e *endpoint, rtt time.Duration, err error, f Failure, lift bool, now time.Time) {
	if e.state == StateQuarantined {
		return // only a re-probe (reprobedLocked) or a configuration change lifts it
	}
	if err == nil {
		p.setRTTLocked(e, rtt)
		e.succ++
		e.fail = 0
		e.lastErr = nil
		if e.suspect && lift {
			e.suspect = false
			p.dirty = true
		}
		if e.draining {
			e.draining = false
			p.dirty = true
		}
		if e.state == StateUnknown || e.state == StateUnhealthy && e.succ >= p.cfg.Rise {
			p.setStateLocked(e, StateHealthy, nil, now)
		}
		return
	}
	e.lastErr = err
	if IsLocalError(err) {
		// This host is out of descriptors or memory: nothing learned
		// about e.
		p.cfg.Logger.Info("this host is out of a resource; not counted against the endpoint", "addr", e.addr, "err", err.Error())
		return
	}
	if quarantines(f, err) {
		p.quarantineLocked(e, err, now)
		return
	}
	if f == FailureGoAway {
		if !e.draining {
			e.draining = true
			p.dirty = true
		}
		return
	}
	if f == FailureSilent {
		p.suspectLocked(e)
		return
	}
	e.succ = 0
	e.fail++
	p.suspectLocked(e)
	if e.state == StateUnknown || e.state == StateHealthy && e.fail >= p.cfg.Fall {
		p.setStateLocked(e, StateUnhealthy, err, now)
	}
}

// suspectLocked makes a healthy (or not yet probed) e suspect.
func (p *Pool) suspectLocked(e *endpoint) {
	if !e.suspect && (e.state == StateHealthy || e.state == StateUnknown) {
		e.suspect = true
		e.suspectGen++
		p.dirty = true
	}
}

// quarantines reports whether a failure quarantines its endpoint: the
// certificate did not verify, for a reason other than its validity period.
func quarantines(f Failure, err error) bool {
	return (f == FailureCertificate || errors.Is(err, ErrCertificate)) && !IsCertificateTimeError(err)
}

// quarantineLocked quarantines e and schedules its first re-probe: after
// QuarantineBackoff, or after twice its last wait if a probe lifted its
// last quarantine less than QuarantineBackoffMax ago.
func (p *Pool) quarantineLocked(e *endpoint, err error, now time.Time) {
	if e.qBackoff == 0 || now.Sub(e.qLifted) >= p.cfg.QuarantineBackoffMax {
		e.qBackoff = p.cfg.QuarantineBackoff
	} else {
		e.qBackoff = min(2*e.qBackoff, p.cfg.QuarantineBackoffMax)
	}
	e.qNext = now.Add(p.jitter(e.qBackoff))
	e.qGen++
	e.draining = false
	p.setStateLocked(e, StateQuarantined, err, now)
}

// reprobedLocked applies the result of a re-probe of quarantined e. A
// success is a verified certificate: e becomes healthy at once, as an
// endpoint never probed does on its first success (and as one lifted by
// ResetQuarantine does on its next probe). A failure of any kind keeps the
// quarantine and doubles the wait for the next re-probe.
func (p *Pool) reprobedLocked(e *endpoint, rtt time.Duration, err error, now time.Time) {
	if err != nil {
		e.lastErr = err
		e.qBackoff = min(2*e.qBackoff, p.cfg.QuarantineBackoffMax)
		e.qNext = now.Add(p.jitter(e.qBackoff))
		return
	}
	p.setRTTLocked(e, rtt)
	e.lastErr = nil
	e.qLifted = now
	p.setStateLocked(e, StateHealthy, nil, now)
}

// resetQuarantineLocked lifts e's quarantine after a configuration change:
// e is unknown again and its backoff starts over.
func (p *Pool) resetQuarantineLocked(e *endpoint, now time.Time) {
	e.qBackoff = 0
	p.setStateLocked(e, StateUnknown, nil, now)
}

// setRTTLocked folds a probe duration into the moving average and moves
// the endpoint to another RTT tier when the average is clearly outside its
// current one (see stickyTier). The first sample sets the tier directly.
func (p *Pool) setRTTLocked(e *endpoint, rtt time.Duration) {
	if rtt <= 0 {
		return
	}
	var tier int
	if e.rtt == 0 {
		e.rtt = rtt
		tier = rttTier(rtt)
	} else {
		e.rtt = (e.rtt*7 + rtt*3) / 10
		tier = stickyTier(e.tier, e.rtt)
	}
	if tier != e.tier {
		e.tier = tier
		p.dirty = true
	}
}

func (p *Pool) setStateLocked(e *endpoint, s State, err error, now time.Time) {
	if e.state == s {
		return
	}
	prev := e.state
	e.state = s
	e.since = now
	e.succ, e.fail = 0, 0
	p.dirty = true
	switch s {
	case StateHealthy:
		p.emitLocked(Event{Kind: EventUp, Addr: e.addr, State: s})
		p.cfg.Logger.Info("endpoint healthy", "addr", e.addr, "was", prev.String())
	case StateUnhealthy, StateQuarantined:
		e.suspect = false
		p.emitLocked(Event{Kind: EventDown, Addr: e.addr, State: s, Err: err})
		p.cfg.Logger.Info("endpoint down", "addr", e.addr, "state", s.String(), "was", prev.String(), "err", errString(err))
	}
}

func (p *Pool) emitLocked(ev Event) {
	if len(p.subs) > 0 {
		p.pending = append(p.pending, ev)
	}
}

// flush delivers pending events in order, outside mu. One goroutine
// delivers at a time, looping until nothing is pending, so a subscriber may
// change the pool from its callback: its events are delivered after the
// current one, by the same loop.
func (p *Pool) flush() {
	p.mu.Lock()
	if p.delivering {
		p.mu.Unlock()
		return
	}
	p.delivering = true
	for len(p.pending) > 0 {
		evs := p.pending
		p.pending = nil
		subs := make([]func(Event), 0, len(p.subs))
		for _, fn := range p.subs {
			subs = append(subs, fn)
		}
		p.mu.Unlock()
		for _, ev := range evs {
			for _, fn := range subs {
				fn(ev)
			}
		}
		p.mu.Lock()
	}
	p.delivering = false
	p.mu.Unlock()
}

// ErrNoEndpoints is returned when the pool has no endpoint at all.
var ErrNoEndpoints = errors.New("no endpoints configured")

// Pick returns the endpoint to try first. It fails only when the pool is
// empty.
func (p *Pool) Pick() (string, error) {
	p.mu.Lock()
	expired := p.expireSlowLocked(time.Now())
	addr := ""
	if len(p.order) > 0 {
		addr = p.order[0].addr
	}
	p.mu.Unlock()
	if expired {
		p.flush()
	}
	if addr == "" {
		return "", ErrNoEndpoints
	}
	return addr, nil
}

// Candidates returns every endpoint, best first: healthy before unknown
// before suspect before unhealthy; without connections stalled past their
// first-byte deadline before with (AddStalled); local before same zone
// before the rest;
// then endpoints known only from static configuration (typically the origin,
// which may be a VIP or a load balancer in front of the others) after
// discovered ones, so they serve as the last resort; lower RTT tier first;
// the preferred endpoint before its equals; remaining ties spread by a
// per-pool hash. When nothing is healthy the list still holds
// every endpoint (fail open), quarantined ones at the very end. It is empty
// only when the pool is.
func (p *Pool) Candidates() []string {
	p.mu.Lock()
	expired := p.expireSlowLocked(time.Now())
	out := make([]string, len(p.order))
	for i, e := range p.order {
		out[i] = e.addr
	}
	p.mu.Unlock()
	if expired { // events only come from a lifted demotion here
		p.flush()
	}
	return out
}

// LastProbeActivity returns when the probe loop (Run) last started a round
// or a probe; zero before its first round, and always without a Prober. A
// round that probes nothing counts: every endpoint may be quarantined and
// waiting for its re-probe. Liveness checks compare it with Interval.
func (p *Pool) LastProbeActivity() time.Time {
	ns := p.active.Load()
	if ns == 0 {
		return time.Time{}
	}
	return monotime.Time(ns)
}

// Healthy reports whether at least one endpoint is healthy.
func (p *Pool) Healthy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.order {
		if e.state == StateHealthy {
			return true
		}
	}
	return false
}

// Len returns the number of endpoints.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.eps)
}

// Status returns a snapshot of every endpoint in candidate order.
func (p *Pool) Status() []Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Status, len(p.order))
	for i, e := range p.order {
		out[i] = Status{
			Addr:      e.addr,
			Sources:   e.sources,
			State:     e.state,
			Zone:      e.zone,
			Local:     e.local,
			Suspect:   e.suspect,
			Draining:  e.draining,
			Slow:      !e.slowUntil.IsZero(),
			RTT:       e.rtt,
			Conns:     e.conns,
			Waiting:   e.waiting,
			Stalled:   e.stalled,
			Preferred: e.addr == p.preferred,
			LastError: errString(e.lastErr),
			Since:     e.since,
		}
	}
	return out
}

// Sources returns the sources that know addr; zero if it is not in the pool.
func (p *Pool) Sources(addr string) Source {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.eps[addr]; ok {
		return e.sources
	}
	return 0
}

// Has reports whether addr is in the pool.
func (p *Pool) Has(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.eps[addr]
	return ok
}

// HedgeBar is how healthy an endpoint must be for a connection race to
// start it while earlier attempts still run (a staggered start, which
// hedges against a slow attempt, or the next candidate after a failed
// one): as healthy as the healthiest attempt in flight was when the race
// began (Pool.HedgeBars, HedgeBar.Stricter). A failed attempt lowers its
// endpoint's health at once; the bars stay where they were, so that the
// failure of one attempt does not let a less healthy endpoint hedge a
// healthier attempt still running.
//
// The zero HedgeBar lets every endpoint hedge.
type HedgeBar struct {
	set   bool
	class int // the highest health class allowed (healthClass)
}

// Stricter returns the stricter of b and o: the bar fewer endpoints meet.
func (b HedgeBar) Stricter(o HedgeBar) HedgeBar {
	if !b.set || (o.set && o.class < b.class) {
		return o
	}
	return b
}

// HedgeBars returns the bar each of candidates sets while its attempt is
// in flight, for a race that begins now: its health now; any endpoint for
// one not in the pool.
func (p *Pool) HedgeBars(candidates []string) []HedgeBar {
	bars := make([]HedgeBar, len(candidates))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, addr := range candidates {
		if e, ok := p.eps[addr]; ok {
			bars[i] = HedgeBar{set: true, class: healthClass(e)}
		}
	}
	return bars
}

// MayHedge reports whether a connection race may start next while
// attempts whose stricter bar is bar still run: next is as healthy as
// the healthiest of them was (HedgeBar). A less healthy one, such as an
// API server that fails /readyz but handshakes quickly, would win every
// race against a slow healthy attempt and serve its requests; it is
// tried once the healthier attempts failed. Next unknown to the pool:
// true.
func (p *Pool) MayHedge(bar HedgeBar, next string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.eps[next]
	return !ok || !bar.set || healthClass(e) <= bar.class
}

// Usable reports whether addr is in the pool and neither unhealthy nor
// quarantined: connections to it may stay open.
func (p *Pool) Usable(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.eps[addr]
	return ok && (e.state == StateHealthy || e.state == StateUnknown)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
