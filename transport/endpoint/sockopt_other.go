//go:build !linux

package endpoint

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }

// SinceData cannot tell here: ok is always false.
func SinceData(net.Conn) (sent, recv time.Duration, ok bool) { return 0, 0, false }

// SinceHeard cannot tell here: ok is always false.
func SinceHeard(net.Conn) (recv time.Duration, ok bool) { return 0, false }

// SinceDataFD cannot tell here: ok is always false.
func SinceDataFD(int) (sent, recv time.Duration, ok bool) { return 0, 0, false }

// SinceHeardFD cannot tell here: ok is always false.
func SinceHeardFD(int) (recv time.Duration, ok bool) { return 0, false }

// TuneTCPListener is not done here: accepted sockets are tuned with
// TuneTCP.
func TuneTCPListener(syscall.RawConn, time.Duration, time.Duration) error {
	return errors.ErrUnsupported
}

// TuneTCPFD is not done here.
func TuneTCPFD(int, time.Duration, time.Duration) error { return errors.ErrUnsupported }
