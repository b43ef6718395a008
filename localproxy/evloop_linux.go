package localproxy

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/internal/rawio"
)

// The event loop: a connection whose two sockets are TCP is copied by the
// poller's goroutine itself (poller.run), HAProxy's way: both sockets are
// taken out of Go's network poller (toLoop: a duplicate of each
// descriptor is kept, the net.Conn closed) and registered with the
// poller, edge triggered, for reading and writing. A readable socket is
// read into a pooled buffer and what came is written to the other at
// once; what the other does not take waits for it to be writable, and
// the source is not read meanwhile (backpressure: the kernel's buffers
// fill and TCP's window closes). A source's EOF is passed on with a
// half-close (shutdown SHUT_WR) once what came before it is written; an
// error closes the connection. Data wakes one thread, no goroutine; an
// idle connection holds its two descriptors and about 100 bytes here.
// A connection whose sockets cannot be taken off (not TCP, out of
// descriptors for the duplicates) copies on goroutines (copy.go).

// loopShare is how much one direction may copy per event before the
// poller turns to the other connections; it goes on with it after them.
const loopShare = spliceMax

// evConn is a connection on the loop: its sockets and what each
// direction has read and not yet written. Guarded by conn.mu; only the
// poller's goroutine copies, and conn.close closes the descriptors.
type evConn struct {
	// fds are the client's socket (0: toUpstream's source) and the
	// upstream's (1).
	fds  [2]int
	dirs [2]evDir
	// upID is the id of the upstream socket's key for a connection
	// dialed on the loop: c.id, or a later attempt's own; 0 for one
	// handed to the loop (toLoop), whose key is c.id's.
	upID uint64
	// answers times the upstream's answers to the client's requests.
	answers answerClock
	// quietOut: the client's socket is in the epoll set without
	// EPOLLOUT (startLoop), which copyLocked adds (watchOut) the first
	// time the client's buffer is full. A socket added with it is
	// reported writable at once, a wakeup of the loop per new
	// connection for nothing.
	quietOut bool
	// halfOpen closes the connection HalfOpenTimeout after its first
	// direction ended (halfOpenFor), on a loop that waits in
	// epoll_wait.
	halfOpen loopTimer
}

// answerClock times a loop connection's answers: from the last bytes
// passed upstream to the first bytes passed back; and keeps how often
// they came pollerAwait or more later. That tells the poller, once a
// request is passed on, whether to hold its P for the answer, up to
// pollerAwait, or park at once (planWait): a LIST the apiserver takes
// 10ms to answer outlasts the hold, and holding for it cost a wakeup and
// a wait more than parking at once; a GET's answer, in a millisecond, or
// a small LIST's, in five, costs more parked than held.
// From the last bytes, not the first: an HTTP/2 client sends a
// flow-control update after it read 4 KiB of an answer, and its next
// request may come much later; timed from the update, its answer would
// count as late. Writes of fewer than controlWrite bytes within
// controlGap of bytes passed back are not taken for requests (HTTP/2
// control frames). It is a guess, and a wrong guess costs CPU, nothing
// else.
//
// It times the client too: from the last bytes passed back to it to its
// last request before the next bytes back, and keeps how often that came
// within pollerAwait: each answer to a request counts, and so do bytes
// passed back pollerAwait or more after the last with no request between
// (the client did not ask soon). After passing bytes back to a client
// that asks again soon (a controller's back-to-back LISTs, or the pages
// of one, each sent once the last is decoded), the poller holds for its
// next request up to pollerAwait (planWait); after passing bytes back to
// one that does not (a node agent's GETs, 50ms apart; a watch's events),
// 4ms.
type answerClock struct {
	// asked is when the last request since the last bytes passed back
	// was passed on; zero: none since.
	asked time.Time
	// late is how often answers came late: an average of 0 (in time)
	// and answerLate (late), each answer counting 1/answerWeight.
	late int32
	// answered is when bytes were last passed back to the client (zero:
	// never); soon how often the client's last request before the next
	// bytes passed back came within pollerAwait of them, on late's
	// scale, 0 (never) to start with. The last request, not the first:
	// a window update sent late, taken for a request (controlGap), is
	// followed by the real one.
	answered time.Time
	soon     int32
}

