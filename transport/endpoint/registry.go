package endpoint

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/upstream"
)

// Drain defaults.
const (
	// DefaultGracefulDrain bounds how long connections to a server that
	// still answers but is leaving (it fails /readyz, or left its source
	// while healthy) may go on: the server finishes their requests and
	// closes them itself.
	DefaultGracefulDrain = 10 * time.Second
	// DefaultDrainRecheck is how often drained connections kept past their
	// deadline, because no endpoint was healthy, are looked at again.
	DefaultDrainRecheck = time.Second
)

// Conn is a front end's connection to one endpoint, as a Registry keeps
// it: an HTTP client connection in the transport, a spliced client
// connection in localproxy.
type Conn interface {
	comparable
	// Retire makes the connection take no new work (requests); it closes
	// once the running work is done, at once if there is none, and then
	// calls Registry.Remove. A connection that has no notion of new work
	// does nothing.
	Retire()
	// Close closes the connection now, for the registry: it has
	// forgotten the connection already, and the loss is the pool's doing,
	// not a failure of the endpoint.
	Close()
}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// Healthy reports whether any endpoint is healthy (upstream.Pool.Healthy).
	Healthy func() bool
	// DrainTimeout is how long the connections of an endpoint that went
	// down or was removed may stay. Zero closes them at once.
	DrainTimeout time.Duration
	// GracefulDrain is the least drain for a server that still answers
	// (see Graceful). If zero, DefaultGracefulDrain.
	GracefulDrain time.Duration
	// DrainRecheck: if zero, DefaultDrainRecheck.
	DrainRecheck time.Duration
	// Logger receives a line per endpoint closed, drained or undrained.
	Logger logr.Logger
	// Prober, if set, has its held probe connections follow the
	// registry: an endpoint with connections is in use (NewRegistry sets
	// Prober.InUse), one with a connection waiting for an answer is busy
	// (Prober.Busy, see Registry.Busy), and one that gets a connection
	// while it had none, or a request (Registry.Wake), is woken
	// (Prober.Wake, called without the registry's lock), so that its
	// held connection is PINGed soon.
	Prober *Prober
}

// BusyWindow is how long a connection that sent data and received none
// since counts as waiting for an answer (Registry.Busy): a request
// answered in this time, or a server that fails while one waits this
// long, is seen by PINGs every Prober.PingInterval. Longer than the
// sub-second a hung server takes to be caught, short enough that the
// flow-control updates a client sends after reading a watch event cost
// few PINGs.
const BusyWindow = 2 * time.Second

// QuietFor is how long a connection must have moved no data either way
// before CloseOldest closes it: an answer still arriving, or a request
// being sent, would be cut. Short enough that a connection with a
// request every half second (a controller's writes, their watch events)
// still has moments to be moved in.
const QuietFor = 250 * time.Millisecond

// dataClock is a Conn that tells how long ago its connection to the
// server last sent and received data (SinceData).
type dataClock interface {
	SinceData() (sent, recv time.Duration, ok bool)
}

// heardClock is a Conn that tells how long ago its server last sent it
// data, false if it never did (SinceHeard).
type heardClock interface {
	SinceHeard() (recv time.Duration, ok bool)
}

// Registry is a front end's one registry of connections by endpoint, and
// the drain policy both front ends share. Driven by the pool's events
// (OnEvent), it:
//   - closes at once the connections of an endpoint that went down or was
//     removed, unless a drain applies: a DrainTimeout, or a server that
//     still answers (see Graceful), which gets at least GracefulDrain;
//   - drains: retires the connections (no new work) and closes those still
//     open at the deadline. A drain for an endpoint that went down (not one
//     that was removed) keeps its connections past the deadline while no
//     endpoint is healthy, looked at again every DrainRecheck: every server
//     failing /readyz at once (etcd unavailable) leaves nowhere better to
//     go, and cutting every client then only adds a reconnection storm;
//   - lifts the drain of an endpoint that is healthy again: an etcd hiccup
//     that fails every server's /readyz for a moment must not cost every
//     client its connections. Retired connections stay retired;
//   - refuses (Add) a connection dialed before its endpoint went down or
//     was removed, which the event did not see.
//
// Lock order: a front end may call the registry while holding its own
// lock; the registry calls Conn methods and RegistryConfig.Healthy
// without holding its own.
type Registry[C Conn] struct {
	cfg RegistryConfig

	mu    sync.Mutex // guards the fields below
	conns map[string][]C
	// added holds, per registered connection, the number of its Add:
	// oldest first across endpoints (CloseOldest).
	added  map[C]uint64
	adds   uint64
	drains map[string]*drain[C]
	// dials counts the dials between Begin and End. gen counts EventDown
	// and EventRemoved events; goneAt holds, per endpoint, gen at its
	// latest one while any dial runs (cleared when none does).
	dials  int
	gen    uint64
	goneAt map[string]uint64
	// closed: Close ran; stopped: StopDrains ran.
	closed, stopped bool
}

