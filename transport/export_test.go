package transport

import (
	"context"
	"errors"
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

// GetJoiningADial runs f's get(exclude) while a dial for first, started
// by another request with other candidates, is under way, and lets that
// dial end with a connection to won, as one that lost its race to won
// does; it returns the address of the connection get returns.
func GetJoiningADial(ctx context.Context, f *Failover, first, won string, exclude map[string]bool) (string, error) {
	p := f.conns
	c := p.reserve(won)
	if c == nil {
		return "", errors.New("no connection to " + won)
	}
	c.cc.Release()
	call := &dialCall{done: make(chan struct{})}
	p.mu.Lock()
	p.dialing[first] = call
	p.mu.Unlock()
	go func() {
		time.Sleep(100 * time.Millisecond) // get waits on call by then
		p.mu.Lock()
		delete(p.dialing, first)
		call.c = c
		p.mu.Unlock()
		close(call.done)
	}()
	got, err := p.get(ctx, exclude)
	if err != nil {
		return "", err
	}
	got.cc.Release()
	return got.addr, nil
}
