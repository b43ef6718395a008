package localproxy

import (
	"net"
	"time"
)

// CopyEnds are the two connections pipe copies between for one client.
type CopyEnds struct {
	// Client is the accepted client connection.
	Client net.Conn
	// Upstream is the upstream's underlying connection (not the
	// endpoint.TrackedConn around it).
	Upstream net.Conn
}

// CopyEnds returns the ends of every client connection that has an
// upstream, in no particular order.
func (p *Proxy) CopyEnds() []CopyEnds {
	var out []CopyEnds
	for _, c := range p.snapshot() {
		c.mu.Lock()
		if c.upRaw != nil {
			out = append(out, CopyEnds{Client: c.client, Upstream: c.upRaw})
		}
		c.mu.Unlock()
	}
	return out
}

// Liveness is what /healthz answers now: nil for 200.
func (p *Proxy) Liveness() error { return p.live(time.Now()) }

// SetHealthReadHeaderTimeout sets how long the health server waits for a
// request's headers, instead of its default.
func SetHealthReadHeaderTimeout(c *Config, d time.Duration) { c.health.readHeaderTimeout = d }

// CAFingerprints is caFingerprints, for tests.
var CAFingerprints = caFingerprints