// drain is the drain of one endpoint's connections.
type drain[C Conn] struct {
	by    time.Time
	conns map[C]struct{}
	// keepAlone: the endpoint went down (rather than being removed): at
	// the deadline its connections stay while no endpoint is healthy.
	keepAlone bool
	timer     *time.Timer
	armed     int // times timer was armed
}

func (dr *drain[C]) stop() {
	if dr.timer != nil {
		dr.timer.Stop()
	}
}

// NewRegistry returns an empty registry. Create it before cfg.Prober's
// first probe: it sets the Prober's InUse.
func NewRegistry[C Conn](cfg RegistryConfig) *Registry[C] {
	cfg.GracefulDrain = OrDefault(cfg.GracefulDrain, DefaultGracefulDrain)
	cfg.DrainRecheck = OrDefault(cfg.DrainRecheck, DefaultDrainRecheck)
	if cfg.Healthy == nil {
		cfg.Healthy = func() bool { return true }
	}
	r := &Registry[C]{
		cfg:    cfg,
		conns:  make(map[string][]C),
		added:  make(map[C]uint64),
		drains: make(map[string]*drain[C]),
		goneAt: make(map[string]uint64),
	}
	if cfg.Prober != nil {
		cfg.Prober.InUse = func(addr string) bool { return r.Len(addr) > 0 }
		cfg.Prober.Busy = r.Busy
		cfg.Prober.Heard = r.Heard
	}
	return r
}

// Busy reports whether some connection to addr waits for an answer: it
// sent data less than BusyWindow ago and has received none since. A Conn
// that cannot tell (not a dataClock, or not over TCP on Linux) counts as
// waiting while it is open.
func (r *Registry[C]) Busy(addr string) bool {
	return slices.ContainsFunc(r.Conns(addr), waiting[C])
}

// Heard reports whether some connection to addr received data less
// than within ago, and how long ago (that connection's); false if none
// did or none can tell (a Conn that is not a heardClock).
func (r *Registry[C]) Heard(addr string, within time.Duration) (ago time.Duration, ok bool) {
	for _, c := range r.Conns(addr) {
		hc, isClock := any(c).(heardClock)
		if !isClock {
			continue
		}
		if recv, heard := hc.SinceHeard(); heard && recv < within {
			return recv, true
		}
	}
	return 0, false
}

// waiting reports whether c waits for an answer (see Busy).
func waiting[C Conn](c C) bool {
	sent, recv, ok := sinceData(c)
	return !ok || waitingFor(sent, recv)
}

// waitingFor: data sent less than BusyWindow ago, none received since.
func waitingFor(sent, recv time.Duration) bool { return sent < BusyWindow && sent < recv }

// movable reports whether c may be closed without failing a request: it
// waits for no answer and moved no data either way for QuietFor; false
// if it cannot tell.
func movable[C Conn](c C) bool {
	sent, recv, ok := sinceData(c)
	return ok && !waitingFor(sent, recv) && sent >= QuietFor && recv >= QuietFor
}

// sinceData is c's SinceData if it is a dataClock; ok is false if not.
func sinceData[C Conn](c C) (sent, recv time.Duration, ok bool) {
	dc, isClock := any(c).(dataClock)
	if !isClock {
		return 0, 0, false
	}
	return dc.SinceData()
}

// Wake tells the Prober (RegistryConfig.Prober), if any, that a request
// was just written to addr: its held connection is PINGed soon, and then
// while addr is busy (see Busy). Call it without holding locks the
// Prober could wait on; it does not block.
func (r *Registry[C]) Wake(addr string) { r.cfg.Prober.Wake(addr) }

// Begin is called before a dial picks its candidates; it returns the mark
// to give Add. Every Begin must be followed by one End once the dial's
// connection was added or dropped.
func (r *Registry[C]) Begin() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dials++
	return r.gen
}

// End ends a dial started with Begin.
func (r *Registry[C]) End() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dials--; r.dials == 0 {
		clear(r.goneAt)
	}
}

// Add registers c, a connection to addr dialed since began (Begin). It
// returns false, registering nothing, when addr went down or was removed
// since, or the registry is closed: the caller closes c.
func (r *Registry[C]) Add(addr string, c C, began uint64) bool {
	r.mu.Lock()
	if r.closed || r.goneAt[addr] > began {
		r.mu.Unlock()
		return false
	}
	r.conns[addr] = append(r.conns[addr], c)
	r.adds++
	r.added[c] = r.adds
	first := len(r.conns[addr]) == 1
	r.mu.Unlock()
	if first {
		r.cfg.Prober.Wake(addr)
	}
	return true
}

