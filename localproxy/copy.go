package localproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// The copy of one direction of a connection: reads into a pooled buffer
// and writes what it read, so that a small message (an API request or
// response, a TLS record) costs one read and one write; a read that fills
// the buffer finds out whether more is queued and splices that in the
// kernel (copy_linux.go). A direction that has had nothing to read for a
// while (its linger) hands its wait to the proxy's poller and its
// goroutine ends (park): an idle connection holds its two sockets and no
// goroutine, no buffer and no pipe. Data resumes it on a new goroutine.
//
// The linger adapts: it starts at minLinger, so that a burst of new
// connections that then idle does not keep a goroutine stack each for
// long (the memory stays with the process: 1,000 connections opened 32 at
// a time and left idle cost the binary 9.6 KiB each with 20ms, 6.4 KiB
// with 5ms, 5.8 KiB with 1ms, which costs more CPU per new connection in
// parks); a direction resumed less than maxLinger after it parked doubles
// it, up to maxLinger, so that a busy connection keeps its goroutines,
// cheaper per message than parking; one resumed later starts again from
// minLinger.

const (
	// copyBufSize is the size of the copy buffers: a TLS record (16 KiB
	// and its overhead) fits.
	copyBufSize = 32 << 10
	// copyChunk is how much one splice call may move before the byte
	// counters are updated.
	copyChunk = 256 << 10
	// MaxSplices bounds the copies that splice at once: a splice holds a
	// kernel pipe (two file descriptors) while it moves bytes, and Go
	// keeps the pipes of finished splices for reuse until a garbage
	// collection or two has passed, so at most 4*MaxSplices descriptors
	// are pipes. Beyond it, bulk data is copied through the buffer.
	MaxSplices = 32
	// minLinger and maxLinger bound how long a direction waits for data
	// on its own goroutine before it parks: between its linger and twice
	// that after its last data.
	minLinger = 5 * time.Millisecond
	maxLinger = 320 * time.Millisecond
)

// copyBufs holds the copy buffers; a direction takes one only while it
// has bytes to pass on.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// Directions of a connection, indexes of conn.dirs.
const (
	toUpstream = iota // client to upstream: "in"
	toClient          // upstream to client: "out"
)

// dirState is where a direction is.
type dirState uint8

const (
	// dirRunning: a goroutine copies or waits for data.
	dirRunning dirState = iota
	// dirParked: the poller waits for data; no goroutine.
	dirParked
	// dirDone: ended with src's EOF (passed on) or an error.
	dirDone
)

// direction is one of a conn's two copies. It holds only what an idle
// connection needs; the state of a running copy is a copier, pooled.
type direction struct {
	c    *conn
	side int
	// state is guarded by c.mu.
	state dirState
	// The fields below belong to the goroutine running d; a park or
	// resume hands them on under c.mu.
	//
	// started: the first read, which the first-byte watch sees, is done.
	started bool
	// registered: src has been added to the poller (poller.arm).
	registered bool
	// linger is how long d waits for data before it parks (zero:
	// minLinger); parkedAt is when it last parked.
	linger   time.Duration
	parkedAt time.Time
}

// src returns the connection d reads, dst the one it writes.
func (d *direction) src() net.Conn {
	if d.side == toUpstream {
		return d.c.client
	}
	return d.c.upRaw
}

func (d *direction) dst() net.Conn {
	if d.side == toUpstream {
		return d.c.upRaw
	}
	return d.c.client
}

// rawSrc and rawDst are src's and dst's syscall.RawConn; nil: not a
// socket.
func (d *direction) rawSrc() syscall.RawConn { return d.c.raw[d.side] }
func (d *direction) rawDst() syscall.RawConn { return d.c.raw[1-d.side] }

// copier is the state of a running direction, taken from copiers when it
// starts and put back when it parks or ends.
type copier struct {
	d *direction
	// moved: data came since the park deadline was last set.
	moved bool
	// raw holds the OS specific parts: raw reads and writes, splice.
	raw rawCopier
}

