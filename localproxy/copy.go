package localproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The copy of one direction of a connection: reads into a pooled buffer
// and writes what it read, so that a small message (an API request or
// response, a TLS record) costs one read and one write; a read that fills
// the buffer finds out whether more is queued and splices that in the
// kernel (copy_linux.go). A direction that has had nothing to read for
// parkAfter hands its wait to the proxy's poller and its goroutine ends
// (park): an idle connection holds its two sockets and no goroutine, no
// buffer and no pipe. Data resumes it on a new goroutine.

const (
	// copyBufSize is the size of the copy buffers: a TLS record (16 KiB
	// and its overhead) fits.
	copyBufSize = 32 << 10
	// copyChunk is how much one splice call may move before the byte
	// counters are updated.
	copyChunk = 256 << 10
	// parkAfter is how long a direction waits for data on its own
	// goroutine before it parks: between parkAfter and twice that after
	// its last data. A busy connection keeps its goroutines, which is
	// cheaper per message than parking.
	parkAfter = 200 * time.Millisecond
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

// direction copies src to dst for a conn. Its fields other than state
// belong to the one goroutine running it; a park or resume hands them on
// under conn.mu.
type direction struct {
	c        *conn
	side     int
	src, dst net.Conn
	bytes    prometheus.Counter
	// state is guarded by c.mu.
	state dirState
	// started: the first read, which the first-byte watch sees, is done.
	started bool
	// moved: data came since the park deadline was last set.
	moved bool
	// raw holds the OS specific parts: raw reads, splice, parking.
	raw rawDirection
}

// init sets d up to copy src to dst; the caller holds c.mu.
func (d *direction) initLocked(c *conn, side int, src, dst net.Conn, bytes prometheus.Counter) {
	d.c, d.side, d.src, d.dst, d.bytes = c, side, src, dst, bytes
	d.raw.init(d)
}

// run copies until src ends (the EOF is passed on with CloseWrite, and the
// other direction then gets HalfOpenTimeout to finish), the copy fails
// (which closes the connection), or src has had nothing to read for
// parkAfter (park). The last direction to end finishes the connection.
func (d *direction) run() {
	parking := d.raw.canPark() && d.c.p.parker() != nil
	if parking {
		d.src.SetReadDeadline(time.Now().Add(parkAfter))
	}
	for {
		bp, n, err := d.raw.read()
		if parking && errors.Is(err, os.ErrDeadlineExceeded) {
			if d.moved {
				d.moved = false
				d.src.SetReadDeadline(time.Now().Add(parkAfter))
				continue
			}
			if d.park() {
				return
			}
			// Not parked (the poller refused, or c was closed): wait
			// here, without a deadline.
			parking = false
			d.src.SetReadDeadline(time.Time{})
			continue
		}
		d.moved = true
		var werr error
		full := n == copyBufSize
		if n > 0 {
			var w int
			w, werr = d.raw.write((*bp)[:n])
			copyBufs.Put(bp)
			d.wrote(w)
		}
		eof := errors.Is(err, io.EOF)
		if eof {
			err = nil
		}
		if err == nil {
			err = werr
		}
		if !d.started {
			d.started = true
			d.c.first(d.side, n, err)
		}
		if err == nil && !eof && full {
			eof, err = d.raw.bulk()
		}
		if err != nil || eof {
			d.end(eof, err)
			return
		}
	}
}

// wrote counts n bytes written to dst; bytes sent upstream are a request,
// or part of one: the held connection of its server is PINGed soon and
// while it waits (endpoint.Registry.Wake).
func (d *direction) wrote(n int) {
	if n <= 0 {
		return
	}
	d.bytes.Add(float64(n))
	if d.side == toUpstream {
		d.c.p.upstreams.Wake(d.c.addr)
	}
}

// end passes an EOF on with CloseWrite, closes the connection on an
// error, gives the other direction HalfOpenTimeout after the first EOF,
// and marks d done.
func (d *direction) end(eof bool, err error) {
	c := d.c
	if eof {
		if cw, ok := d.dst.(interface{ CloseWrite() error }); ok {
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
	c.mu.Unlock()
	// From here on d belongs to whoever resumes it.
	if err := c.p.parker().arm(&d.raw, id, d.side); err != nil {
		mine := c.unpark(d)
		if mine {
			c.p.log.V(2).Info("waiting for data without the poller", "client", c.client.RemoteAddr().String(), "err", err.Error())
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
// saw: n bytes and err (the read's or the write's, not io.EOF).
func (c *conn) first(side, n int, err error) {
	if c.fb == nil {
		return
	}
	if side == toUpstream {
		if n > 0 && err == nil {
			c.fb.sent()
		}
		return
	}
	switch {
	case n > 0:
		c.fb.received()
	case err != nil:
		c.fb.failed(err, c.isClosed())
	}
}

// readBuffered reads src into a buffer from copyBufs: n > 0 bytes in
// *bp (the caller puts bp back), or none and an error.
func readBuffered(src net.Conn) (*[]byte, int, error) {
	bp := copyBufs.Get().(*[]byte)
	n, err := src.Read(*bp)
	if n == 0 {
		copyBufs.Put(bp)
		return nil, 0, err
	}
	return bp, n, err
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