const (
	// answerLate is answerClock.late's scale: a connection's answers
	// are late when it is above half of it.
	answerLate = 1 << 10
	// answerWeight: each answer counts for 1/answerWeight of the
	// average: after a spell of answers in time, it takes six late ones
	// in a row to make a connection's answers late, and after a spell of
	// late ones, six in time to make them in time again.
	answerWeight = 8
)

// controlWrite and controlGap: a write upstream of fewer than
// controlWrite bytes, within controlGap of bytes passed back to the
// client, is not taken for a request (answerClock.wrote): it is a control
// frame the client sent on reading them. In TLS 1.2 or 1.3, an HTTP/2
// client's control frames come in records of 31-55 bytes: window updates
// (a pair of them: 48 bytes in TLS 1.3), a PING's acknowledgement, a
// SETTINGS acknowledgement. Taken for requests, the window updates
// client-go sends for every 4 KiB it reads of a LIST's answer, each
// answered by the answer's next bytes at once, outnumbered the LIST's
// late answer, and its connection's answers counted as in time.
//
// Size alone does not tell them apart: HPACK makes a repeated request as
// small (a Go HTTP/2 client's second identical GET took 39-42 bytes in
// TLS 1.3 records, where its first took 1,501; the bench's repeated
// LISTs, 39 bytes), but a client sends its next request once it has
// decoded the last answer, milliseconds after its last bytes in the
// bench (0.5-10ms, four in five after 1ms, in a traced run of 300
// LISTs), where the window updates follow them at once (under 500µs for
// six in seven, 1ms or more for one in sixteen). Wrong guesses remain,
// each costing a wait of the wrong kind: a small request sent within
// controlGap of the last bytes passed back (an answer's, or a watch's
// events) is taken for a control frame; window updates read together
// (96-240 bytes in that client's case), or sent 1ms or more after the
// bytes (a busy or throttled client), for a request, and the answer's
// next bytes then count as an answer in time; a PING, a stream's reset
// or a GOAWAY of the client's own, sent 1ms or more after bytes passed
// back, for a request too. A
// small write after a request, before any bytes are passed back, goes
// with the requests. The client's clock counts the last request before
// the bytes passed back, so that a late window update does not make a
// client one that asks soon.
const (
	controlWrite = 64
	controlGap   = time.Millisecond
)

// wroteWhat is what a step's write was, for the poller's wait
// (answerClock.wrote, poller.noteWrite).
type wroteWhat uint8

const (
	// wroteAnswer: bytes passed back to the client, whose next request,
	// going by its earlier ones, comes pollerAwait or more later, if at
	// all; wroteAnswerAskedSoon: to a client whose next request comes
	// sooner.
	wroteAnswer wroteWhat = iota
	wroteAnswerAskedSoon
	// wroteControl: fewer than controlWrite bytes passed upstream,
	// within controlGap of bytes passed back.
	wroteControl
	// wroteFastAsk: a request passed upstream, whose answer comes, going
	// by the connection's earlier ones, within pollerAwait;
	// wroteSlowAsk: one whose answer comes later.
	wroteFastAsk
	wroteSlowAsk
)

