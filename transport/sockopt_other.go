//go:build !linux

package transport

import (
	"syscall"
	"time"
)

// setUserTimeout is a no-op where TCP_USER_TIMEOUT does not exist.
func setUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
