package endpoint

import (
	"net"
	"time"
)

// TuneTCP sets keepalive and TCP_USER_TIMEOUT on a TCP connection, the
// socket options both front ends want on every connection, to a server or
// from a client: keepAlive > 0 enables keepalive with that idle time and
// probe interval (3 probes), otherwise keepalive is off; userTimeout > 0
// sets TCP_USER_TIMEOUT (Linux; elsewhere nothing), otherwise the system
// default stays. Connections that are not TCP are left alone. A failure
// leaves the connection working with the system defaults.
func TuneTCP(nc net.Conn, keepAlive, userTimeout time.Duration) error {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	var err error
	if keepAlive > 0 {
		err = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAlive, Interval: keepAlive, Count: 3})
	} else {
		err = tc.SetKeepAlive(false)
	}
	if err != nil {
		return err
	}
	if userTimeout > 0 {
		rc, err := tc.SyscallConn()
		if err != nil {
			return err
		}
		return setUserTimeout(rc, userTimeout)
	}
	return nil
}