// wrote notes that direction side wrote n bytes at now, and says what
// they were.
func (a *answerClock) wrote(side, n int, now time.Time) wroteWhat {
	if side == toUpstream {
		// With nothing passed back yet, answered is zero and the gap
		// the longest a Duration holds: a request.
		if n < controlWrite && a.asked.IsZero() && now.Sub(a.answered) < controlGap {
			return wroteControl
		}
		a.asked = now
		if a.late > answerLate/2 {
			return wroteSlowAsk
		}
		return wroteFastAsk
	}
	switch {
	case !a.asked.IsZero():
		addSample(&a.late, now.Sub(a.asked) >= pollerAwait)
		if !a.answered.IsZero() {
			addSample(&a.soon, a.asked.Sub(a.answered) < pollerAwait)
		}
		a.asked = time.Time{}
	case !a.answered.IsZero() && now.Sub(a.answered) >= pollerAwait:
		// More bytes back, pollerAwait or more after the last, and no
		// request between: the client did not ask again soon (a
		// watch's events, on a connection whose LISTs came back to
		// back); or the server paused that long within an answer,
		// which counts the same.
		addSample(&a.soon, false)
	}
	a.answered = now
	if a.soon > answerLate/2 {
		return wroteAnswerAskedSoon
	}
	return wroteAnswer
}

// addSample adds a sample to one of answerClock's averages: answerLate if
// yes, else 0, counting 1/answerWeight.
func addSample(avg *int32, yes bool) {
	var x int32
	if yes {
		x = answerLate
	}
	*avg += (x - *avg) / answerWeight
}

// evDir is one direction on the loop.
type evDir struct {
	// bp holds bytes read, (*bp)[off:n] not yet written; nil: none.
	bp     *[]byte
	off, n int
	// pipe, while bulk data is spliced (pipe[1] != 0), is the kernel
	// pipe it goes through (read end, write end), and piped how much of
	// it is in the pipe, not yet spliced to dst.
	pipe  [2]int
	piped int
	// eof: the source ended; the destination is shut down for writing
	// once bp is written. ended: that is done.
	eof, ended bool
	// hup: an event said the source ended or failed. Kept, because that
	// edge does not come again: a direction waiting for dst then reads
	// its source until it says so.
	hup bool
	// urgent: the source had TCP urgent data (a client's MSG_OOB). A
	// read stops short at its mark, with more queued and no edge to
	// come, so from then on the direction reads until EAGAIN, and does
	// not splice (a splice stops at the mark too).
	urgent bool
	// queued: the direction is on the poller's again list. Only the
	// poller's goroutine sets and clears it.
	queued bool
}

// waiting: the direction has something for dst to take (bytes in its
// buffer or pipe, or its EOF to pass on).
func (e *evDir) waiting() bool { return e.bp != nil || e.piped > 0 || e.eof }

// loopWork is a direction the poller goes on copying after an event's
// share.
type loopWork struct {
	c    *conn
	side int
}

// sockFD is a loop socket's descriptor, closed by closeClient.
type sockFD int

func (s sockFD) CloseWrite() error { return unix.Shutdown(int(s), unix.SHUT_WR) }
func (s sockFD) Close() error      { return unix.Close(int(s)) }

// toLoop puts c on the poller's loop, if there is one and both its
// sockets are TCP; false: c is to copy on goroutines. Called by pipe
// before any copy starts.
func (c *conn) toLoop() bool {
	p := c.p.parker()
	client, ok1 := c.client.(*net.TCPConn)
	up, ok2 := c.upRaw.(*net.TCPConn)
	if p == nil || !ok1 || !ok2 {
		return false
	}
	cfd, err := dupFD(client)
	if err != nil {
		c.p.log.V(2).Info("copying on goroutines: cannot duplicate the client's socket", "client", c.clientName(), "err", err.Error())
		return false
	}
	ufd, err := dupFD(up)
	if err != nil {
		unix.Close(cfd)
		c.p.log.V(2).Info("copying on goroutines: cannot duplicate the upstream's socket", "client", c.clientName(), "err", err.Error())
		return false
	}
	if f := loopHandoff.Load(); f != nil {
		(*f)(c)
	}
	c.mu.Lock()
	if c.closed {
		// close came first and closed the net.Conns, the client's gently
		// (closeClient): the duplicates go, and the copies on goroutines
		// end c as they would have without the loop.
		c.mu.Unlock()
		unix.Close(cfd)
		unix.Close(ufd)
		return false
	}
	c.ev = &evConn{fds: [2]int{cfd, ufd}}
	// The loop owns both directions: no goroutine runs them, and close
	// ends them as parked ones.
	c.dirs[toUpstream].state, c.dirs[toClient].state = dirParked, dirParked
	if c.id == 0 {
		c.id = p.add(c)
	}
	for s, fd := range c.ev.fds {
		if err := p.addFD(fd, c.id<<1|uint64(s), loopEvents); err != nil {
			c.p.log.V(2).Info("closing the connection: the poller refused it", "client", c.clientName(), "err", err.Error())
			// Registered or not, the descriptors are closed by close,
			// which can be called once c.mu is released.
			go c.close()
			break
		}
	}
	c.mu.Unlock()
	// Go's poller lets go of the sockets; the duplicates keep them open,
	// so a close from now on goes through them (closeLoop), gently for
	// the client's.
	client.Close()
	up.Close()
	return true
}

