package upstream

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// localEvery is how often the probe loop asks again which endpoints are
// on this host (Pool.refreshLocal): a proxy started before the node's
// address was configured (a static pod, a unit ordered early in boot), or
// a node whose address changed, learns that its own API server is local.
const localEvery = 30 * time.Second

// localAddrs answers whether an IP address belongs to this host, from
// the interface addresses it read last (read).
type localAddrs struct {
	log    logr.Logger
	mu     sync.RWMutex
	addrs  map[netip.Addr]bool
	failed bool // the last read failed; logged once per run of failures
}

// newLocalAddrs reads this host's interface addresses (read).
func newLocalAddrs(log logr.Logger) *localAddrs {
	l := &localAddrs{log: log, addrs: make(map[netip.Addr]bool)}
	l.read()
	return l
}

// read reads this host's interface addresses again. It logs when it
// cannot (on Linux they come through a netlink socket, which a sandbox
// may forbid: systemd's RestrictAddressFamilies without AF_NETLINK), and
// then keeps those it read before (none at first: only loopback
// addresses are local).
func (l *localAddrs) read() {
	ifaddrs, err := hostAddrs()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if !l.failed {
			l.log.Info("cannot read this host's addresses: an API server on this host counts as local only at a loopback address or one read before", "err", err.Error())
		}
		l.failed = true
		return
	}
	l.failed = false
	addrs := make(map[netip.Addr]bool, len(ifaddrs))
	for _, a := range ifaddrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			addrs[pfx.Addr().Unmap()] = true
		}
	}
	l.addrs = addrs
}

// ipvsInterface is the dummy interface kube-proxy's IPVS mode puts every
// Service's ClusterIP on, the kubernetes Service's (the in-cluster origin)
// among them: none of them is an API server on this host. Counted as
// local, the origin would outrank every API server discovered, on every
// node, and take all requests through kube-proxy.
const ipvsInterface = "kube-ipvs0"

// hostAddrs returns the addresses of this host's interfaces, but those
// of ipvsInterface.
func hostAddrs() ([]net.Addr, error) {
	all, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	ipvs, err := net.InterfaceByName(ipvsInterface)
	if err != nil {
		return all, nil // none
	}
	skip, err := ipvs.Addrs()
	if err != nil {
		return nil, err
	}
	keep := all[:0]
	for _, a := range all {
		if !slices.ContainsFunc(skip, func(s net.Addr) bool { return s.String() == a.String() }) {
			keep = append(keep, a)
		}
	}
	return keep, nil
}

func (l *localAddrs) isLocal(host string) bool {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap().WithZone("")
	if ip.IsLoopback() {
		return true
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.addrs[ip]
}
