package localproxy

import (
	"context"
	"errors"
	"fmt"
	"github.com/apifailover/apifailover/internal/workers"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Proxy is the node-local L4 proxy. Create it with New and start it with
// Run.
type Proxy struct {
	cfg  Config
	log  logr.Logger
	pool *upstream.Pool
	// probeSchedule is the pool's configuration with its defaults, for
	// its Interval and Timeout: read once, as the pool's Config must not
	// be read while SetZone may run.
	probeSchedule upstream.Config
	dialer        *endpoint.Dialer
	// tunedListeners are the listeners whose accepted sockets come with
	// the client connections' socket options (see bind); set before the
	// accept loops start.
	tunedListeners map[net.Listener]bool
	// workers run the connections' setup (serve) and the dialer's attempts.
	workers workers.Pool
	// hold closes new clients at once, without dialing, for a moment after
	// every endpoint refused.
	hold endpoint.Holdoff
	m    *metrics
	// upstreams holds the client connections with an upstream, by
	// endpoint, and drains or closes those of an endpoint that goes down
	// or is removed.
	upstreams *endpoint.Registry[*conn]
	// fb watches for upstreams that go silent; nil if FirstByteTimeout
	// is negative.
	fb *firstByteWatch
	// back moves connections back to a better endpoint once it settled;
	// nil if fail-back is off.
	back *failback[*conn]
	// zone learns the pool's zone from the Node's label; nil without
	// Config.NodeName, or with Config.Pool.Zone.
	zone *zoneLearner
	// poll waits for data on idle connections (see direction); nil where
	// there is none (not Linux), and then every copy waits on its own
	// goroutine. Started by the first direction to park (parker), closed
	// by Run once every connection is done.
	poll     *poller
	pollInit sync.Once
	// pipes counts connections whose copies started and are not done;
	// they outlive the goroutine of serve. Those dialed on the loop count
	// from their dial on.
	pipes sync.WaitGroup
	// handlers counts the serve goroutines, which dial with connCtx: it
	// ends when the shutdown deadline passes. Both set by Run before any
	// accept.
	handlers sync.WaitGroup
	connCtx  context.Context
	// closing and lingering count client connections closed FIN first
	// whose full close is still to come (closeClient).
	closing   sync.WaitGroup
	lingering atomic.Int64
	// splicing counts the copies splicing now (MaxSplices).
	splicing atomic.Int32
	// sinceTrim counts connections accepted since the last trim (see
	// trim.go); trims the trims; trimIdle the idle workers at the last;
	// trimTimer, guarded by trimMu, fires the next one.
	sinceTrim, trims, trimIdle atomic.Int64
	trimMu                     sync.Mutex
	trimTimer                  *time.Timer
	// bytesIn and bytesOut count the bytes copied each way.
	bytesIn, bytesOut prometheus.Counter

	ready chan struct{} // closed once the listeners are bound
	// runAt is when Run began: the probe loop's age counts from it until
	// its first probe (Live). Set before ready is closed.
	runAt   time.Time
	started atomic.Bool
	// accepting counts running accept loops; /healthz wants all of them.
	accepting atomic.Int32
	// acceptFailing holds, per accept loop in a run of failed Accepts, the
	// listener's address and when the run began (*acceptFailure).
	acceptFailing sync.Map
	short         shortage     // of descriptors or memory for upstream sockets
	active        atomic.Int64 // open client connections
	stopping      atomic.Bool  // shutdown began

	// mu guards the fields below. Lock order: mu, then a conn's mu or the
	// registry's lock; the pool is not called while it is held.
	mu sync.Mutex
	// addrs and healthAddr are set when the listeners are bound.
	addrs      []net.Addr
	healthAddr net.Addr
	// conns holds every client connection.
	conns map[*conn]struct{}
	// loopLns are the listeners the poller's goroutine accepts on.
	loopLns []*loopListener
}

// New validates cfg and returns a proxy. It opens no sockets and starts no
// goroutines: Run does.
func New(cfg Config) (*Proxy, error) {
	cfg.Endpoints = append([]string(nil), cfg.Endpoints...)
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:   cfg,
		log:   cfg.Logger,
		ready: make(chan struct{}),
		conns: make(map[*conn]struct{}),
	}
	pool, err := upstream.New(cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("localproxy: %w", err)
	}
	p.pool, p.probeSchedule = pool, pool.Config()
	if err := checkLivenessThreshold(p.probeSchedule, cfg.LivenessThreshold); err != nil {
		return nil, err
	}
	// Failures seen on held probe connections (endpoint.ProbeHeld)
	// between probes count at once.
	if pr := p.Prober(); pr != nil {
		pr.Reporter = pool
	}
	p.upstreams = endpoint.NewRegistry[*conn](endpoint.RegistryConfig{
		Healthy:       pool.Healthy,
		DrainTimeout:  cfg.DrainTimeout,
		GracefulDrain: GracefulDrainTimeout,
		Logger:        cfg.Logger,
		Prober:        p.Prober(),
	})
	// setDefaults validated the endpoints, so Set cannot fail.
	if err := pool.Set(upstream.SourceStatic, cfg.specs); err != nil {
		return nil, fmt.Errorf("localproxy: %w", err)
	}
	p.m, err = newMetrics(cfg.Registry, pool)
	if err != nil {
		return nil, fmt.Errorf("localproxy: registering metrics: %w", err)
	}
	p.bytesIn, p.bytesOut = p.m.bytes.WithLabelValues("in"), p.m.bytes.WithLabelValues("out")
	if cfg.FirstByteTimeout >= 0 {
		p.fb = newFirstByteWatch(pool, endpoint.OrDefault(cfg.FirstByteTimeout, DefaultFirstByteTimeout), cfg.Logger)
		p.fb.onSilent = p.m.silent.Inc
	}
	p.m.setZone(cfg.Pool.Zone, zoneSource(cfg.Pool.Zone, ZoneFromConfig))
	if cfg.NodeName != "" && cfg.Pool.Zone == "" {
		p.zone = newZoneLearner(nil, cfg.NodeName, cfg.NodeZoneInterval, p.setZone, cfg.Logger.WithName("zone"))
	}
	if cfg.failbackOn() {
		p.back = newFailback(pool, p.upstreams, cfg.FailbackSettle, cfg.FailbackRate, p.m.failedBack, cfg.Logger.WithName("failback"))
	}
	p.workers.Linger = p.workerLinger()
	p.dialer = &endpoint.Dialer{
		Pool:           pool,
		StaggerDelay:   cfg.StaggerDelay,
		AttemptTimeout: cfg.AttemptTimeout,
		Timeout:        cfg.DialTimeout,
		KeepAlive:      cfg.UpstreamKeepAlive,
		UserTimeout:    cfg.UpstreamUserTimeout,
		Go:             p.workers.Go,
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
// is done, then shuts down gracefully: it hands over to a successor bound
// to the same addresses, if there is one (see Config.HandoverTimeout),
// stops accepting, gives open
// connections up to ShutdownTimeout, closes the rest and returns once every
// goroutine it started has returned. It returns an error only when the
// listeners cannot be bound. Run may be called once.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("localproxy: Run called twice")
	}
	p.runAt = time.Now()
	lns, hln, err := p.bind(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	unsubscribe := p.pool.Subscribe(p.onEvent)
	defer unsubscribe()
	// A new CA (--ca-file rotated) may verify what the old one did not.
	defer p.Prober().OnCAChange(p.pool.ResetQuarantine)()

	var bg sync.WaitGroup // everything but the accept loops and connections
	bg.Go(func() { p.pool.Run(runCtx) })
	if p.cfg.StateFile != "" {
		sf := newStateFile(p.cfg.StateFile, p.cfg.Origin, caFingerprints(p.cfg.StateFileCA), p.pool, p.log)
		sf.load()
		bg.Go(func() { sf.run(runCtx) })
	}
	if hln != nil {
		hs := p.newHealthServer()
		bg.Go(func() { p.serveHealth(runCtx, hs, hln) })
	}
	if p.back != nil {
		// Until shutdown begins: connections closed then could not come
		// back.
		bg.Go(func() { p.back.run(ctx) })
	}
	if p.cfg.IdleTimeout > 0 && idleSupported {
		bg.Go(func() { p.reapIdle(runCtx) })
	}
	var discoveryClient kubernetes.Interface
	if p.cfg.Discovery != nil {
		cs, err := newClient(p.cfg.Discovery, "discovery")
		if err != nil {
			p.log.Error(err, "discovery disabled")
		} else {
			discoveryClient = cs
			d := newDiscoveryWith(cs, p.pool, p.cfg.DiscoveryPollInterval, p.log)
			bg.Go(func() { d.Run(runCtx) })
		}
	}
	if p.zone != nil {
		// With the discovery client when it is the same configuration: one
		// connection carries both.
		cs, err := discoveryClient, error(nil)
		if cs == nil || p.cfg.NodeClient != p.cfg.Discovery {
			cs, err = newClient(p.cfg.NodeClient, "node zone")
		}
		if err != nil {
			p.log.Error(err, "the node's zone is not learned")
		} else {
			p.zone.get = cs.CoreV1().Nodes().Get
			bg.Go(func() { p.zone.run(runCtx) })
		}
	}

	// connCtx ends when the shutdown deadline passes: dials in flight then
	// give up.
	connCtx, stopConns := context.WithCancel(runCtx)
	defer stopConns()
	p.connCtx = connCtx
	var loops sync.WaitGroup
	p.accepting.Store(int32(len(lns)))
	for i, ln := range lns {
		if s, ok := p.acceptOnLoop(ln); ok {
			lns[i] = s
			continue
		}
		loops.Go(func() { p.acceptLoop(ctx, ln) })
	}
	close(p.ready)
	p.log.Info("proxy listening", "addrs", addrStrings(lns), "endpoints", p.cfg.Endpoints)

	<-ctx.Done()
	p.stopping.Store(true)
	p.handOver(lns, hln)
	p.unloopListeners()
	for _, ln := range lns {
		ln.Close()
	}
	loops.Wait()
	p.upstreams.StopDrains()
	p.drain(stopConns)
	p.closing.Wait() // at most clientCloseGrace
	p.closePoller()
	p.stopTrim()
	cancel()
	bg.Wait()
	p.Prober().Close() // the pool's Run has returned
	p.workers.Close()
	p.log.Info("proxy stopped")
	return nil
}

// LoopbackCongestionControl returns the TCP congestion control of client
// connections on loopback, as New settled it: a name, or
// SystemCongestionControl.
func (p *Proxy) LoopbackCongestionControl() string { return p.cfg.LoopbackCongestionControl }

// clientOpts are the socket options of a client connection, by the
// address it reached (Proxy.clientOptsFor).
type clientOpts struct {
	// timeouts: keepAlive and userTimeout are set; false: the socket's
	// keepalive and TCP_USER_TIMEOUT are left as they are.
	timeouts               bool
	keepAlive, userTimeout time.Duration
	// cc is the congestion control to set; "" keeps the system's.
	cc string
}

// clientOptsFor returns the options of a client socket whose local
// address is ip. On a loopback address, Config.LoopbackCongestionControl
// (unless SystemCongestionControl), and no keepalive or TCP_USER_TIMEOUT:
// a loopback peer cannot vanish unseen (its kernel is this one, which
// closes its sockets when it exits), so they would only cut off a client
// that stops reading for UserTimeout while the proxy holds data for it
// (since Linux 5.11 a window kept shut counts), where a direct connection
// or HAProxy keeps it: a kubelet stalled under memory pressure, kubectl
// -w piped into a pager. Elsewhere (a client in a pod, on the node's
// address), Config.KeepAlive and UserTimeout, which end a connection
// whose peer's network or namespace went away, and the system's
// congestion control.
func (p *Proxy) clientOptsFor(ip netip.Addr) clientOpts {
	if !ip.Unmap().IsLoopback() {
		return clientOpts{timeouts: true, keepAlive: p.cfg.KeepAlive, userTimeout: p.cfg.UserTimeout}
	}
	if cc := p.cfg.LoopbackCongestionControl; cc != SystemCongestionControl {
		return clientOpts{cc: cc}
	}
	return clientOpts{}
}

// errWildcard: a listener on a wildcard address takes loopback clients
// and others alike, whose options differ (clientOptsFor).
var errWildcard = errors.New("a wildcard listener: loopback connections and others are tuned apart, each")

// setCongestion sets the congestion control cc on the socket of rc;
// with cc "", nothing.
func setCongestion(rc syscall.RawConn, cc string) error {
	if cc == "" {
		return nil
	}
	return onFD(rc, func(fd int) error { return setCongestionFD(fd, cc) })
}

// onFD runs f on the socket of rc and returns f's error, or Control's.
func onFD(rc syscall.RawConn, f func(fd int) error) error {
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// bind opens the client listeners and the health listener.
func (p *Proxy) bind(ctx context.Context) ([]net.Listener, net.Listener, error) {
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	// With no Listen of the caller's, the proxy makes its listeners
	// (listenTuned), with the client connections' socket options.
	own := p.cfg.Listen == nil
	if own {
		p.tunedListeners = map[net.Listener]bool{}
	}
	for _, a := range p.cfg.ListenAddresses {
		var ln net.Listener
		var err error
		if own {
			// The kernel gives accepted sockets the listener's keepalive,
			// TCP_USER_TIMEOUT, TCP_NODELAY and congestion control
			// (clientOptsFor its address): tuneClient is then not needed.
			var tuned bool
			ln, tuned, err = listenTuned(ctx, "tcp", a, func(address string, rc syscall.RawConn) error {
				ap, _ := netip.ParseAddrPort(address)
				if ap.Addr().IsUnspecified() {
					return errWildcard
				}
				o := p.clientOptsFor(ap.Addr())
				if o.timeouts {
					if err := endpoint.TuneTCPListener(rc, o.keepAlive, o.userTimeout); err != nil {
						return err
					}
				}
				if err := setNoDelay(rc); err != nil {
					return err
				}
				return setCongestion(rc, o.cc)
			})
			if err == nil && !tuned {
				p.log.V(2).Info("the listener does not carry the client connections' socket options; each connection is tuned", "addr", ln.Addr().String())
			}
			if tuned {
				p.tunedListeners[ln] = true
			}
		} else {
			ln, err = p.cfg.Listen(ctx, "tcp", a)
		}
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("localproxy: listen: %w", err)
		}
		lns = append(lns, ln)
	}
	var hln net.Listener
	if p.cfg.HealthAddress != "" {
		var err error
		if hln, err = listenReusePort(ctx, "tcp", p.cfg.HealthAddress); err != nil {
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

// parker returns the poller, started on first use, or nil if there is
// none: the copies then wait on their own goroutines.
func (p *Proxy) parker() *poller {
	p.pollInit.Do(func() {
		poll, err := newPoller()
		if err != nil {
			p.log.Error(err, "idle connections keep their goroutines: no poller")
			return
		}
		if poll != nil {
			poll.splicing = &p.splicing
			poll.count = p.count
			p.poll = poll
			go poll.run()
		}
	})
	return p.poll
}

// closePoller stops the poller, if it was started, for good; Run calls it
// once every connection is done.
func (p *Proxy) closePoller() {
	p.pollInit.Do(func() {})
	if p.poll != nil {
		p.poll.close()
	}
}

// drain gives open connections up to ShutdownTimeout, then closes them and
// waits until they are done.
func (p *Proxy) drain(stopConns context.CancelFunc) {
	done := make(chan struct{})
	go func() {
		p.handlers.Wait()
		// Every serve has returned: no more pipes start.
		p.pipes.Wait()
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

// onEvent closes, or drains, the connections of an endpoint that went down
// or was removed, lifts the drain of an endpoint that recovers (see
// endpoint.Registry), and ends the dial holdoff when one comes up or is
// added.
func (p *Proxy) onEvent(ev upstream.Event) {
	p.hold.OnEvent(ev)
	if ev.Kind == upstream.EventRemoved {
		p.fb.forget(ev.Addr)
		p.Prober().Forget(ev.Addr)
	}
	out := p.upstreams.OnEvent(ev)
	if n := out.Closed + out.Drained; n > 0 {
		p.m.failovers.WithLabelValues("endpoint_" + ev.Kind.String()).Add(float64(n))
	}
}

// removedUpstreams lists the endpoints with connections that are not in
// the pool (inPool), in address order.
func (p *Proxy) removedUpstreams(inPool map[string]bool) []RemovedUpstream {
	var out []RemovedUpstream
	for _, e := range p.upstreams.Endpoints(func(addr string) bool { return !inPool[addr] }) {
		out = append(out, RemovedUpstream{Addr: e.Addr, Conns: e.Conns, CloseBy: e.DrainBy})
	}
	return out
}

func addrStrings(lns []net.Listener) []string {
	out := make([]string, len(lns))
	for i, ln := range lns {
		out[i] = ln.Addr().String()
	}
	return out
}

// setZone makes zone, learned from the Node's label, the pool's zone.
func (p *Proxy) setZone(zone string) {
	p.pool.SetZone(zone)
	p.m.setZone(zone, zoneSource(zone, ZoneFromNode))
}

// zoneSource is from for a zone, ZoneFromNone for no zone.
func zoneSource(zone, from string) string {
	if zone == "" {
		return ZoneFromNone
	}
	return from
}