// loopHandoff, if set (tests), runs between duplicating a connection's
// sockets and handing them to the loop.
var loopHandoff atomic.Pointer[func(*conn)]

// loopAgain, if set (tests), sees each again list runAgain takes on, on
// the poller's goroutine.
var loopAgain atomic.Pointer[func([]loopWork)]

// dupFD duplicates tc's descriptor (close-on-exec, non-blocking as the
// original: the flag belongs to the shared file description).
func dupFD(tc *net.TCPConn) (int, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return nfd, derr
}

// onEvent handles what the poller saw on socket sock of c: readable,
// ended, failed or holding urgent data, its direction copies; writable,
// the direction writing to it goes on.
func (c *conn) onEvent(sock int, events uint32) {
	ended := events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
	switch {
	case events&unix.EPOLLPRI != 0:
		c.step(sock, stepUrgent)
		if ended {
			c.step(sock, stepEnded)
		}
	case ended:
		c.step(sock, stepEnded)
	case events&unix.EPOLLIN != 0:
		c.step(sock, stepReadable)
	}
	if events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.step(1-sock, stepWritable)
	}
}

// stepWhy is why a direction steps.
type stepWhy int

const (
	// stepReadable: its source has new data.
	stepReadable stepWhy = iota
	// stepEnded: its source ended or failed (kept: evDir.hup).
	stepEnded
	// stepUrgent: its source holds TCP urgent data (kept: evDir.urgent).
	stepUrgent
	// stepWritable: its destination took what it held; only a direction
	// waiting for that has something to do.
	stepWritable
	// stepAgain: it copied its share (loopShare) at its last step, and
	// may have more.
	stepAgain
)

// stepped is what one step of a direction leaves to do once c.mu is
// released.
type stepped struct {
	// first: the direction's first read happened (n bytes, fl what they
	// are, ferr the read's error or the write's of those bytes, what the
	// first-byte watch is told; fopen: that write is still to finish).
	first bool
	n     int
	fl    flight
	ferr  error
	fopen bool
	err   error // the read's or the write's: c is to be closed
	ended bool  // the source's EOF was passed on: the direction is done
	last  bool  // and so is the other: c is to finish
	again bool  // loopShare copied and more may be there: on p.again
	// wrote is how many bytes the step wrote to the destination.
	wrote int
}

