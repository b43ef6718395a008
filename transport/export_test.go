package transport

import "time"

// CheckTLSFiles checks f's CA and client certificate files now, as its
// timer does every Options.TLSReloadInterval.
func CheckTLSFiles(f *Failover) { f.tls.CheckNow() }

// RequestPingInterval is how long f's request connections may go without
// a frame from the server before they are pinged.
func RequestPingInterval(f *Failover) time.Duration { return f.conns.t.HTTP2.SendPingTimeout }
