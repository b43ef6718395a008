package localproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Accept backoff after errors such as EMFILE: doubling from min to max.
const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
	// acceptStuckAfter: a listener whose Accept has failed for this long
	// without a single success fails /healthz, so that a supervisor
	// (kubelet's liveness probe, systemd's watchdog script) restarts a
	// proxy that can no longer take clients.
	acceptStuckAfter = 30 * time.Second
)

// Proxy is the node-local L4 proxy. Create it with New and start it with
// Run.
type Proxy struct {
	cfg    Config
	log    logr.Logger
	pool   *upstream.Pool
	dialer *endpoint.Dialer
	// hold closes new clients at once, without dialing, for a moment after
	// every endpoint refused.
	hold endpoint.Holdoff
	m    *metrics

	ready   chan struct{} // closed once the listeners are bound
	started atomic.Bool
	// accepting counts running accept loops; /healthz wants all of them.
	accepting atomic.Int32
	// acceptFailing holds, per accept loop in a run of failed Accepts, the
	// listener's address and when the run began (*acceptFailure).
	acceptFailing sync.Map
	active        atomic.Int64 // open client connections
	stopping      atomic.Bool  // shutdown began

	mu sync.Mutex // guards the fields below
	// addrs and healthAddr are set when the listeners are bound.
	addrs      []net.Addr
	healthAddr net.Addr
	// conns holds every client connection, byUpstream those with an
	// upstream, by endpoint.
	conns      map[*conn]struct{}
	byUpstream map[string]map[*conn]struct{}
	// seq counts EventDown and EventRemoved events; downAt is the seq of the
	// latest such event per endpoint, so a connection dialed while its
	// endpoint went down is closed too. It keeps one entry per endpoint
	// ever dropped.
	seq    uint64
	downAt map[string]uint64
	// drainBy is the drain deadline of endpoints whose connections were
	// drained when they went down or were removed, while any remain.
	drainBy map[string]time.Time
	// downDrains close the drained connections of endpoints that went
	// down, at the deadline or later (see expireDrain).
	downDrains map[string]*time.Timer
}

// New validates cfg and returns a proxy. It opens no sockets and starts no
// goroutines: Run does.
func New(cfg Config) (*Proxy, error) {
	cfg.Endpoints = append([]string(nil), cfg.Endpoints...)
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:        cfg,
		log:        cfg.Logger,
		ready:      make(chan struct{}),
		conns:      make(map[*conn]struct{}),
		byUpstream: make(map[string]map[*conn]struct{}),
		downAt:     make(map[string]uint64),
		drainBy:    make(map[string]time.Time),
		downDrains: make(map[string]*time.Timer),
	}
	pool, err := upstream.New(cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("localproxy: %w", err)
	}
	p.pool = pool
	// setDefaults validated the endpoints, so Set cannot fail.
	specs := make([]upstream.Spec, len(cfg.Endpoints))
	for i, e := range cfg.Endpoints {
		specs[i] = upstream.Spec{Addr: e}
	}
	if err := pool.Set(upstream.SourceStatic, specs); err != nil {
		return nil, fmt.Errorf("localproxy: %w", err)
	}
	p.m, err = newMetrics(cfg.Registry, pool)
	if err != nil {
		return nil, fmt.Errorf("localproxy: registering metrics: %w", err)
	}
	p.dialer = &endpoint.Dialer{
		Pool:           pool,
		StaggerDelay:   cfg.StaggerDelay,
		AttemptTimeout: cfg.AttemptTimeout,
		Timeout:        cfg.DialTimeout,
		KeepAlive:      cfg.UpstreamKeepAlive,
		UserTimeout:    cfg.UpstreamUserTimeout,
		OnDial:         p.m.observeDial,
		Logger:         cfg.Logger,
	}
	return p, nil
}

// Pool returns the endpoint pool, for callers that add endpoints from
// their own sources.
func (p *Proxy) Pool() *upstream.Pool { return p.pool }

// Ready is closed once Run has bound its listeners.
func (p *Proxy) Ready() <-chan struct{} { return p.ready }

// Addrs returns the addresses the proxy accepts clients on, once Ready.
func (p *Proxy) Addrs() []net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]net.Addr(nil), p.addrs...)
}

// HealthAddr returns the address of the health server once Ready, or nil
// if there is none.
func (p *Proxy) HealthAddr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.healthAddr
}

