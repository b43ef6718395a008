package upstream

import (
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

// Run probes every endpoint that is not quarantined, concurrently, once per
// Interval (with jitter) and whenever Kick asks, until ctx is done. It
// returns only after every probe it started has returned.
func (p *Pool) Run(ctx context.Context) error {
	if p.cfg.Prober == nil {
		<-ctx.Done()
		return nil
	}
	minGap := p.cfg.Interval / 4
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last time.Time
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
		p.probeRound(ctx)
		// Rounds keep their cadence: a round that ran into timeouts does
		// not push the next one back.
		timer.Reset(max(p.nextInterval()-time.Since(last), 0))
	}
}

func (p *Pool) nextInterval() time.Duration {
	d := p.cfg.Interval
	if j := p.cfg.Jitter; j > 0 {
		d += time.Duration((rand.Float64()*2 - 1) * j * float64(d))
	}
	return d
}

type probeResult struct {
	addr string
	rtt  time.Duration
	err  error
}

// probeRound probes all endpoints concurrently, each with its own timeout,
// and applies the results together.
func (p *Pool) probeRound(ctx context.Context) {
	p.mu.Lock()
	addrs := make([]string, 0, len(p.eps))
	for addr, e := range p.eps {
		if e.state != StateQuarantined {
			addrs = append(addrs, addr)
		}
	}
	p.mu.Unlock()
	if len(addrs) == 0 {
		return
	}
	results := make(chan probeResult, len(addrs))
	var wg sync.WaitGroup
	for _, addr := range addrs {
		wg.Add(1)
		go p.probeOne(ctx, addr, results, &wg)
	}
	wg.Wait()
	close(results)
	if ctx.Err() != nil {
		return // results of cancelled probes say nothing about the endpoints
	}
	now := time.Now()
	p.mu.Lock()
	for r := range results {
		if e, ok := p.eps[r.addr]; ok {
			p.observeLocked(e, r.rtt, r.err, 0, now)
		}
	}
	p.expireSlowLocked(now)
	p.rebuildLocked()
	p.mu.Unlock()
	p.flush()
}

func (p *Pool) probeOne(ctx context.Context, addr string, results chan<- probeResult, wg *sync.WaitGroup) {
	defer wg.Done()
	pctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	start := time.Now()
	err := p.cfg.Prober.Probe(pctx, addr)
	rtt := time.Since(start)
	if err == nil && pctx.Err() != nil {
		err = pctx.Err()
	}
	p.cfg.Logger.V(4).Info("probe", "addr", addr, "rtt", rtt, "err", errString(err))
	results <- probeResult{addr: addr, rtt: rtt, err: err}
}
