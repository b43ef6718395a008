package localproxy

// LoopEnds reports, for each connection on the loop, whether the loop
// holds each direction's source (toUpstream, toClient) for ended.
func (p *Proxy) LoopEnds() [][2]bool {
	var out [][2]bool
	for _, c := range p.snapshot() {
		c.mu.Lock()
		if c.ev != nil {
			out = append(out, [2]bool{c.ev.dirs[toUpstream].hup, c.ev.dirs[toClient].hup})
		}
		c.mu.Unlock()
	}
	return out
}

// OnLoopHandoff runs f, with the connection's close, for each connection
// of p between the duplication of its sockets and their hand-off to the
// loop, until the returned function is called.
func (p *Proxy) OnLoopHandoff(f func(close func())) (restore func()) {
	h := func(c *conn) {
		if c.p == p {
			f(c.close)
		}
	}
	loopHandoff.Store(&h)
	return func() { loopHandoff.Store(nil) }
}

// LoopMode is how p's loop waits for its sockets: "epoll_wait" (blocking
// a thread) or "poller" (Go's network poller, with one P).
func (p *Proxy) LoopMode() string {
	if poll := p.parker(); poll != nil && !poll.blocking {
		return "poller"
	}
	return "epoll_wait"
}

// ParseProcAddr is parseProcAddr: an address of /proc/net/tcp.
var ParseProcAddr = parseProcAddr

// OnLoopAgain calls f, on the poller's goroutine, with the length of each
// list of p's directions that copied their share and go on after the
// others, and how many entries of it name a direction named before in
// it, until the returned function is called.
func (p *Proxy) OnLoopAgain(f func(n, repeated int)) (restore func()) {
	h := func(work []loopWork) {
		seen := map[loopWork]bool{}
		n, repeated := 0, 0
		for _, w := range work {
			if w.c.p != p {
				continue
			}
			n++
			if seen[w] {
				repeated++
			}
			seen[w] = true
		}
		if n > 0 {
			f(n, repeated)
		}
	}
	loopAgain.Store(&h)
	return func() { loopAgain.Store(nil) }
}

// LoopDialing counts the connect attempts in flight on the loop over p's
// connections.
func (p *Proxy) LoopDialing() int {
	n := 0
	for _, c := range p.snapshot() {
		c.mu.Lock()
		if c.dial != nil {
			n += len(c.dial.tries)
		}
		c.mu.Unlock()
	}
	return n
}

// LoopKeys counts the ids p's poller holds for connections: one per
// connection it serves or parks, and one per later attempt of a dial on
// the loop (kept by the connection its attempt won for).
func (p *Proxy) LoopKeys() int {
	poll := p.parker()
	if poll == nil {
		return 0
	}
	poll.mu.Lock()
	defer poll.mu.Unlock()
	return len(poll.conns)
}

// SetAcceptBatch sets how many connections the loop accepts before it
// turns to its other events, until the returned function is called; no
// proxy may run meanwhile, but those started after it.
func SetAcceptBatch(n int) (restore func()) {
	old := acceptBatch
	acceptBatch = n
	return func() { acceptBatch = old }
}

// OnLoopEvent calls f, on the poller's goroutine, with each event the
// loop sees on a socket of one of p's copying connections (sock 0: the
// client's, 1: the upstream's), until the returned function is called.
func (p *Proxy) OnLoopEvent(f func(sock int, events uint32)) (restore func()) {
	h := func(c *conn, sock int, events uint32) {
		if c.p == p {
			f(sock, events)
		}
	}
	loopEvent.Store(&h)
	return func() { loopEvent.Store(nil) }
}
