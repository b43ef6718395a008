package endpoint

import (
	"context"
	"time"

	"github.com/apifailover/apifailover/transport/upstream"
)

// PingTimeout is how long a PING may go unanswered after the round trips
// samples (the first one seeds the estimate, as the TCP connect does).
func PingTimeout(samples ...time.Duration) time.Duration {
	var e RTTEstimator
	for _, s := range samples {
		e.Sample(s)
	}
	return pingTimeout(&e)
}

// RunPingLoop runs the PING schedule of a held connection whose connect
// took seed, with ping sending one PING, until a PING fails or lost is
// closed (the failure to report is returned) or ctx is done (zero).
func RunPingLoop(ctx context.Context, interval, seed time.Duration, ping func(context.Context) error, lost <-chan struct{}) (upstream.Failure, error) {
	return RunPingLoopWith(ctx, PingLoopHooks{Interval: interval, Seed: seed, Ping: ping, Lost: lost})
}

// PingLoopHooks are a PING schedule's parameters and what it tells, for
// RunPingLoopWith.
type PingLoopHooks struct {
	Interval, IdleInterval, UnusedInterval, Seed time.Duration
	InUse                                        func() bool
	Busy                                         func() bool
	Heard                                        func(within time.Duration) (time.Duration, bool)
	Waker                                        *Waker
	Ping                                         func(context.Context) error
	Lost, Retired                                <-chan struct{}
	Late                                         func(error)
	Answered                                     func()
	GoingAway                                    func() bool
}

// RunPingLoopWith runs a PING schedule as RunPingLoop does, with h.
func RunPingLoopWith(ctx context.Context, h PingLoopHooks) (upstream.Failure, error) {
	l := &pingLoop{interval: h.Interval, idleInterval: h.IdleInterval, unusedInterval: h.UnusedInterval, busy: h.Busy, heard: h.Heard, inUse: h.InUse, w: h.Waker.w(), ping: h.Ping, lost: h.Lost, retired: h.Retired,
		lostErr: func() error { return errLost }, late: h.Late, answered: h.Answered, goingAway: h.GoingAway}
	l.rtt.Sample(h.Seed)
	return l.run(ctx)
}

// ConfirmTimeout is how long a PING with the given timeout may go
// unanswered before the connection counts as lost.
func ConfirmTimeout(timeout time.Duration) time.Duration { return confirmTimeout(timeout) }

// Woken reports whether addr's held channel of p was woken (Prober.Wake)
// since the last call, and takes the wake; the first call makes the
// channel.
func Woken(p *Prober, addr string) bool {
	h, err := p.held.get(addr)
	if err != nil {
		return false
	}
	select {
	case <-h.w.ch:
		return true
	default:
		return false
	}
}

// HeldIdle reports whether a held channel probed at probes (since a start)
// is idle at now, for a Prober whose QuietInterval is quiet.
func HeldIdle(quiet time.Duration, probes []time.Duration, now time.Duration) bool {
	start := time.Unix(1e9, 0)
	h := &heldEndpoint{}
	for _, d := range probes {
		h.probed(start.Add(d))
	}
	return h.idle(start.Add(now), quiet)
}

// Awake reports whether addr's held PING loop of p runs at its busy
// interval, so that Wake sends it nothing.
func Awake(p *Prober, addr string) bool {
	h, err := p.held.get(addr)
	return err == nil && h.w.awake.Load()
}

// RequestFailed is the error of a held connection's GET /readyz sent at
// start that got none (err), heard telling whether the server sent data
// on a client connection since.
func RequestFailed(err error, start time.Time, heard bool) error {
	c := &heldConn{w: &watchedConn{lost: make(chan struct{})}}
	return c.requestFailed(err, start, heard)
}

// Waker tells a PING loop of requests sent, as Prober.Wake does.
type Waker struct{ wk *waker }

// NewWaker returns a Waker for PingLoopHooks.
func NewWaker() *Waker { return &Waker{newWaker()} }

// Wake tells the loop that a request was just sent.
func (w *Waker) Wake() { w.wk.wake() }

func (w *Waker) w() *waker {
	if w == nil {
		return nil
	}
	return w.wk
}

// OnHeldEnded runs f in the watch of each held connection between the end
// of its PING loop (the connection lost, going away or idle) and its
// close, until the returned function is called.
func OnHeldEnded(f func()) (restore func()) {
	heldEnded.Store(&f)
	return func() { heldEnded.Store(nil) }
}
