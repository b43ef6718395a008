package localproxy

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// poller is the proxy's event loop: one epoll instance for the whole
// proxy. It carries two kinds of connections:
//
//   - a connection on the loop (evloop_linux.go) has both its sockets
//     taken out of Go's network poller and registered here, edge
//     triggered, for reading and writing: the poller's goroutine reads
//     and writes them itself, and no goroutine is woken per message;
//   - a connection that could not be taken off Go's poller copies on
//     goroutines (copy.go), and a direction with nothing to read parks
//     here: its socket is armed with EPOLLONESHOT, and the poller resumes
//     the direction on a goroutine once the socket is readable, has
//     ended or failed.
//
// Keys name the connection and the socket or direction; they are looked
// up, never trusted: the events of a connection that has finished find
// nothing and are dropped, whatever descriptor number they came from.
//
// With more than one P (GOMAXPROCS), the poller's goroutine blocks in
// epoll_wait itself, as an event loop does: data on any socket of the
// loop wakes that one thread, and no other (waking a goroutine through
// Go's network poller costs the scheduler more system calls and thread
// wakeups than the copy itself: in make bench, about a third of the
// proxy's CPU per request). Go's preemption signal (SIGURG) is blocked
// during the wait, so that it does not end the wait every 10ms; the
// goroutine lets others run every pollerYield, so that Go's sysmon does
// not take its P for running too long. The P the goroutine holds in the
// system call is taken for other work by sysmon, as with any blocking
// system call. With one P, that P would be kept from every other
// goroutine until sysmon takes it, so the epoll descriptor is waited on
// through Go's network poller instead. An eventfd, key 0, wakes the
// poller to stop.
type poller struct {
	epfd, evfd int
	// f is epfd as an *os.File, which Go's poller waits on, and rc its
	// syscall.RawConn; nil when blocking.
	f        *os.File
	rc       syscall.RawConn
	blocking bool
	done     chan struct{} // closed when run returns

	// fds guards the descriptors: epoll_ctl calls hold it for reading,
	// close for writing, so that none reaches a number closed and reused.
	fds    sync.RWMutex
	closed bool

	mu    sync.Mutex // guards the fields below
	next  uint64     // the last id given
	conns map[uint64]*conn
	// lns are the listeners the loop accepts on (evaccept_linux.go), by
	// id, from the same ids as conns.
	lns map[uint64]*loopListener

	// again holds loop connections with more to copy than one event's
	// share (loopShare): the poller goes on with them after the others,
	// without waiting. pipes are empty pipes kept for the loop's splices.
	// Only run uses them.
	again []loopWork
	pipes [][2]int
	// timers are the loop's deadlines (dials, accept backoff), soonest
	// first; they bound its wait. Only run and what it calls use them.
	timers loopTimers
	// splicing is the proxy's count of copies splicing (Proxy.splicing).
	splicing *atomic.Int32
}

// pollerBatch is how many events one wakeup of the poller takes at most.
const pollerBatch = 128

// pollerYield is how long the poller's goroutine runs, through its
// waits, before it lets the scheduler run others (runtime.Gosched): Go's
// sysmon preempts a goroutine seen on the same scheduling tick for 10ms,
// which costs a signal and a hand-off. In make bench (2 cores), never
// yielding cost 1.2-2.1× HAProxy's CPU per request, yielding every 2ms
// 1.07-1.27×, every 8-10ms 0.86-1.28×: each yield is a trip through the
// scheduler, so it yields as seldom as keeps sysmon away.
const pollerYield = 8 * time.Millisecond

// newPoller creates the epoll instance and its eventfd.
func newPoller() (*poller, error) {
	return newPollerMode(runtime.GOMAXPROCS(0) > 1)
}

// newPollerMode is newPoller, blocking in epoll_wait or not.
func newPollerMode(blocking bool) (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	p := &poller{epfd: epfd, evfd: evfd, blocking: blocking, done: make(chan struct{}), conns: make(map[uint64]*conn), lns: make(map[uint64]*loopListener)}
	ev := unix.EpollEvent{Events: unix.EPOLLIN} // key 0
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		p.closeFDs()
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	if blocking {
		return p, nil
	}
	// Non-blocking, so that os.NewFile hands it to Go's poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		p.closeFDs()
		return nil, os.NewSyscallError("fcntl", err)
	}
	p.f = os.NewFile(uintptr(epfd), "localproxy-poller")
	// A file Go's poller does not wait on takes no deadline.
	if err := p.f.SetReadDeadline(time.Time{}); err != nil {
		p.closeFDs()
		return nil, fmt.Errorf("epoll descriptor not pollable: %w", err)
	}
	if p.rc, err = p.f.SyscallConn(); err != nil {
		p.closeFDs()
		return nil, err
	}
	return p, nil
}

// closeFDs closes the eventfd and the epoll descriptor.
func (p *poller) closeFDs() {
	unix.Close(p.evfd)
	if p.f != nil {
		p.f.Close()
	} else {
		unix.Close(p.epfd)
	}
}

