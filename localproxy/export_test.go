package localproxy

import (
	"context"
	"net"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CopyEnds are the two connections pipe copies between for one client.
type CopyEnds struct {
	// Client is the accepted client connection; nil when the loop
	// accepted it.
	Client net.Conn
	// Upstream is the upstream's underlying connection (not the
	// endpoint.TrackedConn around it); nil when the loop dialed it.
	Upstream net.Conn
	// ClientAddr and ClientLocal are the client connection's remote and
	// local addresses, UpstreamAddr the upstream's.
	ClientAddr, ClientLocal, UpstreamAddr net.Addr
	// OnLoop: the poller's loop copies; the net.Conns, if any, are
	// closed, and FDs are the client's and the upstream's descriptors.
	OnLoop bool
	FDs    [2]int
}

// CopyEnds returns the ends of every client connection that has an
// upstream, in no particular order.
func (p *Proxy) CopyEnds() []CopyEnds {
	var out []CopyEnds
	for _, c := range p.snapshot() {
		c.mu.Lock()
		if c.upRaw != nil || (c.ev != nil && c.dial == nil && c.loopFDs()[1] >= 0) {
			e := CopyEnds{Client: c.client, Upstream: c.upRaw, ClientAddr: c.clientAddr(), ClientLocal: c.clientLocal(), UpstreamAddr: c.upstreamAddr()}
			if c.ev != nil && !c.closed {
				e.OnLoop, e.FDs = true, c.loopFDs()
			}
			out = append(out, e)
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

// ZoneLearner is the reader of the Node's zone label, for tests.
type ZoneLearner struct{ l *zoneLearner }

// NewZoneLearner returns the learner of node's zone with get, calling
// apply with each zone learned.
func NewZoneLearner(get func(context.Context, string, metav1.GetOptions) (*corev1.Node, error), node string, interval time.Duration, apply func(string), log logr.Logger) *ZoneLearner {
	return &ZoneLearner{newZoneLearner(get, node, interval, apply, log)}
}

// Run reads the Node until ctx is done.
func (z *ZoneLearner) Run(ctx context.Context) { z.l.run(ctx) }

// Problem is why the last read learned no zone.
func (z *ZoneLearner) Problem() string { return z.l.status() }

// Lingering is the client connections closed FIN first whose full close
// is still to come.
func (p *Proxy) Lingering() int64 { return p.lingering.Load() }

// SetClientCloseGrace sets how long a client connection the proxy closes
// stays open after its FIN, instead of the default.
func SetClientCloseGrace(c *Config, d time.Duration) { c.clientCloseGrace = d }

// SetTrim replaces the burst and the quiet time of the memory trim.
func SetTrim(c *Config, burst int, quiet time.Duration) { c.trimBurst, c.trimQuiet = burst, quiet }

// Trims returns how many times p returned memory after a burst.
func (p *Proxy) Trims() int64 { return p.trims.Load() }

// TrimIdleWorkers is how many workers waited for a connection to set up
// at the last trim.
func (p *Proxy) TrimIdleWorkers() int64 { return p.trimIdle.Load() }

// SetCheckCongestionControl replaces CheckCongestionControl where New
// checks Config.LoopbackCongestionControl, until restore.
func SetCheckCongestionControl(f func(string) error) (restore func()) {
	prev := checkCongestionControl
	checkCongestionControl = f
	return func() { checkCongestionControl = prev }
}