// Remove forgets c, a connection to addr, if it is registered.
func (r *Registry[C]) Remove(addr string, c C) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeLocked(addr, c)
}

func (r *Registry[C]) removeLocked(addr string, c C) {
	cs := r.conns[addr]
	i := slices.Index(cs, c)
	if i < 0 {
		return
	}
	cs = slices.Delete(cs, i, i+1)
	delete(r.added, c)
	if len(cs) == 0 {
		delete(r.conns, addr)
	} else {
		r.conns[addr] = cs
	}
	if d := r.drains[addr]; d != nil {
		delete(d.conns, c)
		if len(d.conns) == 0 {
			d.stop()
			delete(r.drains, addr)
		}
	}
}

// Conns returns the connections to addr, oldest first.
func (r *Registry[C]) Conns(addr string) []C {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.conns[addr])
}

// Len returns the number of connections to addr.
func (r *Registry[C]) Len(addr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns[addr])
}

// Counts returns the number of connections per endpoint.
func (r *Registry[C]) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.conns))
	for addr, cs := range r.conns {
		out[addr] = len(cs)
	}
	return out
}

// EndpointConns is the connections of one endpoint, as Endpoints lists
// them.
type EndpointConns struct {
	Addr  string
	Conns int
	// DrainBy is the deadline of the endpoint's drain, zero if none.
	DrainBy time.Time
}

