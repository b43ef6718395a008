package transport

import (
	"net/http"
	"net/http/httptrace"
	"time"
)

// CheckTLSFiles checks f's CA and client certificate files now, as its
// timer does every Options.TLSReloadInterval.
func CheckTLSFiles(f *Failover) { f.tls.CheckNow() }

// RequestPingInterval is how long f's request connections may go without
// a frame from the server before they are pinged.
func RequestPingInterval(f *Failover) time.Duration { return f.conns.t.HTTP2.SendPingTimeout }

// TraceWrites returns req to send with the hook that calls wake's
// WroteHeaders once its header block was written, and wrote for a request
// that is not idempotent (nil otherwise).
func TraceWrites(req *http.Request, wake *httptrace.ClientTrace) (send *http.Request, wrote func() bool) {
	return traceWrites(req, wake)
}
