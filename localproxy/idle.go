package localproxy

import (
	"context"
	"math/rand/v2"
	"runtime"
	"time"
)

// reapIdle closes connections that carried no data for IdleTimeout,
// checking about four times per IdleTimeout. The kernel keeps the time of
// the last data sent and received per socket, so the splice path needs no
// per-read bookkeeping.
func (p *Proxy) reapIdle(ctx context.Context) {
	every := max(p.cfg.IdleTimeout/4, 10*time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range p.snapshot() {
			if d, ok := c.idle(); ok && d >= p.cfg.IdleTimeout {
				p.m.closed.WithLabelValues("idle").Inc()
				p.log.V(4).Info("closing idle connection", "client", c.clientName(), "idle", d)
				c.close()
			}
		}
		// ±10% jitter so that many proxies do not wake together.
		t.Reset(time.Duration(float64(every) * (0.9 + 0.2*rand.Float64())))
	}
}

// idle returns how long c's client socket has neither sent nor received
// data, from the kernel (endpoint.SinceData); ok is false when that
// cannot be read.
func (c *conn) idle() (time.Duration, bool) {
	sent, recv, ok := c.sinceData(0)
	return min(sent, recv), ok
}

// idleSupported: the kernel tells how long a socket carried no data
// (endpoint.SinceData reads TCP_INFO on Linux only).
const idleSupported = runtime.GOOS == "linux"