var copiers = sync.Pool{New: func() any {
	cp := &copier{}
	cp.raw.init(cp)
	return cp
}}

// run copies until src ends (the EOF is passed on with CloseWrite, and the
// other direction then gets HalfOpenTimeout to finish), the copy fails
// (which closes the connection), or src has had nothing to read for its
// linger (park). The last direction to end finishes the connection.
func (d *direction) run() {
	cp := copiers.Get().(*copier)
	cp.d, cp.moved = d, false
	cp.raw.start()
	cp.copy()
	cp.d = nil
	cp.raw.stop()
	copiers.Put(cp)
}

// copy is run's loop; it returns when d parked or ended.
func (cp *copier) copy() {
	d := cp.d
	src := d.src()
	parking := cp.raw.canPark() && d.c.p.parker() != nil
	if parking {
		d.adaptLinger()
		src.SetReadDeadline(time.Now().Add(d.linger))
	}
	for {
		p := cp.raw.pump()
		err := p.err
		if parking && errors.Is(err, os.ErrDeadlineExceeded) {
			if cp.moved {
				cp.moved = false
				src.SetReadDeadline(time.Now().Add(d.linger))
				continue
			}
			if d.park() {
				return
			}
			// Not parked (the poller refused, or c was closed): wait
			// here, without a deadline.
			parking = false
			src.SetReadDeadline(time.Time{})
			continue
		}
		cp.moved = true
		werr := p.werr
		fl := flightPartial // what the direction's first read holds
		if p.bp != nil {
			if !d.started {
				fl = firstFlight((*p.bp)[p.off:p.n])
			}
			w, err := cp.raw.write((*p.bp)[p.off:p.n])
			copyBufs.Put(p.bp)
			d.wrote(w)
			if werr == nil {
				werr = err
			}
		}
		eof := errors.Is(err, io.EOF)
		if eof {
			err = nil
		}
		if err == nil {
			err = werr
		}
		n, full := p.n, p.full
		if !d.started {
			d.started = true
			d.c.first(d.side, n, fl, err)
		}
		if err == nil && !eof && full {
			eof, err = cp.raw.bulk()
		}
		if err != nil || eof {
			d.end(eof, err)
			return
		}
	}
}

// loopTally is what the loop's steps wrote since the poller last had it
// counted (Proxy.count), once per round of events: each write's count and wake
// cost a map lookup under a lock, a hash of the address and an atomic
// add, a tenth of the loop's own CPU in make bench's LISTs.
type loopTally struct {
	bytes [2]int   // by direction side
	up    []string // the upstreams written to, each once
}

// add tallies n bytes written in direction side, to addr if upstream.
func (t *loopTally) add(side, n int, addr string) {
	t.bytes[side] += n
	if side == toUpstream && !slices.Contains(t.up, addr) {
		t.up = append(t.up, addr)
	}
}

// count counts what t tallied (Proxy.wrote), and empties it.
func (p *Proxy) count(t *loopTally) {
	for side, n := range t.bytes {
		if n > 0 {
			p.wrote(side, n, "")
		}
	}
	for _, addr := range t.up {
		p.upstreams.Wake(addr)
	}
	t.bytes, t.up = [2]int{}, t.up[:0]
}

// adaptLinger sets d's linger as d starts or resumes: doubled if it
// parked less than maxLinger ago, minLinger if it never parked or parked
// longer ago.
func (d *direction) adaptLinger() {
	if !d.parkedAt.IsZero() && time.Since(d.parkedAt) < maxLinger {
		d.linger = min(2*max(d.linger, minLinger), maxLinger)
	} else {
		d.linger = minLinger
	}
}

// wrote counts n bytes written to dst (Proxy.wrote).
func (d *direction) wrote(n int) {
	if n > 0 {
		d.c.p.wrote(d.side, n, d.c.addr)
	}
}

