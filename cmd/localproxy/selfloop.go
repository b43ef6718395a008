package main

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
)

// localhost is what the name localhost stands for in an endpoint: the
// dialer may take either address.
var localhost = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}

// selfEndpoints refuses the static endpoints this proxy accepts clients
// on, such as the server of a kubeconfig that 'localproxy kubeconfig'
// rewrote: every connection to one would come back into the proxy, and be
// sent on again. An endpoint is one when it is on --bind-port and its IP
// address (an IP address, or localhost) is a bind address, or an address
// of this host a wildcard bind address takes (a loopback address, or one
// of the host's interfaces at start), IPv4 and IPv6 alike: Go listens on
// 0.0.0.0 as on ::, one dual-stack socket. Other names are not resolved.
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
		if i := takenBy(l.binds, ips, hostAddrs); i >= 0 {
			b.reject("endpoints", e.in, fmt.Sprintf("this proxy accepts clients on %s (%s, %s), so every connection to it would loop back into the proxy; "+
				"want the API servers' own addresses, not the proxy's (a kubeconfig 'localproxy kubeconfig' rewrote has the proxy's)",
				net.JoinHostPort(l.binds[i].String(), port), b.src("bind-address"), b.src("bind-port")))
		}
	}
}

// takenBy returns the index of the first bind address that takes
// connections to one of ips, -1 if none does. A wildcard bind address
// takes those to the host's own addresses (ownAddrs, asked only then).
func takenBy(binds, ips []netip.Addr, ownAddrs func() []netip.Addr) int {
	var own []netip.Addr
	for i, bind := range binds {
		if !bind.IsUnspecified() {
			if slices.Contains(ips, bind) {
				return i
			}
			continue
		}
		for _, ip := range ips {
			if ip.IsLoopback() || ip.IsUnspecified() { // a connection to 0.0.0.0 or :: is one to this host
				return i
			}
			if own == nil {
				own = ownAddrs()
			}
			if slices.Contains(own, ip) {
				return i
			}
		}
	}
	return -1
}

// hostAddrs returns the addresses of this host's network interfaces,
// IPv4-mapped ones as IPv4; none if they cannot be read.
var hostAddrs = func() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return []netip.Addr{}
	}
	own := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			own = append(own, p.Addr().Unmap())
		}
	}
	return own
}
