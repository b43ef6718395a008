package localproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/apifailover/apifailover/internal/rawio"
)

// spliceMin is the least a queue must hold for the copy to splice it
// rather than read it into a buffer: below it, a read and a write cost
// less than the two splice calls through a pipe.
const spliceMin = 64 << 10

// rawCopier reads and writes the sockets itself, through their
// syscall.RawConn: a read takes a pooled buffer only once there is
// something to read, and bulk data is spliced. The reads and writes are
// raw system calls (no entersyscall): the sockets are non-blocking, so
// the calls return at once, and a proxy idle between small messages does
// not wake the runtime's sysmon thread for each of them (measured: about
// a third fewer context switches per request).
type rawCopier struct {
	cp *copier
	// src's and dst's raw connections, from the direction; nil: not a
	// socket, the net.Conn methods are used instead.
	rc, wrc syscall.RawConn
	// pumpFn, writeFn and inqFn are pumpRaw, writeRaw and inq, bound once
	// per copier.
	pumpFn, writeFn func(fd uintptr) bool
	inqFn           func(fd uintptr)
	// out is what pumpFn hands back.
	out pumped
	// What writeFn is to write (wbuf), has written (wn) or failed with;
	// wonce: try once, do not wait.
	wbuf  []byte
	wn    int
	werr  error
	wonce bool
	// queued is what inqFn found.
	queued int
	// lr limits a splice.
	lr io.LimitedReader
}

// init binds r's callbacks, once per copier.
func (r *rawCopier) init(cp *copier) {
	r.cp = cp
	r.pumpFn, r.writeFn, r.inqFn = r.pumpRaw, r.writeRaw, r.inq
}

// start and stop take and drop the direction's connections.
func (r *rawCopier) start() { r.rc, r.wrc = r.cp.d.rawSrc(), r.cp.d.rawDst() }
func (r *rawCopier) stop()  { r.rc, r.wrc, r.lr.R = nil, nil, nil }

// canPark: the poller can wait for src.
func (r *rawCopier) canPark() bool { return r.rc != nil }

// pump copies what arrives on src to dst until src ends, fails or hits
// its deadline, a read fills the buffer (bulk may follow), dst fails or
// is full, or the read is the direction's first (the first-byte watch
// sees it through copy). It runs inside one syscall.RawConn.Read of src,
// so that after a read that emptied src's queue it waits for the next
// readability without reading again (a read that finds nothing costs a
// system call per message); the write to dst is only tried there: waiting
// for dst inside src's callback would hold up src's Close, so a write
// that cannot finish at once is left to copy, with what is left of the
// buffer.
func (r *rawCopier) pump() pumped {
	if r.rc == nil {
		return readBuffered(r.cp.d.src())
	}
	r.out = pumped{}
	if err := r.rc.Read(r.pumpFn); err != nil {
		return pumped{err: err}
	}
	return r.out
}

// pumpRaw is the syscall.RawConn.Read callback of pump: false to wait for
// src's next readability.
func (r *rawCopier) pumpRaw(fd uintptr) bool {
	bp := copyBufs.Get().(*[]byte)
	n, errno := rawio.IO(unix.SYS_READ, fd, *bp)
	switch {
	case errno == unix.EAGAIN:
		copyBufs.Put(bp)
		return false
	case errno != 0:
		copyBufs.Put(bp)
		r.out.err = readError(r.cp.d.src(), errno)
		return true
	case n == 0:
		copyBufs.Put(bp)
		r.out.err = io.EOF
		return true
	}
	full := n == len(*bp)
	d := r.cp.d
	if !d.started || r.wrc == nil {
		r.out = pumped{bp: bp, n: n, full: full}
		return true
	}
	r.cp.moved = true
	w, werr := r.tryWrite((*bp)[:n])
	d.wrote(w)
	if w < n || werr != nil {
		r.out = pumped{bp: bp, off: w, n: n, werr: werr, full: full}
		if werr != nil {
			copyBufs.Put(bp)
			r.out.bp = nil
		}
		return true
	}
	copyBufs.Put(bp)
	if full {
		r.out = pumped{n: n, full: true}
		return true
	}
	return false
}

// tryWrite writes as much of b to dst as it takes now, without waiting.
func (r *rawCopier) tryWrite(b []byte) (int, error) {
	r.wbuf, r.wn, r.werr = b, 0, nil
	r.wonce = true
	err := r.wrc.Write(r.writeFn)
	r.wbuf, r.wonce = nil, false
	if err == nil {
		err = r.werr
	}
	return r.wn, err
}

// write writes b to dst, waiting while dst's buffer is full.
func (r *rawCopier) write(b []byte) (int, error) {
	if r.wrc == nil {
		return r.cp.d.dst().Write(b)
	}
	r.wbuf, r.wn, r.werr = b, 0, nil
	err := r.wrc.Write(r.writeFn)
	r.wbuf = nil
	if err == nil {
		err = r.werr
	}
	return r.wn, err
}

// writeRaw is the syscall.RawConn.Write callback of write and tryWrite:
// false (wait for room) while dst's buffer is full, unless wonce.
func (r *rawCopier) writeRaw(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		n, errno := rawio.IO(unix.SYS_WRITE, fd, r.wbuf[r.wn:])
		switch errno {
		case 0:
			r.wn += n
		case unix.EAGAIN:
			return r.wonce
		default:
			dst := r.cp.d.dst()
			r.werr = &net.OpError{Op: "write", Net: "tcp", Source: dst.LocalAddr(), Addr: dst.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
			return true
		}
	}
	return true
}

// bulk splices what src has queued while that is at least spliceMin, if
// src and dst are both *net.TCPConn and fewer than MaxSplices copies
// splice. It returns whether src ended and the splice's error.
func (r *rawCopier) bulk() (eof bool, err error) {
	d := r.cp.d
	src, srcTCP := d.src().(*net.TCPConn)
	dst, dstTCP := d.dst().(*net.TCPConn)
	if !srcTCP || !dstTCP || r.rc == nil {
		return false, nil
	}
	splicing := &d.c.p.splicing
	if splicing.Add(1) > MaxSplices {
		splicing.Add(-1)
		return false, nil
	}
	defer splicing.Add(-1)
	r.lr.R = src
	for {
		r.queued = 0
		if cerr := r.rc.Control(r.inqFn); cerr != nil || r.queued < spliceMin {
			return false, nil
		}
		r.lr.N = int64(min(r.queued, copyChunk))
		n, err := dst.ReadFrom(&r.lr)
		d.wrote(int(n))
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The park deadline (see copier.copy) stopped the splice
			// before it read; the next read sees it too.
			return false, nil
		case err != nil:
			return false, err
		}
		if r.lr.N > 0 { // src ended
			return true, nil
		}
	}
}

// inq is the syscall.RawConn.Control callback of bulk: how many bytes src
// has queued (SIOCINQ).
func (r *rawCopier) inq(fd uintptr) {
	r.queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
}