// wrote counts n bytes written in direction side; bytes sent upstream,
// to addr, are a request, or part of one: the held connection of its
// server is PINGed soon and while it waits (endpoint.Registry.Wake).
// addr "": no upstream to wake.
func (p *Proxy) wrote(side, n int, addr string) {
	if side == toUpstream {
		p.bytesIn.Add(float64(n))
		if addr != "" {
			p.upstreams.Wake(addr)
		}
	} else {
		p.bytesOut.Add(float64(n))
	}
}

// end passes an EOF on with CloseWrite, closes the connection on an
// error, gives the other direction HalfOpenTimeout after the first EOF,
// and marks d done.
func (d *direction) end(eof bool, err error) {
	c := d.c
	if eof {
		if cw, ok := d.dst().(interface{ CloseWrite() error }); ok {
			err = cw.CloseWrite()
		}
	}
	switch {
	case err != nil:
		c.close()
	case c.halves.Add(1) == 1 && c.p.cfg.HalfOpenTimeout > 0:
		c.closeBy(time.Now().Add(c.p.cfg.HalfOpenTimeout))
	}
	c.ended(d)
}

// park hands the wait for src's data to the poller. It returns true when
// d's goroutine must end (parked, or the connection closed meanwhile),
// false when the poller refused and d must wait itself.
func (d *direction) park() bool {
	c := d.c
	c.mu.Lock()
	if c.closed {
		// The next read fails and ends d.
		c.mu.Unlock()
		return false
	}
	if c.id == 0 {
		c.id = c.p.parker().add(c)
	}
	id := c.id
	d.state = dirParked
	d.parkedAt = time.Now()
	c.mu.Unlock()
	// From here on d belongs to whoever resumes it.
	if err := c.p.parker().arm(d, id); err != nil {
		mine := c.unpark(d)
		if mine {
			c.p.log.V(2).Info("waiting for data without the poller", "client", c.clientName(), "err", err.Error())
		}
		return !mine
	}
	return true
}

// resume runs a parked direction again, on a new goroutine: the poller
// saw src readable, ended or failed.
func (c *conn) resume(side int) {
	if d := &c.dirs[side]; c.unpark(d) {
		go d.run()
	}
}

// unpark makes a parked direction running again; false if it was not
// parked (resumed already, or done).
func (c *conn) unpark(d *direction) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.state != dirParked {
		return false
	}
	d.state = dirRunning
	return true
}

// first tells the first-byte watch what the first read of a direction
// saw: n bytes, what they are (firstFlight; the client's only) and err
// (the read's or the write's, not io.EOF). Once the upstream's first
// read settled the watch, c lets go of it.
func (c *conn) first(side, n int, fl flight, err error) {
	c.mu.Lock()
	fb := c.fb
	c.mu.Unlock()
	if fb == nil {
		return
	}
	if side == toUpstream {
		if n > 0 && err == nil {
			fb.sent(fl)
		}
		return
	}
	switch {
	case n > 0:
		fb.received()
	case err != nil:
		fb.failed(err, c.isClosed())
	default:
		return // ended without a byte: the watch goes on until c finishes
	}
	c.mu.Lock()
	c.fb = nil
	c.mu.Unlock()
}

// pumped is what a copier's pump hands back to copy: bytes read that
// copy is to write, (*bp)[off:n] (bp nil: none), the error of src (io.EOF
// at its end; the deadline's) or of dst, and whether the read filled the
// buffer (more may be queued). n counts the bytes read, written or not.
type pumped struct {
	bp     *[]byte
	off, n int
	err    error
	werr   error
	full   bool
}

// readBuffered reads src into a buffer from copyBufs, for copy to write.
func readBuffered(src net.Conn) pumped {
	bp := copyBufs.Get().(*[]byte)
	n, err := src.Read(*bp)
	if n == 0 {
		copyBufs.Put(bp)
		return pumped{err: err}
	}
	return pumped{bp: bp, n: n, err: err, full: n == copyBufSize}
}

// readError is what a raw read's errno becomes, as net.Conn.Read reports
// it.
func readError(nc net.Conn, errno error) error {
	return &net.OpError{Op: "read", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
}

// rawConnOf returns nc's syscall.RawConn, nil if it has none.
func rawConnOf(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
