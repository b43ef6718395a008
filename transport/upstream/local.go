package upstream

import (
	"net"
	"net/netip"
)

// localAddrs answers whether an IP address belongs to this host. The
// interface addresses are read once, when the pool is created.
type localAddrs struct {
	addrs map[netip.Addr]bool
}

func newLocalAddrs() *localAddrs {
	l := &localAddrs{addrs: make(map[netip.Addr]bool)}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return l
	}
	for _, a := range ifaddrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			l.addrs[pfx.Addr().Unmap()] = true
		}
	}
	return l
}

func (l *localAddrs) isLocal(host string) bool {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap().WithZone("")
	return ip.IsLoopback() || l.addrs[ip]
}
