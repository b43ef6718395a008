package localproxy

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pollerBatch is how many events one wakeup of the poller takes at most.
const pollerBatch = 128

// poller waits for data on behalf of parked directions: one epoll
// instance for the whole proxy, itself waited on by Go's network poller
// (an epoll descriptor is readable while it has events ready), so that no
// thread blocks in epoll_wait. A parked direction's socket is armed with
// EPOLLONESHOT and a key naming its connection and direction; the
// poller's goroutine resumes the direction when the socket is readable,
// has ended or failed. Keys are looked up, never trusted: the events of a
// connection that has finished find nothing and are dropped, whatever
// descriptor number they came from. A socket can be in several epoll sets:
// Go's own poller goes on working for it.
type poller struct {
	f    *os.File        // the epoll descriptor
	rc   syscall.RawConn // f's
	done chan struct{}   // closed when run returns

	mu    sync.Mutex // guards the fields below
	next  uint64     // the last id given
	conns map[uint64]*conn
}

// newPoller creates the epoll instance.
func newPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	// Non-blocking, so that os.NewFile hands it to Go's poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(fd), "localproxy-poller")
	// A file Go's poller does not wait on takes no deadline.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("epoll descriptor not pollable: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &poller{f: f, rc: rc, done: make(chan struct{}), conns: make(map[uint64]*conn)}, nil
}

// run resumes parked directions as their sockets become ready, until
// close.
func (p *poller) run() {
	defer close(p.done)
	events := make([]unix.EpollEvent, pollerBatch)
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		for {
			n, werr = unix.EpollWait(int(fd), events, 0)
			if werr != unix.EINTR {
				return n > 0 || werr != nil
			}
		}
	}
	for {
		if err := p.rc.Read(wait); err != nil || werr != nil {
			return // closed; epoll_wait fails only on a bad descriptor
		}
		for _, ev := range events[:n] {
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			p.mu.Lock()
			c := p.conns[key>>1]
			p.mu.Unlock()
			if c != nil {
				c.resume(int(key & 1))
			}
		}
	}
}

// close stops run and closes the epoll instance. Parked directions stay
// parked: closing their connection ends them.
func (p *poller) close() {
	p.f.Close()
	<-p.done
}

// add gives c an id for its keys.
func (p *poller) add(c *conn) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.conns[p.next] = c
	return p.next
}

// remove drops the id of a connection that finished: its events are
// ignored from now on.
func (p *poller) remove(id uint64) {
	p.mu.Lock()
	delete(p.conns, id)
	p.mu.Unlock()
}

// arm makes the poller resume d, of the connection named id, once its
// source socket is readable, has ended or failed (once: EPOLLONESHOT).
func (p *poller) arm(d *direction, id uint64) error {
	rc := d.rawSrc()
	if rc == nil {
		return errors.New("not a socket")
	}
	key := id<<1 | uint64(d.side)
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     int32(uint32(key)),
		Pad:    int32(uint32(key >> 32)),
	}
	op := unix.EPOLL_CTL_MOD
	if !d.registered {
		op = unix.EPOLL_CTL_ADD
	}
	// Set before: once armed, d belongs to whoever resumes it. If this
	// fails, MOD finds no registration and adds one.
	d.registered = true
	var err error
	// Both descriptors are held open for the call.
	cerr := p.rc.Control(func(epfd uintptr) {
		cerr := rc.Control(func(fd uintptr) {
			err = unix.EpollCtl(int(epfd), op, int(fd), &ev)
			switch {
			case err == unix.ENOENT && op == unix.EPOLL_CTL_MOD:
				err = unix.EpollCtl(int(epfd), unix.EPOLL_CTL_ADD, int(fd), &ev)
			case err == unix.EEXIST && op == unix.EPOLL_CTL_ADD:
				err = unix.EpollCtl(int(epfd), unix.EPOLL_CTL_MOD, int(fd), &ev)
			}
			if err != nil {
				err = os.NewSyscallError("epoll_ctl", err)
			}
		})
		if err == nil {
			err = cerr
		}
	})
	if err == nil {
		err = cerr
	}
	return err
}
