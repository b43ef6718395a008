package localproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// First-byte watch: a client of the API server speaks first (its TLS
// ClientHello), and a live server answers within a few round trips. An
// upstream that has sent nothing by the first-byte deadline after the
// client's first flight went upstream (firstFlight: a client that
// trickles it is not watched; a reset counts only after a ClientHello) is
// silent: hung (SIGSTOP, a wedged
// process, a kernel that still completes TCP handshakes for it) or
// unreachable beyond the first hop. A connection past its deadline ranks
// its endpoint after the others at once, before locality and RTT tier
// (upstream.Pool.AddStalled), until it answers or ends, so that the next
// client does not wait on the same server. silentThreshold silent connections
// within silentWindow make the endpoint suspect in the pool at once, so new
// client connections go elsewhere while the probes decide whether it is
// down; the connections already spliced to it are not cut. A first byte
// from a suspect endpoint trusts it again at once.
const (
	// DefaultFirstByteTimeout is the floor of the first-byte deadline.
	DefaultFirstByteTimeout = 250 * time.Millisecond
	// maxFirstByteTimeout caps the deadline, and the samples that teach
	// it: an endpoint answering after seconds is silent, whatever it did
	// before.
	maxFirstByteTimeout = 3 * time.Second
	silentThreshold     = 2
	silentWindow        = 2 * time.Second
)

// flight is what a client's first read holds, for the first-byte watch.
type flight uint8

const (
	// flightPartial: fewer than 5 bytes, or a handshake record header
	// promising more than came. A server has nothing to answer yet: the
	// client is slow (trickling a slowloris, or stalled itself), not the
	// server, and the watch is not armed.
	flightPartial flight = iota
	// flightHello: a whole TLS handshake record, a ClientHello (a TLS
	// client sends it in one write, and on loopback it arrives in one
	// read). A live server answers it within a few round trips.
	flightHello
	// flightOther: 5 bytes or more that are no handshake record (garbage,
	// plain HTTP). A live server answers at once, often by closing with
	// the bytes unread (a reset): only its silence counts, not its reset.
	flightOther
)

// firstFlight says what b, a client's first read, is.
func firstFlight(b []byte) flight {
	const header = 5 // type, version (2), length (2)
	switch {
	case len(b) < header:
		return flightPartial
	case b[0] != 0x16: // not a handshake record
		return flightOther
	case len(b) < header+int(binary.BigEndian.Uint16(b[3:header])):
		return flightPartial
	}
	return flightHello
}

// firstByteWatch learns, per endpoint, how fast the first byte comes back,
// and reports silent endpoints to the pool.
//
// The deadline is the endpoint.RTTEstimator rule over the first-byte
// times of the endpoint's connections: max(floor, 2·SRTT + 4·RTTVAR), at
// most maxFirstByteTimeout, where SRTT and RTTVAR are the smoothed time
// and its mean deviation (gains 1/8 and 1/4). A loaded server that is consistently slow to answer raises its own
// deadline; a server that stops answering is caught a few hundred
// milliseconds after the client spoke.
type firstByteWatch struct {
	pool  *upstream.Pool
	floor time.Duration
	log   logr.Logger
	// onSilent, if set, is called for every silent connection.
	onSilent func()

	mu  sync.Mutex // guards eps; the pool is not called while it is held
	eps map[string]*firstByteEndpoint
}

type firstByteEndpoint struct {
	rtt     endpoint.RTTEstimator // of the first bytes
	silent  []time.Time           // silent connections within silentWindow
	suspect bool                  // reported silent; cleared by an answer
}

func newFirstByteWatch(pool *upstream.Pool, floor time.Duration, log logr.Logger) *firstByteWatch {
	return &firstByteWatch{pool: pool, floor: floor, log: log, eps: make(map[string]*firstByteEndpoint)}
}

func (w *firstByteWatch) endpointLocked(addr string) *firstByteEndpoint {
	e := w.eps[addr]
	if e == nil {
		e = &firstByteEndpoint{}
		w.eps[addr] = e
	}
	return e
}

// timeout returns addr's first-byte deadline.
func (w *firstByteWatch) timeout(addr string) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.eps[addr]
	if e == nil {
		return w.floor
	}
	return e.rtt.Timeout(w.floor, maxFirstByteTimeout)
}

// answered records that addr's first byte came d after the client's first
// bytes went upstream, and trusts a suspect endpoint again.
func (w *firstByteWatch) answered(addr string, d time.Duration) {
	d = min(d, maxFirstByteTimeout)
	w.mu.Lock()
	e := w.endpointLocked(addr)
	e.rtt.Sample(d)
	e.silent = e.silent[:0]
	trust := e.suspect
	e.suspect = false
	w.mu.Unlock()
	if trust {
		w.log.Info("endpoint answers again", "endpoint", addr, "firstByte", d)
		w.pool.ReportAnswered(addr)
	}
}

// silent records a connection to addr that went silent (why says how),
// and makes addr suspect once silentThreshold did within silentWindow.
func (w *firstByteWatch) silent(addr string, why error) {
	now := time.Now()
	w.mu.Lock()
	e := w.endpointLocked(addr)
	kept := e.silent[:0]
	for _, t := range e.silent {
		if now.Sub(t) < silentWindow {
			kept = append(kept, t)
		}
	}
	e.silent = append(kept, now)
	report := len(e.silent) >= silentThreshold
	newly := report && !e.suspect
	if report {
		e.silent = e.silent[:0]
		e.suspect = true
	}
	w.mu.Unlock()
	if w.onSilent != nil {
		w.onSilent()
	}
	if newly {
		w.log.Info("endpoint silent: new connections go elsewhere until it answers or its probes decide", "endpoint", addr, "err", why.Error())
	}
	if report {
		w.pool.ReportFailure(addr, upstream.FailureSilent, why)
	}
}

