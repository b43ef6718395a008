package localproxy

import (
	"runtime/debug"
	"time"

	"github.com/apifailover/apifailover/transport/endpoint"
)

// After a burst of new connections (a node's clients reconnecting after a
// failover or a restart, at boot) the proxy holds what the burst left:
// the stacks of the goroutines that served the connections until they
// parked, and the garbage of their set-up, which no collection reclaims
// while the proxy is idle (Go collects at the latest every two minutes,
// and returns freed pages to the system gradually after that). Measured
// with 1,000 connections opened at once and left idle: 13 MiB more
// resident memory than before them, 4 MiB once collected and returned.
// So once trimBurst connections have been accepted since the last trim
// and none for trimQuiet, the proxy collects and returns the freed memory
// (debug.FreeOSMemory): a few milliseconds of CPU after each burst, and
// nothing at rest or under a steady trickle of new connections.
const (
	trimBurst = 256
	trimQuiet = time.Second
)

// noteAccept counts an accepted connection towards the next trim, and
// puts the trim off until trimQuiet without one.
func (p *Proxy) noteAccept() {
	if p.sinceTrim.Add(1) < p.trimBurst() {
		return
	}
	quiet := endpoint.OrDefault(p.cfg.trimQuiet, trimQuiet)
	p.trimMu.Lock()
	defer p.trimMu.Unlock()
	if p.trimTimer == nil {
		p.trimTimer = time.AfterFunc(quiet, p.trim)
	} else {
		p.trimTimer.Reset(quiet)
	}
}

// trimBurst is the package's, or Config.trimBurst (tests).
func (p *Proxy) trimBurst() int64 {
	if p.cfg.trimBurst > 0 {
		return int64(p.cfg.trimBurst)
	}
	return trimBurst
}

// trim collects garbage and returns the freed memory to the system.
// The workers that set the burst's connections up have exited by then
// (see workerLinger), so their stacks are freed with it.
func (p *Proxy) trim() {
	n := p.sinceTrim.Swap(0)
	idle := p.workers.Idle()
	p.trimIdle.Store(int64(idle))
	began := time.Now()
	debug.FreeOSMemory()
	p.trims.Add(1)
	p.log.V(4).Info("returned memory to the system after a burst of connections", "accepted", n, "idleWorkers", idle, "took", time.Since(began))
}

// workerLinger is how long a worker that set a connection up waits for
// the next before it exits: a quarter of the trim's quiet time, so that
// a burst's workers are gone when the trim after it runs, and long
// enough for a steady stream of new connections to reuse them.
func (p *Proxy) workerLinger() time.Duration {
	return endpoint.OrDefault(p.cfg.trimQuiet, trimQuiet) / 4
}

// stopTrim stops a pending trim, as Run returns.
func (p *Proxy) stopTrim() {
	p.trimMu.Lock()
	defer p.trimMu.Unlock()
	if p.trimTimer != nil {
		p.trimTimer.Stop()
	}
}