// Run binds the listeners, probes the endpoints, runs discovery and the
// state file if configured, serves clients and the health server until ctx
// is done, then shuts down gracefully: it stops accepting, gives open
// connections up to ShutdownTimeout, closes the rest and returns once every
// goroutine it started has returned. It returns an error only when the
// listeners cannot be bound. Run may be called once.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("localproxy: Run called twice")
	}
	lns, hln, err := p.bind(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	unsubscribe := p.pool.Subscribe(p.onEvent)
	defer unsubscribe()
	if pr, ok := p.pool.Config().Prober.(*endpoint.Prober); ok {
		// A new CA (--ca-file rotated) may verify what the old one did not.
		defer pr.OnCAChange(p.pool.ResetQuarantine)()
	}

	var bg sync.WaitGroup // everything but the accept loops and connections
	bg.Go(func() { p.pool.Run(runCtx) })
	if p.cfg.StateFile != "" {
		sf := newStateFile(p.cfg.StateFile, p.cfg.Origin, p.pool, p.log)
		sf.load()
		bg.Go(func() { sf.run(runCtx) })
	}
	if hln != nil {
		hs := p.newHealthServer()
		bg.Go(func() { serveHealth(runCtx, hs, hln, p.log) })
	}
	if p.cfg.IdleTimeout > 0 && idleSupported {
		bg.Go(func() { p.reapIdle(runCtx) })
	}
	if p.cfg.Discovery != nil {
		d, err := newDiscovery(p.cfg.Discovery, p.pool, p.cfg.DiscoveryPollInterval, p.log)
		if err != nil {
			p.log.Error(err, "discovery disabled")
		} else {
			bg.Go(func() { d.Run(runCtx) })
		}
	}

	// connCtx ends when the shutdown deadline passes: dials in flight then
	// give up.
	connCtx, stopConns := context.WithCancel(runCtx)
	defer stopConns()
	var handlers, loops sync.WaitGroup
	p.accepting.Store(int32(len(lns)))
	for _, ln := range lns {
		loops.Go(func() { p.acceptLoop(ctx, connCtx, ln, &handlers) })
	}
	close(p.ready)
	p.log.Info("proxy listening", "addrs", addrStrings(lns), "endpoints", p.cfg.Endpoints)

	<-ctx.Done()
	p.stopping.Store(true)
	for _, ln := range lns {
		ln.Close()
	}
	loops.Wait()
	p.stopDrains()
	p.drain(&handlers, stopConns)
	cancel()
	bg.Wait()
	p.log.Info("proxy stopped")
	return nil
}

// bind opens the client listeners and the health listener.
func (p *Proxy) bind(ctx context.Context) ([]net.Listener, net.Listener, error) {
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	for _, a := range p.cfg.ListenAddresses {
		ln, err := p.cfg.Listen(ctx, "tcp", a)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("localproxy: listen: %w", err)
		}
		lns = append(lns, ln)
	}
	var hln net.Listener
	if p.cfg.HealthAddress != "" {
		var lc net.ListenConfig
		var err error
		if hln, err = lc.Listen(ctx, "tcp", p.cfg.HealthAddress); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("localproxy: health server: %w", err)
		}
	}
	p.mu.Lock()
	for _, ln := range lns {
		p.addrs = append(p.addrs, ln.Addr())
	}
	if hln != nil {
		p.healthAddr = hln.Addr()
	}
	p.mu.Unlock()
	return lns, hln, nil
}

