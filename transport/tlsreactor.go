package transport

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// tlsReactor checks a Failover's TLS files every interval for its
// lifetime and acts on changes, whoever saw them (its timer, a probe or a
// dial): a new client certificate retires the request connections, which
// presented the old one; a new CA probes quarantined endpoints again.
type tlsReactor struct {
	files                 *endpoint.TLSFiles
	pool                  *upstream.Pool
	conns                 *connPool
	interval, dialTimeout time.Duration
	log                   logr.Logger
	// certChanged and caChanged are signalled by the watches' subscribers.
	certChanged, caChanged chan struct{}
	cancels                []func()
}

func newTLSReactor(files *endpoint.TLSFiles, pool *upstream.Pool, conns *connPool, interval, dialTimeout time.Duration, log logr.Logger) *tlsReactor {
	r := &tlsReactor{
		files: files, pool: pool, conns: conns, interval: interval, dialTimeout: dialTimeout, log: log,
		certChanged: make(chan struct{}, 1), caChanged: make(chan struct{}, 1),
	}
	r.cancels = append(r.cancels,
		files.OnCertChange(func() { signal(r.certChanged) }),
		files.OnCAChange(func() { signal(r.caChanged) }))
	return r
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run works until ctx is done.
func (r *tlsReactor) run(ctx context.Context) {
	defer func() {
		for _, c := range r.cancels {
			c()
		}
	}()
	tick := time.NewTimer(r.interval)
	defer tick.Stop()
	// again retires once more a dial timeout after a certificate change:
	// a connection whose handshake took the old certificate just before
	// the change may join the pool just after the first retire.
	again := time.NewTimer(r.dialTimeout)
	again.Stop()
	defer again.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.files.CheckNow()
			tick.Reset(r.interval)
		case <-r.certChanged:
			r.retire()
			again.Reset(r.dialTimeout)
		case <-again.C:
			r.retire()
		case <-r.caChanged:
			r.log.Info("CA changed: probing endpoints quarantined for certificate errors again")
			r.pool.ResetQuarantine()
		}
	}
}

// retire makes every request connection take no new requests and close
// once its running requests are done, so that new requests handshake with
// the current client certificate.
func (r *tlsReactor) retire() {
	n := r.conns.retire(func(string) bool { return true })
	r.log.Info("client certificate changed: retiring connections", "conns", n)
}