// step copies for direction side of c until its source has nothing more,
// its destination is full, it ended, failed, or copied loopShare (then
// the poller goes on with it after the others: p.again, once).
func (c *conn) step(side int, why stepWhy) {
	c.mu.Lock()
	ev := c.ev
	if ev == nil {
		c.mu.Unlock()
		return
	}
	e := &ev.dirs[side]
	switch why {
	case stepEnded:
		e.hup = true
	case stepUrgent:
		e.urgent = true
	case stepAgain:
		e.queued = false
	}
	if c.closed || e.ended || (why == stepWritable && !e.waiting()) {
		c.mu.Unlock()
		return
	}
	s := c.copyLocked(side, e.hup || e.urgent)
	if s.again {
		// Once on the list: an edge may step it meanwhile.
		s.again = !e.queued
		e.queued = true
	}
	poll := c.p.poll
	if s.wrote > 0 {
		poll.noteWrite(ev.answers.wrote(side, s.wrote, poll.now))
	}
	c.mu.Unlock()
	if s.wrote > 0 {
		poll.tally.add(side, s.wrote, c.addr)
	}
	if s.err != nil || s.last {
		// Counted before c is: its bytes are in the metrics once it
		// is gone from the proxy's.
		poll.countTally()
	}
	if s.first {
		c.first(side, s.n, s.fl, s.ferr)
	}
	switch {
	case s.err != nil:
		poll.stop(&ev.halfOpen)
		c.close()
	case s.last:
		poll.stop(&ev.halfOpen)
		c.halves.Add(1)
		c.close()
		c.finish()
	case s.ended:
		if c.halves.Add(1) == 1 && c.p.cfg.HalfOpenTimeout > 0 {
			c.halfOpenFor(ev, c.p.cfg.HalfOpenTimeout)
		}
	case s.again:
		poll.again = append(poll.again, loopWork{c, side})
	}
}

// halfOpenFor closes c d from now: one of its directions ended. On a
// loop that waits in epoll_wait, by ev's loop timer, which c's last step
// disarms; a close from another goroutine leaves it to fire, for
// nothing. A Go timer (closeBy) cost each new connection an allocation,
// and the runtime's timer heap, twice. On a loop that waits in Go's
// poller, whose waits loop timers do not bound, closeBy.
func (c *conn) halfOpenFor(ev *evConn, d time.Duration) {
	poll := c.p.poll
	if !poll.blocking {
		c.closeBy(time.Now().Add(d))
		return
	}
	ev.halfOpen.fire = func(time.Time) { c.close() }
	poll.at(&ev.halfOpen, time.Now().Add(d))
}

// copyLocked is step's copy, under c.mu. A read that did not fill the
// buffer found src's queue empty: more data, or its end, is a new edge,
// and the copy stops there without reading again, unless readAll: src is
// known to have ended (its FIN may be queued behind the data) or to hold
// urgent data; or the bytes were read before an earlier wait for dst
// (the edges meanwhile were taken).
func (c *conn) copyLocked(side int, readAll bool) (s stepped) {
	e := &c.ev.dirs[side]
	d := &c.dirs[side]
	src, dst := c.ev.fds[side], c.ev.fds[1-side]
	moved := 0
	readHere := false
	for {
		if e.bp != nil {
			w, errno := writeFD(dst, (*e.bp)[e.off:e.n])
			s.wrote += w
			e.off += w
			switch {
			case errno == unix.EAGAIN:
				s.err = c.watchOut(side) // on with it when dst is writable
				return s
			case errno != 0:
				s.err = fdError("write", c, 1-side, errno)
				if s.fopen {
					s.ferr = s.err
				}
				return s
			}
			s.fopen = false
			drained := e.n < len(*e.bp)
			c.p.poll.putBuf(e.bp)
			e.bp = nil
			if drained && readHere && !readAll && !e.eof {
				// The read found src's queue empty; more data is a new
				// edge.
				return s
			}
			if !drained && !e.eof && !e.urgent && e.pipe[1] == 0 {
				c.p.poll.takePipe(e, src)
			}
		}
		if moved >= loopShare {
			s.again = true
			return s
		}
		if e.pipe[1] != 0 && !e.eof {
			var more bool
			more, s.err = c.splice(side, e, src, dst, &moved, &s.wrote)
			if s.err == nil && !more && e.piped > 0 {
				s.err = c.watchOut(side) // dst is full
			}
			if s.err != nil || !more {
				return s
			}
			readHere = true
			continue
		}
		if e.eof {
			e.ended = true
			// With the other direction ended by its EOF too, this is
			// c's last step, and the close that follows at once sends
			// dst its FIN (nothing is left unread on it): a shutdown
			// first would be one more system call per connection, and
			// fail on a client that reset meanwhile (a TLS client that
			// closed with the server's close_notify unread), which
			// made a normal end an error.
			if c.dirs[1-side].state != dirDone || c.halves.Load() != 1 {
				if err := unix.Shutdown(dst, unix.SHUT_WR); err != nil {
					s.err = fdError("shutdown", c, 1-side, err)
					return s
				}
			}
			// Done under c.mu, so that close, which ends the parked
			// directions and finishes c, and this agree on who finishes.
			d.state = dirDone
			s.ended, s.last = true, c.doneLocked()
			return s
		}
		bp := c.p.poll.getBuf()
		n, errno := rawio.IO(unix.SYS_READ, uintptr(src), *bp)
		switch {
		case errno == unix.EAGAIN:
			c.p.poll.putBuf(bp)
			return s
		case errno != 0:
			c.p.poll.putBuf(bp)
			s.err = fdError("read", c, side, errno)
			if !d.started {
				d.started = true
				s.first, s.ferr = true, s.err
			}
			return s
		case n == 0:
			c.p.poll.putBuf(bp)
			e.eof = true
			if !d.started {
				d.started = true
				s.first = true
			}
			continue
		}
		if !d.started {
			d.started = true
			s.first, s.n, s.fopen = true, n, true
			if side == toUpstream {
				s.fl = firstFlight((*bp)[:n])
			}
		}
		e.bp, e.off, e.n = bp, 0, n
		moved += n
		readHere = true
	}
}