// drain gives open connections up to ShutdownTimeout, then closes them and
// waits for their goroutines.
func (p *Proxy) drain(handlers *sync.WaitGroup, stopConns context.CancelFunc) {
	done := make(chan struct{})
	go func() {
		handlers.Wait()
		close(done)
	}()
	n := p.active.Load()
	if p.cfg.ShutdownTimeout > 0 && n > 0 {
		p.log.Info("draining connections", "conns", n, "timeout", p.cfg.ShutdownTimeout)
		deadline := time.Now().Add(p.cfg.ShutdownTimeout)
		for _, c := range p.snapshot() {
			c.closeBy(deadline)
		}
		t := time.NewTimer(p.cfg.ShutdownTimeout)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	stopConns()
	for _, c := range p.snapshot() {
		c.close()
	}
	<-done
}

func (p *Proxy) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

// acceptFailure is a run of failed Accepts on one listener.
type acceptFailure struct {
	addr  string
	since time.Time
	mu    sync.Mutex // guards err
	err   error      // the latest
}

func (f *acceptFailure) setErr(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// stuckAccepting returns an error naming a listener whose Accept has
// failed for acceptStuckAfter or longer without a success, nil if none.
func (p *Proxy) stuckAccepting(now time.Time) error {
	var stuck error
	p.acceptFailing.Range(func(_, v any) bool {
		f := v.(*acceptFailure)
		if d := now.Sub(f.since); d >= acceptStuckAfter {
			f.mu.Lock()
			stuck = fmt.Errorf("accepting on %s has failed for %v: %w", f.addr, d.Round(time.Second), f.err)
			f.mu.Unlock()
			return false
		}
		return true
	})
	return stuck
}

// acceptLoop accepts clients until ln is closed. Errors such as EMFILE
// (out of file descriptors) back off, doubling up to a second, and the
// loop goes on: the pending connections wait in the listen backlog.
func (p *Proxy) acceptLoop(ctx, connCtx context.Context, ln net.Listener, handlers *sync.WaitGroup) {
	defer p.accepting.Add(-1)
	defer p.acceptFailing.Delete(ln)
	var delay time.Duration
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			if delay == 0 {
				p.acceptFailing.Store(ln, &acceptFailure{addr: ln.Addr().String(), since: time.Now(), err: err})
			} else if f, ok := p.acceptFailing.Load(ln); ok {
				f.(*acceptFailure).setErr(err)
			}
			delay = min(max(2*delay, minAcceptBackoff), maxAcceptBackoff)
			p.m.acceptErrors.Inc()
			p.log.V(1).Info("accept failed; backing off", "addr", ln.Addr().String(), "err", err.Error(), "delay", delay)
			if timer == nil {
				timer = time.NewTimer(delay)
			} else {
				timer.Reset(delay)
			}
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		}
		if delay != 0 {
			p.acceptFailing.Delete(ln)
			delay = 0
		}
		p.m.accepted.Inc()
		if max := p.cfg.MaxConnections; max > 0 && p.active.Load() >= int64(max) {
			p.m.rejected.WithLabelValues("max_connections").Inc()
			p.log.V(2).Info("too many connections; closing", "client", nc.RemoteAddr().String(), "max", max)
			nc.Close()
			continue
		}
		c := &conn{p: p, client: nc}
		p.active.Add(1)
		p.m.active.Inc()
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		handlers.Go(func() { p.serve(connCtx, c) })
	}
}

// register records c's upstream. It returns false when the endpoint went
// down or was removed since seq (the event count before the dial): the
// caller then closes c.
func (p *Proxy) register(c *conn, seq uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.downAt[c.addr] > seq {
		return false
	}
	m := p.byUpstream[c.addr]
	if m == nil {
		m = make(map[*conn]struct{})
		p.byUpstream[c.addr] = m
	}
	m[c] = struct{}{}
	return true
}

func (p *Proxy) eventSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *Proxy) forget(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	if m := p.byUpstream[c.addr]; m != nil {
		delete(m, c)
		if len(m) == 0 {
			delete(p.byUpstream, c.addr)
			delete(p.drainBy, c.addr)
		}
	}
	p.mu.Unlock()
	p.active.Add(-1)
	p.m.active.Dec()
}