// forget drops what was learned about addr (removed from the pool).
func (w *firstByteWatch) forget(addr string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.eps, addr)
	w.mu.Unlock()
}

// firstByte watches one connection: armed when the client's first bytes
// went upstream (sent), settled by the upstream's first byte (received)
// or its failure (failed).
type firstByte struct {
	w    *firstByteWatch
	addr string

	// mu guards the fields below; the pool is not called while it is
	// held.
	mu     sync.Mutex
	hello  bool // the client's first flight was a ClientHello (flightHello)
	sentAt time.Time
	timer  *time.Timer
	// loop, if set, is the poller whose goroutine runs the connection's
	// copies, and lt the deadline there instead of timer: sent, received
	// and failed run on that goroutine, which alone arms it, and the
	// latter two disarm it (a deadline left armed bounds the poller's
	// waits and wakes it, for nothing). Stopped elsewhere, the watch is
	// settled and the deadline, when it comes, does nothing.
	loop     *poller
	lt       loopTimer
	expired  bool // the deadline passed first
	settled  bool // the upstream answered or failed
	waiting  bool // counted in the pool's AddWaiting
	stalled  bool // counted in the pool's AddStalled
	deadline time.Duration
}

func (w *firstByteWatch) watch(addr string) *firstByte {
	if w == nil {
		return nil
	}
	return &firstByte{w: w, addr: addr}
}

// sent arms the deadline: the client's first flight went upstream.
// A partial one does not.
func (f *firstByte) sent(fl flight) {
	if f == nil || fl == flightPartial {
		return
	}
	d := f.w.timeout(f.addr)
	f.mu.Lock()
	if f.settled || !f.sentAt.IsZero() {
		f.mu.Unlock()
		return
	}
	f.sentAt, f.deadline, f.waiting, f.hello = time.Now(), d, true, fl == flightHello
	if f.loop != nil {
		// A Go timer would cost a wakeup of another thread per
		// connection, the loop's none.
		f.lt.fire = func(time.Time) { f.expire() }
		f.loop.at(&f.lt, f.sentAt.Add(d))
	} else {
		f.timer = time.AfterFunc(d, f.expire)
	}
	f.mu.Unlock()
	f.w.pool.AddWaiting(f.addr, 1)
}

// counted is what a watch has counted in the pool, to be taken back when
// it settles.
type counted struct{ waiting, stalled bool }

// settleLocked settles the watch; the caller calls unwait after f.mu.
func (f *firstByte) settleLocked() counted {
	f.settled = true
	f.stopLocked()
	c := counted{waiting: f.waiting, stalled: f.stalled}
	f.waiting, f.stalled = false, false
	return c
}

func (f *firstByte) unwait(c counted) {
	if c.stalled {
		f.w.pool.AddStalled(f.addr, -1)
	}
	if c.waiting {
		f.w.pool.AddWaiting(f.addr, -1)
	}
}

// expire: the deadline passed with no byte from the upstream. The
// connection counts as stalled in the pool until it settles, so that new
// connections go elsewhere at once, and as silent (see silent).
func (f *firstByte) expire() {
	f.mu.Lock()
	if f.settled {
		f.mu.Unlock()
		return
	}
	f.expired = true
	d := f.deadline
	f.mu.Unlock()
	f.w.pool.AddStalled(f.addr, 1)
	f.mu.Lock()
	// Settled while the pool was told: take it back here, settle did not.
	undo := f.settled
	f.stalled = !undo
	f.mu.Unlock()
	if undo {
		f.w.pool.AddStalled(f.addr, -1)
	}
	f.w.silent(f.addr, fmt.Errorf("no byte from the upstream %v after the client's first bytes", d))
}

// received settles the watch with the upstream's first byte.
func (f *firstByte) received() {
	if f == nil {
		return
	}
	f.stopLoop()
	f.mu.Lock()
	if f.settled || f.sentAt.IsZero() {
		f.settleLocked()
		f.mu.Unlock()
		return
	}
	w := f.settleLocked()
	d := time.Since(f.sentAt)
	f.mu.Unlock()
	f.unwait(w)
	f.w.answered(f.addr, d)
}

// stopLoop disarms the deadline on the loop, from the poller's goroutine:
// received and failed of a connection on the loop.
func (f *firstByte) stopLoop() {
	if f.loop != nil {
		f.loop.stop(&f.lt)
	}
}

// failed settles the watch with the upstream's read error before its first
// byte: a reset right after the client's ClientHello counts as silence;
// one after anything else (the server's answer to garbage) does not, nor
// does an end the proxy or the client caused (closed).
func (f *firstByte) failed(err error, closed bool) {
	if f == nil {
		return
	}
	f.stopLoop()
	f.mu.Lock()
	count := !f.settled && !f.expired && !f.sentAt.IsZero() && f.hello && !closed &&
		!errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isTimeout(err)
	w := f.settleLocked()
	f.mu.Unlock()
	f.unwait(w)
	if count {
		f.w.silent(f.addr, fmt.Errorf("the upstream failed before its first byte: %w", err))
	}
}

// stop ends the watch (the connection ends).
func (f *firstByte) stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	w := f.settleLocked()
	f.mu.Unlock()
	f.unwait(w)
}

func (f *firstByte) stopLocked() {
	if f.timer != nil {
		f.timer.Stop()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
