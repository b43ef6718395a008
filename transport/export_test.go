package transport

import "time"

// SetGracefulDrain shortens how long drained connections may stay busy, for
// tests that do not run in parallel; it returns a function restoring it.
func SetGracefulDrain(d time.Duration) (restore func()) {
	old := gracefulDrain
	gracefulDrain = d
	return func() { gracefulDrain = old }
}

// CheckTLSFiles checks f's CA and client certificate files now, as its
// timer does every Options.TLSReloadInterval.
func CheckTLSFiles(f *Failover) { f.tls.CheckNow() }