// onEvent closes, or drains, the connections of an endpoint that went down
// or was removed, lifts the drain of an endpoint that recovers, and ends
// the dial holdoff when one comes up or is added.
func (p *Proxy) onEvent(ev upstream.Event) {
	p.hold.OnEvent(ev)
	if ev.Kind == upstream.EventUp {
		p.undrain(ev.Addr)
		return
	}
	if ev.Kind != upstream.EventDown && ev.Kind != upstream.EventRemoved {
		return
	}
	p.mu.Lock()
	p.seq++
	p.downAt[ev.Addr] = p.seq
	cs := make([]*conn, 0, len(p.byUpstream[ev.Addr]))
	for c := range p.byUpstream[ev.Addr] {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	if len(cs) == 0 {
		return
	}
	reason := "endpoint_" + ev.Kind.String()
	p.m.failovers.WithLabelValues(reason).Add(float64(len(cs)))
	d := p.cfg.DrainTimeout
	if endpoint.Graceful(ev) {
		// The server still answers: it is leaving gracefully, finishes the
		// requests on these connections and closes them itself. Cutting
		// them would lose a request in flight that the client cannot
		// safely retry.
		d = max(d, GracefulDrainTimeout)
	}
	if d > 0 {
		p.log.Info("draining connections to endpoint", "endpoint", ev.Addr, "reason", ev.Kind.String(), "conns", len(cs), "timeout", d)
		deadline := time.Now().Add(d)
		p.mu.Lock()
		if len(p.byUpstream[ev.Addr]) > 0 {
			p.drainBy[ev.Addr] = deadline
		}
		if ev.Kind == upstream.EventDown && p.downDrains[ev.Addr] == nil && !p.stopping.Load() {
			p.armDownDrainLocked(ev.Addr, d)
		}
		p.mu.Unlock()
		for _, c := range cs {
			if ev.Kind == upstream.EventDown {
				c.markDrained()
			} else {
				// Removed: closed by the deadline whatever else is up.
				c.drain(deadline)
			}
		}
		return
	}
	p.log.Info("closing connections to endpoint", "endpoint", ev.Addr, "reason", ev.Kind.String(), "conns", len(cs))
	for _, c := range cs {
		c.close()
	}
}

// drainRecheck is how often the drained connections of an endpoint that
// went down are looked at again once their deadline passed while no other
// endpoint was healthy.
const drainRecheck = time.Second

func (p *Proxy) armDownDrainLocked(addr string, d time.Duration) {
	// The callback takes p.mu, so it sees t assigned.
	var t *time.Timer
	t = time.AfterFunc(d, func() { p.expireDrain(addr, t) })
	p.downDrains[addr] = t
}

// expireDrain closes the drained connections to addr, which went down,
// when t, its drain timer, fires, unless no endpoint is healthy: every
// server failing /readyz at once (etcd unavailable) leaves nowhere better
// to go, and cutting every client then only adds a reconnection storm.
// Those stay and are looked at again every drainRecheck.
func (p *Proxy) expireDrain(addr string, t *time.Timer) {
	alone := !p.pool.Healthy() // before p.mu: the pool has its own lock
	p.mu.Lock()
	if p.downDrains[addr] != t {
		p.mu.Unlock()
		return
	}
	if alone && !p.stopping.Load() {
		p.armDownDrainLocked(addr, drainRecheck)
		p.mu.Unlock()
		p.log.V(2).Info("keeping drained connections: no other endpoint is healthy", "endpoint", addr)
		return
	}
	delete(p.downDrains, addr)
	var cs []*conn
	for c := range p.byUpstream[addr] {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range cs {
		if c.drained() {
			c.close()
			n++
		}
	}
	if n > 0 {
		p.log.Info("drain deadline passed; closed connections to endpoint", "endpoint", addr, "conns", n)
	}
}

// stopDrains stops the drain timers (shutdown: every connection closes).
func (p *Proxy) stopDrains() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, t := range p.downDrains {
		t.Stop()
		delete(p.downDrains, addr)
	}
}

// undrain keeps the connections to addr, healthy again, open: an
// endpoint that failed /readyz for a moment (an etcd hiccup fails every
// server's /readyz at once) must not cost every client its connections.
func (p *Proxy) undrain(addr string) {
	p.mu.Lock()
	_, draining := p.drainBy[addr]
	delete(p.drainBy, addr)
	if t := p.downDrains[addr]; t != nil {
		t.Stop()
		delete(p.downDrains, addr)
		draining = true
	}
	var cs []*conn
	if draining {
		for c := range p.byUpstream[addr] {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	if len(cs) == 0 {
		return
	}
	p.log.Info("endpoint healthy again; keeping its connections", "endpoint", addr, "conns", len(cs))
	for _, c := range cs {
		c.undrain()
	}
}

// removedUpstreams lists the endpoints with connections that are not in
// the pool (inPool), in address order.
func (p *Proxy) removedUpstreams(inPool map[string]bool) []RemovedUpstream {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []RemovedUpstream
	for addr, cs := range p.byUpstream {
		if !inPool[addr] {
			out = append(out, RemovedUpstream{Addr: addr, Conns: len(cs), CloseBy: p.drainBy[addr]})
		}
	}
	slices.SortFunc(out, func(a, b RemovedUpstream) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

func addrStrings(lns []net.Listener) []string {
	out := make([]string, len(lns))
	for i, ln := range lns {
		out[i] = ln.Addr().String()
	}
	return out
}