// Endpoints lists the endpoints with connections for which keep returns
// true, in address order.
func (r *Registry[C]) Endpoints(keep func(addr string) bool) []EndpointConns {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EndpointConns
	for addr, cs := range r.conns {
		if !keep(addr) {
			continue
		}
		e := EndpointConns{Addr: addr, Conns: len(cs)}
		if d := r.drains[addr]; d != nil {
			e.DrainBy = d.by
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b EndpointConns) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// Retire retires the connections to the endpoints for which which returns
// true, and returns how many it asked.
func (r *Registry[C]) Retire(which func(addr string) bool) int {
	r.mu.Lock()
	var cs []C
	for addr, conns := range r.conns {
		if which(addr) {
			cs = append(cs, conns...)
		}
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.Retire()
	}
	return len(cs)
}

// CloseOldest closes the oldest connection (by Add) to the endpoints for
// which which returns true, skipping those drained (their drain closes
// them), those waiting for an answer (see Busy: closing one would fail
// its request) and those that moved data less than QuietFor ago (an
// answer arriving: its request, past waiting, would fail all the same),
// and returns its endpoint. The connection is forgotten
// before Close, as for a drain. ok is false when there was none to close;
// skipped then counts those skipped as waiting or not quiet, so that the
// caller can try again later. which is called without the registry's
// lock.
func (r *Registry[C]) CloseOldest(which func(addr string) bool) (addr string, skipped int, ok bool) {
	r.mu.Lock()
	addrs := make([]string, 0, len(r.conns))
	for a := range r.conns {
		addrs = append(addrs, a)
	}
	r.mu.Unlock()
	addrs = slices.DeleteFunc(addrs, func(a string) bool { return !which(a) })
	if len(addrs) == 0 {
		return "", 0, false
	}
	type cand struct {
		addr string
		c    C
		seq  uint64
	}
	var cands []cand
	r.mu.Lock()
	for _, a := range addrs {
		dr := r.drains[a]
		for _, c := range r.conns[a] {
			if dr != nil {
				if _, drained := dr.conns[c]; drained {
					continue
				}
			}
			cands = append(cands, cand{a, c, r.added[c]})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(cands, func(x, y cand) int { return cmp.Compare(x.seq, y.seq) })
	for _, k := range cands {
		if !movable(k.c) { // reads the socket: not under the lock
			skipped++
			continue
		}
		r.mu.Lock()
		_, still := r.added[k.c]
		if still {
			r.removeLocked(k.addr, k.c)
		}
		r.mu.Unlock()
		if !still {
			continue // closed meanwhile
		}
		k.c.Close()
		return k.addr, skipped, true
	}
	return "", skipped, false
}

// Outcome says what OnEvent did to an endpoint's connections.
type Outcome struct {
	// Closed counts connections closed at once; Drained those drained, by
	// Deadline.
	Closed, Drained int
	Deadline        time.Time
	// Undrained counts connections whose drain was lifted.
	Undrained int
}

// OnEvent applies the drain policy to the connections of ev's endpoint
// (see Registry) and reports what it did.
func (r *Registry[C]) OnEvent(ev upstream.Event) Outcome {
	switch ev.Kind {
	case upstream.EventDown, upstream.EventRemoved:
		return r.gone(ev)
	case upstream.EventUp:
		return r.undrain(ev.Addr)
	}
	return Outcome{}
}

func (r *Registry[C]) gone(ev upstream.Event) Outcome {
	d := r.cfg.DrainTimeout
	if Graceful(ev) {
		d = max(d, r.cfg.GracefulDrain)
	}
	r.mu.Lock()
	r.gen++
	if r.dials > 0 {
		r.goneAt[ev.Addr] = r.gen
	}
	cs := slices.Clone(r.conns[ev.Addr])
	if len(cs) == 0 {
		r.mu.Unlock()
		return Outcome{}
	}
	if d <= 0 {
		// Closed at once, drained ones included.
		delete(r.conns, ev.Addr)
		for _, c := range cs {
			delete(r.added, c)
		}
		if dr := r.drains[ev.Addr]; dr != nil {
			dr.stop()
			delete(r.drains, ev.Addr)
		}
		r.mu.Unlock()
		for _, c := range cs {
			c.Close()
		}
		r.cfg.Logger.Info("closed connections to endpoint", "endpoint", ev.Addr, "reason", ev.Kind.String(), "conns", len(cs))
		return Outcome{Closed: len(cs)}
	}
	by := time.Now().Add(d)
	dr := r.drains[ev.Addr]
	switch {
	case dr == nil:
		dr = &drain[C]{by: by, keepAlone: ev.Kind == upstream.EventDown, conns: make(map[C]struct{}, len(cs))}
		r.drains[ev.Addr] = dr
		r.armLocked(ev.Addr, dr, d)
	case ev.Kind == upstream.EventRemoved:
		// Removed while drained for going down: closed by the deadline
		// whatever else is healthy, the earlier deadline kept.
		dr.keepAlone = false
		if by.Before(dr.by) {
			dr.by = by
			dr.stop()
			r.armLocked(ev.Addr, dr, d)
		}
	}
	for _, c := range cs {
		dr.conns[c] = struct{}{}
	}
	by = dr.by
	r.mu.Unlock()
	for _, c := range cs {
		c.Retire()
	}
	r.cfg.Logger.Info("draining connections to endpoint", "endpoint", ev.Addr, "reason", ev.Kind.String(), "conns", len(cs), "timeout", d)
	return Outcome{Drained: len(cs), Deadline: by}
}

// armLocked starts dr's timer, to fire after d.
func (r *Registry[C]) armLocked(addr string, dr *drain[C], d time.Duration) {
	if r.stopped {
		return
	}
	dr.armed++
	armed := dr.armed
	dr.timer = time.AfterFunc(d, func() { r.expire(addr, dr, armed) })
}

// expire closes the connections of dr, addr's drain, when its timer armed
// for the armed-th time fired, unless dr keeps them while no endpoint is
// healthy.
func (r *Registry[C]) expire(addr string, dr *drain[C], armed int) {
	alone := !r.cfg.Healthy() // before r.mu: the pool has its own lock
	r.mu.Lock()
	if r.drains[addr] != dr || dr.armed != armed {
		r.mu.Unlock()
		return // lifted or re-armed meanwhile
	}
	if dr.keepAlone && alone && !r.stopped && !r.closed {
		r.armLocked(addr, dr, r.cfg.DrainRecheck)
		r.mu.Unlock()
		r.cfg.Logger.V(2).Info("keeping drained connections: no endpoint is healthy", "endpoint", addr, "conns", len(dr.conns))
		return
	}
	delete(r.drains, addr)
	cs := make([]C, 0, len(dr.conns))
	for c := range dr.conns {
		cs = append(cs, c)
		r.removeLocked(addr, c)
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	if len(cs) > 0 {
		r.cfg.Logger.Info("drain deadline passed; closed connections to endpoint", "endpoint", addr, "conns", len(cs))
	}
}

// undrain lifts the drain of addr, healthy again.
func (r *Registry[C]) undrain(addr string) Outcome {
	r.mu.Lock()
	dr := r.drains[addr]
	if dr == nil {
		r.mu.Unlock()
		return Outcome{}
	}
	dr.stop()
	delete(r.drains, addr)
	r.mu.Unlock()
	r.cfg.Logger.Info("endpoint healthy again; its drained connections stay", "endpoint", addr, "conns", len(dr.conns))
	return Outcome{Undrained: len(dr.conns)}
}

// StopDrains stops every drain timer and arms no more: the front end is
// shutting down and closes its connections itself.
func (r *Registry[C]) StopDrains() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, dr := range r.drains {
		dr.stop()
	}
}

// Close closes every connection and refuses later ones.
func (r *Registry[C]) Close() {
	r.mu.Lock()
	r.closed = true
	var cs []C
	for _, conns := range r.conns {
		cs = append(cs, conns...)
	}
	clear(r.conns)
	clear(r.added)
	for _, dr := range r.drains {
		dr.stop()
	}
	clear(r.drains)
	r.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}
