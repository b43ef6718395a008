package workload

import (
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// FailoverServing returns a Config.Serving for a transport.Failover: the
// endpoint holding the most open connections (the one the informer's
// watch and the requests ride on), preferring the pool's preferred
// endpoint on a tie; "" when no connection is open.
func FailoverServing(f *transport.Failover) func() string {
	return func() string {
		conns := f.OpenConns()
		best, most := "", 0
		for _, s := range f.Pool().Status() { // candidate order: deterministic
			n := conns[s.Addr]
			if n > most || (n == most && n > 0 && s.Preferred) {
				best, most = s.Addr, n
			}
		}
		return best
	}
}

// PoolServing returns a Config.Serving for a proxy in this process (a
// localproxy.Proxy's Pool): the endpoint with the most proxied
// connections (the client's and discovery's), the preferred one on a
// tie; "" when none is open.
func PoolServing(p *upstream.Pool) func() string {
	return func() string {
		best, most := "", 0
		for _, s := range p.Status() {
			if s.Conns > most || (s.Conns == most && s.Conns > 0 && s.Preferred) {
				best, most = s.Addr, s.Conns
			}
		}
		return best
	}
}
