package localproxy

import (
	"github.com/apifailover/apifailover/internal/monotime"

	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Accept backoff after errors such as EMFILE: doubling from min to max.
const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
	// acceptStuckAfter: a listener whose Accept has failed for this long
	// without a single success fails /healthz, so that a supervisor
	// that watches it (kubelet's liveness probe) restarts a proxy that
	// can no longer take clients.
	acceptStuckAfter = 30 * time.Second
)

// nextAcceptBackoff is the accept backoff after delay (0: none yet), for
// a failed accept and a shortage alike: doubling from minAcceptBackoff up
// to maxAcceptBackoff.
func nextAcceptBackoff(delay time.Duration) time.Duration {
	return min(max(2*delay, minAcceptBackoff), maxAcceptBackoff)
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

// shortage is a run of dials that failed for want of a descriptor or of
// memory on this host (upstream.IsLocalError), begun after the last dial
// that connected or failed for the endpoints' own reasons, or after
// shortageOngoing without such a failure. Accepting
// backs off during it as after a failed accept, so that clients wait in
// the listen backlog for descriptors to come free instead of being
// accepted and closed in a loop.
type shortage struct {
	// until is when accepting may resume (monotime: a step of the wall
	// clock moves no pause); 0 outside a run.
	until atomic.Int64
	mu    sync.Mutex // guards the fields below
	delay time.Duration
	since time.Time // the run's first failure
	last  time.Time // its latest
	err   error     // the latest's
}

// shortageOngoing is how recent a run's latest failure must be for the
// run to fail /healthz once it is acceptStuckAfter old: a shortage that
// stopped (its clients gave up, or none came since) is not one.
const shortageOngoing = 5 * maxAcceptBackoff

// shortOf records that c's dial failed with err, this host's own
// shortage: accepting backs off, doubling from minAcceptBackoff up to
// maxAcceptBackoff, and c is counted as rejected for local_resources.
func (p *Proxy) shortOf(c *conn, err error) {
	s := &p.short
	now := time.Now()
	s.mu.Lock()
	// A run whose latest failure is older than shortageOngoing stopped:
	// this one begins a new run, with the least pause.
	first := s.since.IsZero() || now.Sub(s.last) >= shortageOngoing
	if first {
		s.since, s.delay = now, 0
	}
	s.last, s.err = now, err
	s.delay = nextAcceptBackoff(s.delay)
	delay := s.delay
	s.until.Store(monotime.Of(now.Add(delay)))
	s.mu.Unlock()
	p.m.rejected.WithLabelValues("local_resources").Inc()
	log := p.log.V(1)
	if first {
		log = p.log
	}
	log.Info("out of descriptors or memory for a connection to an API server; accepting backs off",
		"client", c.clientName(), "err", err.Error(), "delay", delay)
}

// dialed ends a shortage, if any: a dial connected, or failed for the
// endpoints' own reasons (its sockets could be opened).
func (p *Proxy) dialed() {
	s := &p.short
	if s.until.Load() == 0 {
		return
	}
	s.mu.Lock()
	s.delay, s.since, s.last, s.err = 0, time.Time{}, time.Time{}, nil
	s.until.Store(0)
	s.mu.Unlock()
}

// acceptPaused returns when accepting may resume in a shortage, zero if
// it may now.
func (p *Proxy) acceptPaused() time.Time {
	u := p.short.until.Load()
	if u == 0 {
		return time.Time{}
	}
	if at := monotime.Time(u); time.Now().Before(at) {
		return at
	}
	return time.Time{}
}

// stuckAccepting returns an error naming a listener whose Accept has
// failed for acceptStuckAfter or longer without a success, or a shortage
// as old that goes on, nil if none.
func (p *Proxy) stuckAccepting(now time.Time) error {
	s := &p.short
	s.mu.Lock()
	since, last, err := s.since, s.last, s.err
	s.mu.Unlock()
	if d := now.Sub(since); !since.IsZero() && d >= acceptStuckAfter && now.Sub(last) < shortageOngoing {
		return fmt.Errorf("no connection to an API server could be opened for %v for want of local resources: %w", d.Round(time.Second), err)
	}
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
func (p *Proxy) acceptLoop(ctx context.Context, ln net.Listener) {
	defer p.accepting.Add(-1)
	defer p.acceptFailing.Delete(ln)
	tuned := p.tunedListeners[ln]
	var delay time.Duration
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	wait := func(d time.Duration) bool {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	for {
		if at := p.acceptPaused(); !at.IsZero() && !wait(time.Until(at)) {
			return
		}
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			delay = p.acceptFailed(ln, err, delay)
			if !wait(delay) {
				return
			}
			continue
		}
		if delay != 0 {
			p.acceptFailing.Delete(ln)
			delay = 0
		}
		if !p.admit(nc.RemoteAddr()) {
			nc.Close()
			continue
		}
		c := &conn{p: p, client: nc, tuned: tuned}
		p.track(c)
		p.serveConn(c)
	}
}

// acceptFailed records a failed accept on ln, the run of failures that
// began after the last success (delay 0) or goes on, and returns how long
// to back off: doubling from minAcceptBackoff up to maxAcceptBackoff.
func (p *Proxy) acceptFailed(ln net.Listener, err error, delay time.Duration) time.Duration {
	if delay == 0 {
		p.acceptFailing.Store(ln, &acceptFailure{addr: ln.Addr().String(), since: time.Now(), err: err})
	} else if f, ok := p.acceptFailing.Load(ln); ok {
		f.(*acceptFailure).setErr(err)
	}
	delay = nextAcceptBackoff(delay)
	p.m.acceptErrors.Inc()
	p.log.V(1).Info("accept failed; backing off", "addr", ln.Addr().String(), "err", err.Error(), "delay", delay)
	return delay
}

// admit counts an accepted connection and tells whether it may be
// served: false past MaxConnections, and the caller closes it.
func (p *Proxy) admit(client net.Addr) bool {
	p.m.accepted.Inc()
	p.noteAccept()
	// An open connection holds two descriptors, one closed FIN first
	// one for clientCloseGrace (closeClient): MaxConnections bounds
	// them all.
	if max := p.cfg.MaxConnections; max > 0 && 2*p.active.Load()+p.lingering.Load() >= 2*int64(max) {
		p.m.rejected.WithLabelValues("max_connections").Inc()
		p.log.V(2).Info("too many connections; closing", "client", client.String(), "max", max)
		return false
	}
	return true
}

// track counts c open, until forget.
func (p *Proxy) track(c *conn) {
	p.active.Add(1)
	p.m.active.Inc()
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

// serveConn serves c on a worker goroutine, which Run's drain waits for.
func (p *Proxy) serveConn(c *conn) {
	p.handlers.Add(1)
	p.workers.Go(func() {
		defer p.handlers.Done()
		p.serve(p.connCtx, c)
	})
}

func (p *Proxy) forget(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	if c.addr != "" {
		p.upstreams.Remove(c.addr, c)
	}
	p.active.Add(-1)
	p.m.active.Dec()
}
