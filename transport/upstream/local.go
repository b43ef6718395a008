package upstream

import (
	"net"
	"net/netip"

	"github.com/go-logr/logr"
)

// localAddrs answers whether an IP address belongs to this host. The
// interface addresses are read once, when the pool is created.
type localAddrs struct {
	addrs map[netip.Addr]bool
}

// newLocalAddrs reads this host's interface addresses; it logs to log
// when it cannot (on Linux they come through a netlink socket, which a
// sandbox may forbid: systemd's RestrictAddressFamilies without
// AF_NETLINK), and then only loopback addresses are local.
func newLocalAddrs(log logr.Logger) *localAddrs {
	l := &localAddrs{addrs: make(map[netip.Addr]bool)}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		log.Info("cannot read this host's addresses: an API server on this host counts as local only at a loopback address", "err", err.Error())
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