// sigurg is the signal set the blocking epoll_pwait blocks: Go's
// preemption signal.
var sigurg = uint64(1) << (unix.SIGURG - 1)

// run copies for the loop's connections and resumes parked directions as
// their sockets become ready, until close.
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
	yielded := time.Now()
	for {
		switch {
		case len(p.again) > 0:
			// More to copy: look for events without waiting.
			n, werr = p.wait(events, 0)
		case p.blocking:
			n, werr = p.wait(events, p.timers.timeout(time.Now()))
		default:
			if err := p.rc.Read(wait); err != nil {
				return
			}
		}
		if werr != nil {
			return // epoll_wait fails only on a bad descriptor
		}
		for _, ev := range events[:n] {
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if key == 0 {
				return // close
			}
			p.mu.Lock()
			c := p.conns[key>>1]
			var l *loopListener
			if c == nil {
				l = p.lns[key>>1]
			}
			p.mu.Unlock()
			switch {
			case l != nil:
				l.ready()
			case c == nil:
			case c.ev != nil:
				c.onKey(key, ev.Events)
			default:
				c.resume(int(key & 1))
			}
		}
		p.timers.run(time.Now())
		p.runAgain()
		if time.Since(yielded) >= pollerYield {
			runtime.Gosched()
			yielded = time.Now()
		}
	}
}

// wait is epoll_pwait on the epoll descriptor, with SIGURG blocked,
// retried on EINTR; timeout in milliseconds, -1: none.
func (p *poller) wait(events []unix.EpollEvent, timeout int) (int, error) {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(timeout), uintptr(unsafe.Pointer(&sigurg)), unsafe.Sizeof(sigurg))
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		default:
			return 0, errno
		}
	}
}

// close stops run and closes the epoll instance. Parked directions and
// the loop's connections stay as they are: closing a connection ends it.
func (p *poller) close() {
	p.fds.Lock()
	closed := p.closed
	p.closed = true
	p.fds.Unlock()
	if closed {
		return
	}
	one := [8]byte{1}
	unix.Write(p.evfd, one[:])
	<-p.done
	for _, fds := range p.pipes {
		unix.Close(fds[0])
		unix.Close(fds[1])
	}
	p.closeFDs()
}

// add gives c an id for its keys.
func (p *poller) add(c *conn) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.conns[p.next] = c
	return p.next
}

// at arms t, a loop timer, for when; the poller's goroutine only.
func (p *poller) at(t *loopTimer, when time.Time) { p.timers.at(t, when) }

// stop disarms t, a loop timer; the poller's goroutine only.
func (p *poller) stop(t *loopTimer) { p.timers.stop(t) }

// addListener registers l's socket, edge triggered, for its
// connections; a listener with connections queued already is reported
// at once.
func (p *poller) addListener(l *loopListener) error {
	p.mu.Lock()
	p.next++
	l.id = p.next
	p.lns[l.id] = l
	p.mu.Unlock()
	err := p.addFD(l.fd, l.id<<1, unix.EPOLLIN|unix.EPOLLET)
	if err != nil {
		p.mu.Lock()
		delete(p.lns, l.id)
		p.mu.Unlock()
	}
	return err
}

// removeListener takes l off the loop: once it returns, the poller's
// goroutine does not use l's descriptor again, and its owner may close
// it.
func (p *poller) removeListener(l *loopListener) {
	l.mu.Lock()
	l.removed = true
	p.fds.RLock()
	if !p.closed {
		unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, l.fd, nil)
	}
	p.fds.RUnlock()
	l.mu.Unlock()
	p.mu.Lock()
	delete(p.lns, l.id)
	p.mu.Unlock()
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
	return p.ctl(rc, func(epfd, fd int) error {
		err := unix.EpollCtl(epfd, op, fd, &ev)
		switch {
		case err == unix.ENOENT && op == unix.EPOLL_CTL_MOD:
			err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev)
		case err == unix.EEXIST && op == unix.EPOLL_CTL_ADD:
			err = unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &ev)
		}
		return err
	})
}

// ctl runs op on the epoll descriptor and rc's socket, both held open
// meanwhile.
func (p *poller) ctl(rc syscall.RawConn, op func(epfd, fd int) error) error {
	p.fds.RLock()
	defer p.fds.RUnlock()
	if p.closed {
		return errors.New("poller closed")
	}
	var err error
	cerr := rc.Control(func(fd uintptr) {
		if err = op(p.epfd, int(fd)); err != nil {
			err = os.NewSyscallError("epoll_ctl", err)
		}
	})
	if err == nil {
		err = cerr
	}
	return err
}

// register adds fd, a socket of a loop connection, to the epoll set for
// reading (urgent data too) and writing, edge triggered, under key. A socket that is
// ready already is reported at once.
func (p *poller) register(fd int, key uint64) error {
	return p.addFD(fd, key, unix.EPOLLIN|unix.EPOLLPRI|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET)
}

// addFD adds fd to the epoll set for events, under key.
func (p *poller) addFD(fd int, key uint64, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	p.fds.RLock()
	defer p.fds.RUnlock()
	if p.closed {
		return errors.New("poller closed")
	}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}
