package main

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// localhost is what the name localhost stands for in an endpoint: the
// dialer may take either address.
var localhost = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}

// selfEndpoints refuses the static endpoints this proxy accepts clients
// on, such as the server of a kubeconfig that 'localproxy kubeconfig'
// rewrote: every connection to one would come back into the proxy, and be
// sent on again. An endpoint is one when it is on --bind-port and its IP
// address (an IP address, or localhost) is a bind address, or a loopback
// address a wildcard bind address takes: 0.0.0.0 those of IPv4, :: both
// (Go's listeners on :: are dual-stack). Other names are not resolved.
func (b *builder) selfEndpoints(eps []staticEndpoint, l listeners) {
	if !l.bindOK {
		return
	}
	for _, e := range eps {
		host, port, err := net.SplitHostPort(e.spec.Addr)
		if err != nil || port != strconv.Itoa(b.bindPort) {
			continue
		}
		ips := localhost
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else if host != "localhost" {
			continue
		}
		if i := takenBy(l.binds, ips); i >= 0 {
			b.reject("endpoints", e.in, fmt.Sprintf("this proxy accepts clients on %s (%s, %s), so every connection to it would loop back into the proxy; "+
				"want the API servers' own addresses, not the proxy's (a kubeconfig 'localproxy kubeconfig' rewrote has the proxy's)",
				net.JoinHostPort(l.binds[i].String(), port), b.src("bind-address"), b.src("bind-port")))
		}
	}
}

// takenBy returns the index of the first bind address that takes
// connections to one of ips, -1 if none does.
func takenBy(binds, ips []netip.Addr) int {
	for i, bind := range binds {
		for _, ip := range ips {
			switch {
			case bind == ip,
				bind == netip.IPv4Unspecified() && ip.Is4() && ip.IsLoopback(),
				bind == netip.IPv6Unspecified() && ip.IsLoopback():
				return i
			}
		}
	}
	return -1
}
