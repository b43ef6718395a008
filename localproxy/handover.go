package localproxy

import (
	"context"
	"net"
	"net/http"
	"syscall"
	"time"
)

// DefaultHandoverTimeout is how long a stopping proxy waits for a
// successor bound to its addresses to become ready (Config.HandoverTimeout).
const DefaultHandoverTimeout = 2 * time.Second

// handoverPoll is how often a stopping proxy asks its successor's /readyz.
const handoverPoll = 20 * time.Millisecond

// handoverSettle is how long a stopping proxy keeps accepting after it
// steered new connections to its successor: handshakes the kernel had
// begun on its socket before complete in that time on a loopback address.
const handoverSettle = 50 * time.Millisecond

// handoverQuiet is how long the accept queues of a stopping proxy must stay
// empty before it closes them, and handoverDrainMax the most it waits for
// that.
const (
	handoverQuiet    = 50 * time.Millisecond
	handoverDrainMax = time.Second
)

// listenReusePort listens on address with SO_REUSEPORT where supported
// (Linux), so that a new proxy binds the addresses of the one it
// replaces while that one still serves, and removes a steering program a
// previous hand-over left on the group (see steerToNewest). The socket is
// plain TCP, not Multipath TCP (which Go would otherwise choose where the
// kernel has it): the kernel's reuseport steering and TCP_INFO work on
// TCP sockets only, and a loopback listener gains nothing from MPTCP.
func listenReusePort(ctx context.Context, network, address string) (net.Listener, error) {
	ln, _, err := listenTuned(ctx, network, address, nil)
	return ln, err
}

// listenTuned is listenReusePort that also runs tune, if not nil, on the
// socket before it binds (with the address it binds, resolved): options
// set then are in every socket accepted from it
// (endpoint.TuneTCPListener), none of which can have completed its
// handshake earlier. tuned tells whether tune succeeded; its failure
// leaves the listener as listenReusePort makes it.
func listenTuned(ctx context.Context, network, address string, tune func(address string, rc syscall.RawConn) error) (ln net.Listener, tuned bool, err error) {
	// KeepAlive -1: Go's accept would set keepalive (15s) on each
	// connection, four system calls more than the client connections'
	// own settings, which come from tune or tuneClient.
	lc := net.ListenConfig{KeepAlive: -1, Control: func(network, address string, c syscall.RawConn) error {
		if err := reusePortControl(network, address, c); err != nil {
			return err
		}
		tuned = tune != nil && tune(address, c) == nil
		return nil
	}}
	lc.SetMultipathTCP(false)
	ln, err = lc.Listen(ctx, network, address)
	if err != nil {
		return nil, false, err
	}
	clearSteering(ln)
	return ln, tuned, nil
}

// handOver runs when Run's context is done, before the listeners close.
// If another process listens on the same address as one of lns (a
// successor bound with SO_REUSEPORT), it waits, up to HandoverTimeout,
// until that successor's /readyz on the health address answers 200
// (this proxy's own /readyz fails from the moment it stops), then steers
// new connections to the successor inside the kernel and keeps accepting
// until its accept queue is empty: nothing queued on a socket that is
// about to close is lost. With no successor it returns at once.
func (p *Proxy) handOver(lns []net.Listener, hln net.Listener) {
	if p.cfg.HandoverTimeout < 0 {
		return
	}
	type peer struct {
		ln     net.Listener
		others int
	}
	var peers []peer
	for _, ln := range lns {
		if n := otherListeners(ln); n > 0 {
			peers = append(peers, peer{ln, n})
		}
	}
	if len(peers) == 0 {
		return
	}
	start := time.Now()
	deadline := start.Add(p.cfg.HandoverTimeout)
	ready := p.awaitSuccessor(deadline)
	p.log.Info("successor listening; handing over", "ready", ready, "waited", time.Since(start).Round(time.Millisecond))
	steer := peers
	if hln != nil {
		if n := otherListeners(hln); n > 0 {
			steer = append(steer[:len(steer):len(steer)], peer{hln, n})
		}
	}
	for _, pr := range steer {
		if err := steerToNewest(pr.ln, pr.others+1); err != nil {
			p.log.Error(err, "steering new connections to the successor failed", "addr", pr.ln.Addr().String())
		}
	}
	// Keep accepting what the kernel queued on these sockets before the
	// steering, then until their accept queues have stayed empty for
	// handoverQuiet: on a loaded machine a handshake begun before the
	// steering, or the accept loop's next Accept, can take longer than
	// handoverSettle, and what is queued when the socket closes is reset.
	// Bounded by handoverDrainMax.
	t := time.NewTimer(handoverSettle)
	defer t.Stop()
	<-t.C
	end := time.Now().Add(handoverDrainMax)
	quietSince := time.Now()
	for time.Now().Before(end) && time.Since(quietSince) < handoverQuiet {
		for _, pr := range peers {
			if acceptQueued(pr.ln) > 0 {
				quietSince = time.Now()
			}
		}
		t.Reset(time.Millisecond)
		<-t.C
	}
}

// awaitSuccessor asks /readyz on the health address until it answers 200
// (from the successor: this proxy answers 503 once stopping) or deadline
// passes. Without a health server it returns true at once.
func (p *Proxy) awaitSuccessor(deadline time.Time) bool {
	ha := p.HealthAddr()
	if ha == nil {
		return true
	}
	client := &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
		Timeout:   200 * time.Millisecond,
	}
	defer client.CloseIdleConnections()
	url := "http://" + ha.String() + "/readyz"
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		<-t.C
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		t.Reset(min(handoverPoll, left))
	}
}