// watchOut makes sure that the poller reports direction side's
// destination once it is writable: the client's socket, if it is not
// watched for that yet (evConn.quietOut), is from now on. Under c.mu.
// The change polls the socket: one that took bytes meanwhile is
// reported at once.
func (c *conn) watchOut(side int) error {
	if side != toClient || !c.ev.quietOut {
		return nil
	}
	if err := c.p.poll.modFD(c.ev.fds[0], c.id<<1, loopEvents); err != nil {
		return fdError("epoll_ctl", c, 0, err)
	}
	c.ev.quietOut = false
	return nil
}

// writeFD writes b to fd until it is written or the socket's buffer is
// full (EAGAIN) or the write fails.
func writeFD(fd int, b []byte) (int, syscall.Errno) {
	w := 0
	for w < len(b) {
		n, errno := rawio.IO(unix.SYS_WRITE, uintptr(fd), b[w:])
		if errno != 0 {
			return w, errno
		}
		w += n
	}
	return w, 0
}

// fdError is a loop socket's failure as its net.Conn would report it.
func fdError(op string, c *conn, sock int, err error) error {
	local, remote := c.clientLocal(), c.clientAddr()
	if sock == 1 {
		local, remote = nil, c.upstreamAddr()
		if c.upRaw != nil {
			local = c.upRaw.LocalAddr()
		}
	}
	return &net.OpError{Op: op, Net: "tcp", Source: local, Addr: remote, Err: os.NewSyscallError(op, err)}
}

// splice moves bulk data from src to dst through e's pipe: what the pipe
// holds first, then what src has queued, a pipe's worth at a time. It
// returns more: false when dst is full (on with it when writable) or src
// is empty (EAGAIN). A splice that moved less than asked says nothing of
// what is left (it stops at the pipe's slots, one per socket buffer
// fragment), so, unlike a short read, it does not end the copy. The pipe
// goes back to the poller once src is empty or ended.
func (c *conn) splice(side int, e *evDir, src, dst int, moved, wrote *int) (more bool, err error) {
	for e.piped > 0 {
		n, errno := spliceFD(e.pipe[0], dst, e.piped)
		*wrote += n
		e.piped -= n
		switch {
		case errno == unix.EAGAIN:
			return false, nil
		case errno != 0:
			return false, fdError("splice", c, 1-side, errno)
		}
	}
	if *moved >= loopShare {
		return true, nil // copyLocked stops there, and goes on after the others
	}
	if e.urgent { // on through the buffer, which reads past the mark
		c.p.poll.putPipe(e)
		return true, nil
	}
	n, errno := spliceFD(src, e.pipe[1], spliceMax)
	switch {
	case errno == unix.EAGAIN:
		c.p.poll.putPipe(e)
		return false, nil
	case errno != 0:
		c.p.poll.putPipe(e)
		return false, fdError("splice", c, side, errno)
	case n == 0:
		c.p.poll.putPipe(e)
		e.eof = true
		return true, nil
	}
	e.piped = n
	*moved += n
	return true, nil
}

