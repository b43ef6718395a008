package localproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
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
	// readFn, writeFn and inqFn are readRaw, writeRaw and inq, bound once
	// per copier.
	readFn, writeFn func(fd uintptr) bool
	inqFn           func(fd uintptr)
	// What readFn read: n bytes in *bp, or err.
	bp  *[]byte
	n   int
	err error
	// What writeFn is to write (wbuf), has written (wn) or failed with.
	wbuf []byte
	wn   int
	werr error
	// queued is what inqFn found.
	queued int
	// lr limits a splice.
	lr io.LimitedReader
}

// init binds r's callbacks, once per copier.
func (r *rawCopier) init(cp *copier) {
	r.cp = cp
	r.readFn, r.writeFn, r.inqFn = r.readRaw, r.writeRaw, r.inq
}

// start and stop take and drop the direction's connections.
func (r *rawCopier) start() { r.rc, r.wrc = r.cp.d.rawSrc(), r.cp.d.rawDst() }
func (r *rawCopier) stop()  { r.rc, r.wrc, r.lr.R = nil, nil, nil }

// canPark: the poller can wait for src.
func (r *rawCopier) canPark() bool { return r.rc != nil }

// read waits until src has something to read, ended or failed, and reads
// it: n > 0 bytes in *bp (the caller puts bp back in copyBufs), or an error
// (io.EOF at the end; the deadline's; a closed connection's).
func (r *rawCopier) read() (*[]byte, int, error) {
	if r.rc == nil {
		return readBuffered(r.cp.d.src())
	}
	if err := r.rc.Read(r.readFn); err != nil {
		return nil, 0, err
	}
	bp, n, err := r.bp, r.n, r.err
	r.bp, r.err = nil, nil
	return bp, n, err
}

// readRaw is the syscall.RawConn.Read callback of read: false (wait for
// readability) while nothing is queued.
func (r *rawCopier) readRaw(fd uintptr) bool {
	bp := copyBufs.Get().(*[]byte)
	n, errno := rawIO(unix.SYS_READ, fd, *bp)
	switch {
	case errno == unix.EAGAIN:
		copyBufs.Put(bp)
		return false
	case errno != 0:
		r.n, r.err = 0, readError(r.cp.d.src(), errno)
	case n == 0:
		r.n, r.err = 0, io.EOF
	default:
		r.bp, r.n = bp, n
		return true
	}
	copyBufs.Put(bp)
	return true
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

// writeRaw is the syscall.RawConn.Write callback of write: false (wait for
// room) while dst's buffer is full.
func (r *rawCopier) writeRaw(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		n, errno := rawIO(unix.SYS_WRITE, fd, r.wbuf[r.wn:])
		switch errno {
		case 0:
			r.wn += n
		case unix.EAGAIN:
			return false
		default:
			dst := r.cp.d.dst()
			r.werr = &net.OpError{Op: "write", Net: "tcp", Source: dst.LocalAddr(), Addr: dst.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
			return true
		}
	}
	return true
}

// rawIO is read(2) or write(2) (trap) of b on a non-blocking descriptor,
// as a raw system call, retried on EINTR.
func rawIO(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, _, errno := unix.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		if errno != unix.EINTR {
			return int(n), errno
		}
	}
}

// bulk splices what src has queued while that is at least spliceMin, if
// src and dst are both *net.TCPConn. It returns whether src ended and the
// splice's error.
func (r *rawCopier) bulk() (eof bool, err error) {
	d := r.cp.d
	src, srcTCP := d.src().(*net.TCPConn)
	dst, dstTCP := d.dst().(*net.TCPConn)
	if !srcTCP || !dstTCP || r.rc == nil {
		return false, nil
	}
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
