package upstream

import (
	"github.com/apifailover/apifailover/internal/monotime"

	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Kick asks the probe loop to run a round soon (at most one round per
// quarter interval), for example after a passive failure or when new
// endpoints were added. It never blocks.
func (p *Pool) Kick() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run probes the endpoints once per Interval (with jitter) and whenever Kick
// asks, until ctx is done: every endpoint that is not quarantined in every
// round, a quarantined one in the first round after its backoff has passed
// (see Config.QuarantineBackoff). Probes run concurrently, at most
// MaxConcurrentProbes at once. It returns only after every probe it started
// has returned.
func (p *Pool) Run(ctx context.Context) error {
	if p.cfg.Prober == nil {
		<-ctx.Done()
		return nil
	}
	minGap := p.cfg.Interval / 4
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	lastLocal := time.Now() // New asked IsLocal
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-p.kick:
			if wait := minGap - time.Since(last); wait > 0 {
				timer.Reset(wait)
				continue
			}
		}
		last = time.Now()
		p.active.Store(monotime.Of(last))
		p.probeRound(ctx)
		if time.Since(lastLocal) >= localEvery {
			lastLocal = time.Now()
			p.refreshLocal()
		}
		// Rounds keep their cadence: a round that ran into timeouts does
		// not push the next one back.
		timer.Reset(max(p.nextInterval()-time.Since(last), 0))
	}
}

// refreshLocal asks IsLocal again for every endpoint (after reading the
// host's addresses again, with the default IsLocal), and reorders the
// endpoints once an answer changed at two reads in a row: an address that
// comes and goes between two reads (a DHCP renewal, a VIP moving and back)
// moves no connection, where each change would move all of them (to a
// local endpoint fail-back moves connections at once, its settle time
// counting from when the endpoint became healthy).
func (p *Pool) refreshLocal() {
	if p.readLocal != nil {
		p.readLocal()
	}
	p.mu.Lock()
	hosts := make(map[string]string, len(p.eps))
	for addr, e := range p.eps {
		hosts[addr] = e.host
	}
	p.mu.Unlock()
	local := make(map[string]bool, len(hosts))
	for addr, host := range hosts {
		local[addr] = p.cfg.IsLocal(host) // may be slow: not under mu
	}
	p.mu.Lock()
	for addr, l := range local {
		e := p.eps[addr]
		switch {
		case e == nil:
		case e.local == l:
			e.localChanged = false
		case !e.localChanged:
			e.localChanged = true // at the next read, if it holds
		default:
			e.local, e.localChanged = l, false
			p.dirty = true
			p.cfg.Logger.Info("endpoint locality changed", "addr", addr, "local", l)
		}
	}
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
}

func (p *Pool) nextInterval() time.Duration {
	if p.cfg.QuietInterval > p.cfg.Interval && p.quiet() {
		return p.jitter(p.cfg.QuietInterval)
	}
	return p.jitter(p.cfg.Interval)
}

// quiet reports whether every endpoint is healthy with no failure
// counted, and not suspect, draining or slow (see
// Config.QuietInterval).
func (p *Pool) quiet() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.order {
		if e.state != StateHealthy || e.fail > 0 || e.suspect || e.draining || !e.slowUntil.IsZero() {
			return false
		}
	}
	return true
}

// jitter spreads d by ±Jitter×d.
func (p *Pool) jitter(d time.Duration) time.Duration {
	if j := p.cfg.Jitter; j > 0 {
		d += time.Duration((rand.Float64()*2 - 1) * j * float64(d))
	}
	return d
}

// probeJob is one probe of a round. qGen is the endpoint's quarantine
// generation for a re-probe of a quarantined endpoint, zero otherwise;
// suspectGen its suspicion count when the probe was asked, suspect
// whether it was suspect then (see Suspected).
type probeJob struct {
	addr       string
	qGen       uint64
	suspectGen uint64
	suspect    bool
}

type suspectedKey struct{}

// WithSuspected returns ctx marked for the probe of a suspect endpoint
// (see Suspected).
func WithSuspected(ctx context.Context) context.Context {
	return context.WithValue(ctx, suspectedKey{}, true)
}

// Suspected reports whether ctx is a probe's of an endpoint that is
// suspect: new connections to it failed or stayed silent. Only such a
// probe's success lifts the suspicion, so a Prober that can answer from
// what it saw earlier (a held connection whose PINGs were answered) must
// check what made it suspect, over a new connection.
func Suspected(ctx context.Context) bool {
	v, _ := ctx.Value(suspectedKey{}).(bool)
	return v
}

type probeResult struct {
	probeJob
	rtt time.Duration
	err error
}

// probeRound probes the endpoints that are due, each with its own timeout,
// at most MaxConcurrentProbes at once, and applies the results together.
func (p *Pool) probeRound(ctx context.Context) {
	now := time.Now()
	p.mu.Lock()
	jobs := make([]probeJob, 0, len(p.eps))
	for addr, e := range p.eps {
		switch {
		case e.state != StateQuarantined:
			jobs = append(jobs, probeJob{addr: addr, suspectGen: e.suspectGen, suspect: e.suspect})
		case !now.Before(e.qNext):
			jobs = append(jobs, probeJob{addr: addr, qGen: e.qGen})
		}
	}
	p.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	queue := make(chan probeJob, len(jobs))
	for _, j := range jobs {
		queue <- j
	}
	close(queue)
	workers := len(jobs)
	if n := p.cfg.MaxConcurrentProbes; n > 0 {
		workers = min(workers, n)
	}
	results := make(chan probeResult, len(jobs))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go p.probeWorker(ctx, queue, results, &wg)
	}
	wg.Wait()
	close(results)
	if ctx.Err() != nil {
		return // results of cancelled probes say nothing about the endpoints
	}
	now = time.Now()
	p.mu.Lock()
	for r := range results {
		e, ok := p.eps[r.addr]
		switch {
		case !ok:
		case e.state != StateQuarantined:
			p.observeLocked(e, r.rtt, r.err, 0, r.suspectGen == e.suspectGen, now)
		case r.qGen == e.qGen:
			p.reprobedLocked(e, r.rtt, r.err, now)
		default:
			// Quarantined while this probe ran (or again since it
			// started): the probe may predate the certificate failure.
		}
	}
	p.expireSlowLocked(now)
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
}

// probeWorker runs the probes of a round from queue until it is empty or
// ctx is done.
func (p *Pool) probeWorker(ctx context.Context, queue <-chan probeJob, results chan<- probeResult, wg *sync.WaitGroup) {
	defer wg.Done()
	for j := range queue {
		if ctx.Err() != nil {
			return
		}
		results <- p.probeOne(ctx, j)
	}
}

func (p *Pool) probeOne(ctx context.Context, j probeJob) probeResult {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if j.suspect {
		pctx = WithSuspected(pctx)
	}
	start := time.Now()
	p.active.Store(monotime.Of(start))
	var (
		rtt time.Duration
		err error
	)
	if rp, ok := p.cfg.Prober.(RTTProber); ok {
		rtt, err = rp.ProbeRTT(pctx, j.addr)
	} else {
		err = p.cfg.Prober.Probe(pctx, j.addr)
	}
	if rtt <= 0 {
		rtt = time.Since(start)
	}
	if err == nil && pctx.Err() != nil {
		err = pctx.Err()
	}
	p.cfg.Logger.V(4).Info("probe", "addr", j.addr, "quarantined", j.qGen != 0, "rtt", rtt, "err", errString(err))
	return probeResult{probeJob: j, rtt: rtt, err: err}
}