// spliceMax is how much one splice moves at most, and the capacity the
// loop's pipes ask for (F_SETPIPE_SZ). In make bench (2 cores) the proxy
// spent 0.26s of CPU per GiB with a pipe's default 64 KiB, 0.18-0.19s
// with 256 KiB and 0.15-0.17s with 1 MiB (Go's own splice size); but
// with 1 MiB, the kernel's receive-buffer autotuning, fed by the larger
// reads, let a sender queue up to 40 MiB in front of a paused reader
// (TestLargeTransferPausedReader allows 25; 4 of 40 runs went over 25),
// and 8-16 MiB with 256 KiB in 80 runs, as on goroutines. A pipe that
// holds nothing holds no pages.
const spliceMax = 256 << 10

// spliceFD is splice(2) of up to n bytes from in to out, non-blocking, as
// a raw system call, retried on EINTR.
func spliceFD(in, out, n int) (int, syscall.Errno) {
	for {
		r, _, errno := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
		switch errno {
		case 0:
			return int(r), 0
		case unix.EINTR:
			continue
		default:
			return 0, errno // r is -1
		}
	}
}

// takePipe gives e a pipe if src has at least spliceMin queued and fewer
// than MaxSplices copies splice (Proxy.splicing, shared with the
// goroutines' copies); otherwise e goes on through its buffer.
func (p *poller) takePipe(e *evDir, src int) {
	// Raw, as the loop's reads and writes: a system call the runtime sees
	// wakes Go's sysmon from the sleep it takes while the poller is parked
	// (planWait), and sysmon then polls every 20µs for a while.
	var queued int32
	if _, _, errno := unix.RawSyscall(unix.SYS_IOCTL, uintptr(src), unix.SIOCINQ, uintptr(unsafe.Pointer(&queued))); errno != 0 || queued < spliceMin {
		return
	}
	if p.splicing.Add(1) > MaxSplices {
		p.splicing.Add(-1)
		return
	}
	if n := len(p.pipes); n > 0 {
		e.pipe, p.pipes = p.pipes[n-1], p.pipes[:n-1]
		return
	}
	if p.now.Before(p.pipesShortUntil) {
		p.splicing.Add(-1)
		return
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		// Out of descriptors, or past the hard quota
		// (fs.pipe-user-pages-hard): no better a second from now.
		p.pipesShort()
		return
	}
	// A pipe's pages count against its user's quota
	// (fs.pipe-user-pages-soft), across the node: every process of that
	// user shares it, every container running as 65534 too. Once it is
	// spent, the kernel makes pipes of two pages and refuses to grow
	// them. Such a pipe is closed, and the copy goes on through the
	// buffer: taken, it would go to the pool when its copy ends, and stay
	// small after the shortage. No pipe is made for pipeShortFor after
	// that, rather than one for each buffer a bulk copy reads (with the
	// quota spent, 1 GiB through the proxy then cost 0.66-0.83s of its
	// CPU, against 0.75-1.03s splicing 8 KiB at a time). One the limit
	// (fs.pipe-max-size) keeps below spliceMax, but of spliceMin or
	// more, works, in more calls.
	size, err := pipeResize(fds[0], spliceMax)
	if err != nil {
		size, err = unix.FcntlInt(uintptr(fds[0]), unix.F_GETPIPE_SZ, 0)
	}
	if err != nil || size < spliceMin {
		unix.Close(fds[0])
		unix.Close(fds[1])
		p.pipesShort()
		return
	}
	e.pipe = fds
}

