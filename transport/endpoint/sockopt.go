package endpoint

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// keepAliveProbes is how many unanswered keepalive probes end a
// connection that TuneTCP or TuneTCPListener tuned.
const keepAliveProbes = 3

// TuneTCP sets keepalive and TCP_USER_TIMEOUT on a TCP connection, the
// socket options both front ends want on every connection, to a server or
// from a client: keepAlive > 0 enables keepalive with that idle time and
// probe interval (3 probes), otherwise keepalive is off; userTimeout > 0
// sets TCP_USER_TIMEOUT (Linux; elsewhere nothing), otherwise the system
// default stays. Connections that are not TCP are left alone. Both are
// tried; a failure leaves the connection working with the system
// defaults.
func TuneTCP(nc net.Conn, keepAlive, userTimeout time.Duration) error {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	var kerr, uerr error
	if keepAlive > 0 {
		kerr = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAlive, Interval: keepAlive, Count: keepAliveProbes})
	} else {
		kerr = tc.SetKeepAlive(false)
	}
	if kerr != nil {
		kerr = fmt.Errorf("keepalive: %w", kerr)
	}
	if userTimeout > 0 {
		rc, err := tc.SyscallConn()
		if err == nil {
			err = setUserTimeout(rc, userTimeout)
		}
		if err != nil {
			uerr = fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
		}
	}
	return errors.Join(kerr, uerr)
}

// tcpUnder returns the *net.TCPConn under nc, unwrapping NetConn methods
// (*tls.Conn, TrackedConn), or nil.
func tcpUnder(nc net.Conn) *net.TCPConn {
	for range 8 {
		switch c := nc.(type) {
		case *net.TCPConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}