// pipesShort undoes takePipe's count of a copy splicing, for one that
// got no pipe from the kernel, and makes no pipe for pipeShortFor.
func (p *poller) pipesShort() {
	p.splicing.Add(-1)
	p.pipesShortUntil = p.now.Add(pipeShortFor)
}

// pipeShortFor is how long the poller makes no pipe after the kernel
// gave it one too small to splice through, or none (takePipe).
const pipeShortFor = time.Second

// pipeResize asks the kernel to make the pipe fd hold n bytes
// (F_SETPIPE_SZ), and returns what it holds then; a variable for the
// tests, which stand in for a spent quota.
var pipeResize = func(fd, n int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, n)
}

// putPipe takes back e's empty pipe, keeping a few for the next bulk;
// the poller's goroutine only.
func (p *poller) putPipe(e *evDir) {
	if len(p.pipes) >= idlePipes {
		p.dropPipe(e)
		return
	}
	p.pipes = append(p.pipes, e.pipe)
	e.pipe, e.piped = [2]int{}, 0
	p.splicing.Add(-1)
}

// dropPipe closes e's pipe, with what it holds.
func (p *poller) dropPipe(e *evDir) {
	unix.Close(e.pipe[0])
	unix.Close(e.pipe[1])
	e.pipe, e.piped = [2]int{}, 0
	p.splicing.Add(-1)
}

// idlePipes is how many empty pipes the poller keeps.
const idlePipes = 4

// runAgain goes on with the directions that copied their share.
func (p *poller) runAgain() {
	if len(p.again) == 0 {
		return
	}
	work := p.again
	p.again = nil
	if f := loopAgain.Load(); f != nil {
		(*f)(work)
	}
	for _, w := range work {
		w.c.step(w.side, stepAgain)
	}
}

// loopBufs is how many empty copy buffers the poller keeps for its next
// reads (poller.getBuf), beside the pool's: a read and its write take
// one, and give it back unless the destination was full.
const loopBufs = 2

// getBuf is a copy buffer for a read of the loop's: one the poller kept,
// or the pool's. The poller's goroutine only: taken from and given back
// to the pool (sync.Pool), a buffer cost a pin to the P and two atomic
// operations per read, 4% of the loop's own CPU in make bench's LISTs.
func (p *poller) getBuf() *[]byte {
	if n := len(p.bufs); n > 0 {
		bp := p.bufs[n-1]
		p.bufs = p.bufs[:n-1]
		return bp
	}
	return copyBufs.Get().(*[]byte)
}

// putBuf takes back a buffer the loop emptied, keeping loopBufs of them;
// the poller's goroutine only (closeLoop, from any, gives its buffers to
// the pool).
func (p *poller) putBuf(bp *[]byte) {
	if len(p.bufs) < loopBufs {
		p.bufs = append(p.bufs, bp)
		return
	}
	copyBufs.Put(bp)
}

// closeLoop closes a loop connection's descriptors, for close: the
// client's FIN first if gently (closeClient), the upstream's at once, and
// puts back what the directions had not written.
func (c *conn) closeLoop(ev *evConn, gently bool) {
	for i := range ev.dirs {
		e := &ev.dirs[i]
		if e.bp != nil {
			copyBufs.Put(e.bp)
			e.bp = nil
		}
		if e.pipe[1] != 0 { // what it holds is lost with the connection
			c.p.poll.dropPipe(e)
		}
	}
	c.p.closeClient(sockFD(ev.fds[0]), gently)
	if ev.fds[1] >= 0 { // -1: c was still dialing
		unix.Close(ev.fds[1])
	}
}

// loopFDs returns the descriptors of a loop connection (c.ev set), under
// c.mu.
func (c *conn) loopFDs() [2]int { return c.ev.fds }
