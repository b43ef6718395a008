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

// goyield is the runtime's own yield (gVisor's netstack calls it the same
// way; the runtime keeps it for them, go.dev/issue/67401): it puts the
// goroutine at the back of its own P's run queue and goes through the
// scheduler. runtime.Gosched puts it on the global queue and wakes an
// idle thread to run it, which finds nothing and sleeps again: a futex
// wake and two context switches per yield (in the LIST harness below,
// 2.2 futex calls per answer, none with goyield).
//
//go:linkname goyield runtime.goyield
func goyield()

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
// goroutine lets others run every pollerYield, and while busy bounds its
// waits, so that Go's sysmon never takes its P; once quiet, it parks in
// Go's network poller until the next event (planWait). With one P, a
// wait that holds it would keep it from every other goroutine, so the
// epoll descriptor is waited on through Go's network poller instead. An
// eventfd, key 0, wakes the poller to stop.
type poller struct {
	epfd, evfd int
	// f is epfd as an *os.File, which Go's poller waits on, and rc its
	// syscall.RawConn; nil when blocking.
	f        *os.File
	rc       syscall.RawConn
	blocking bool
	// gate is a second epoll instance, holding only epfd, armed for one
	// event (EPOLLONESHOT) only while the poller parks (park), as an *os.File
	// Go's poller waits on, and gateRC its syscall.RawConn: a blocking
	// poller that is quiet parks its goroutine on it (park), and Go's
	// poller sees none of the events of a busy one. nil when not
	// blocking, or when it could not be made (a quiet poller then waits
	// in epoll_wait).
	gate   *os.File
	gateRC syscall.RawConn
	gfd    int // gate's descriptor, while gate is open
	// look is park's look for events through gateRC, made once with
	// the gate: a function made on each park escapes into RawConn.Read,
	// and with what it writes cost three allocations per park. lookIn
	// and lookN, lookErr are its events and its results; only the
	// poller's goroutine parks.
	look    func(uintptr) bool
	lookIn  []unix.EpollEvent
	lookN   int
	lookErr error
	// gateUntil is the gate's read deadline as park last set it: set
	// again only when it changes (a quiet poller with no loop timer parks
	// with none, again and again).
	gateUntil time.Time
	done      chan struct{} // closed when run returns

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
	// without waiting. pipes are empty pipes kept for the loop's
	// splices, bufs empty copy buffers for its reads (getBuf). Only run
	// and what it calls use them.
	again []loopWork
	pipes [][2]int
	bufs  []*[]byte
	// pipesShortUntil: the kernel gave the poller a pipe too small to
	// splice through (its user's pipe quota spent), or none; until then,
	// it makes none (takePipe).
	pipesShortUntil time.Time
	// timers are the loop's deadlines (dials, accept backoff), soonest
	// first; they bound its wait. Only run and what it calls use them.
	timers loopTimers
	// splicing is the proxy's count of copies splicing (Proxy.splicing).
	splicing *atomic.Int32
	// now is when the poller's last wait returned: the time the steps of
	// its events go by (answerClock). seen is what those steps, and the
	// ones after them, wrote (noteWrite), until the poller plans its
	// next wait; await what they left it awaiting (stepsSeen.next),
	// kept until steps write again, but that a round of control frames
	// alone turns a late answer into nothing awaited: the poller holds
	// for an answer or a request due soon, or parks at once for a late
	// answer (planWait). Only run and what it calls use them.
	now   time.Time
	seen  stepsSeen
	await awaited
	// tally is what the steps wrote since it was last counted, count
	// what counts it (Proxy.count; nil: nothing does), counted when it
	// was last counted, and asked whether the steps since passed a
	// request upstream (noteWrite). It is counted (countTally) after a
	// round of events that passed a request, or in the first round
	// that ends tallyEvery or more after the last count (countRound);
	// before the poller waits in Go's poller or in a system call; before
	// a step closes its connection; and when run returns.
	tally   loopTally
	count   func(*loopTally)
	counted time.Time
	asked   bool
}

// tallyEvery is how long the poller, busy, leaves what its steps wrote
// uncounted (poller.tally) when they passed no request upstream: the
// bytes of answers, and the window updates their clients send back, are
// counted with the next request, or in the first round of events
// tallyEvery or more after the last count (the rounds of a busy poller
// come at least every pollerAwait: within 18ms, then), not after every
// round (a LIST's answer comes in a round per 4 KiB or so, each followed
// by the client's window update: counting each round cost 3% of the
// proxy's CPU per LIST in make bench). A request is counted at once:
// its server's held connection is to be PINGed within PingInterval
// (Proxy.wrote), 250ms by default. What answerClock takes for a control
// frame is not a request here either: a window update, or a small
// request sent within controlGap of its connection's last answer bytes,
// wakes the held connection within 18ms.
const tallyEvery = 10 * time.Millisecond

// stepsSeen is what the loop's steps wrote since the poller last planned
// a wait (poller.noteWrite).
type stepsSeen struct {
	// wrote: some step wrote, control frames aside; slowAsk: some
	// passed a request upstream whose answer comes pollerAwait or more
	// later (answerClock.wrote), fastAsk: one whose answer comes
	// sooner; answer: some passed bytes back to a client, askedLate: to
	// one whose next request comes pollerAwait or more later; control:
	// some passed a control frame upstream.
	wrote, slowAsk, fastAsk, answer, askedLate, control bool
}

// awaited is what the poller's last steps that wrote left it awaiting
// (stepsSeen.next), for its next wait (planWait).
type awaited uint8

const (
	// awaitedNothing: they passed bytes back to a client whose next
	// request comes pollerAwait or more later, if at all: what comes
	// next, and when, is the clients' to say.
	awaitedNothing awaited = iota
	// awaitedSoon: they passed requests upstream, one or more of them
	// with an answer due within pollerAwait, and nothing back; or bytes
	// back only to clients whose next requests come within pollerAwait
	// (answerClock): the poller holds for them, up to pollerAwait at a
	// time and pollerAwaitHold after the last event.
	awaitedSoon
	// awaitedLate: they passed requests upstream whose answers all come
	// pollerAwait or more later, and nothing back: the poller parks at
	// once.
	awaitedLate
)

// next is what the poller awaits after the steps seen, given what it
// awaited before them. Steps that wrote only control frames change
// nothing, but that a late answer is no longer awaited alone: a client
// that sends a window update is reading an answer whose next bytes may
// have waited for it (HTTP/2 flow control), and they come at once.
func (s stepsSeen) next(prev awaited) awaited {
	switch {
	case s.wrote:
		return s.awaited()
	case s.control && prev == awaitedLate:
		return awaitedNothing
	}
	return prev
}

// awaited is what the steps seen leave the poller awaiting.
func (s stepsSeen) awaited() awaited {
	switch {
	case s.askedLate:
		return awaitedNothing
	case s.answer, s.fastAsk:
		return awaitedSoon
	case s.slowAsk:
		return awaitedLate
	}
	return awaitedNothing
}

// pollerBatch is how many events one wakeup of the poller takes at most.
const pollerBatch = 128

// pollerYield is how long the poller's goroutine runs, through its
// waits, before it lets the scheduler run others (goyield): Go's sysmon
// preempts a goroutine seen on the same scheduling tick for 10ms, which
// costs a signal and a hand-off. In make bench (2 cores, yielding with
// runtime.Gosched then), never yielding cost 1.2-2.1× HAProxy's CPU per
// request, yielding every 2ms 1.07-1.27×, every 8-10ms 0.86-1.28×.
const pollerYield = 8 * time.Millisecond

// The poller's waits (planWait). Go's sysmon takes the P of a goroutine
// that has been in one system call for 10ms, or on one scheduling tick
// for 10ms (the latter with a preemption signal); each time it takes
// one, and each time a system call wakes it from the sleep it took while
// every P was idle, it polls every 20µs again for a millisecond and
// more. An event loop that waits in epoll_wait as a blocking system call
// pays that toll on every wait of 10ms or more. In a plain TCP harness
// (perf stat on the proxy, 2 cores, HAProxy 2.6 beside it), requests 50
// or 150ms apart with 2 KiB answers (a node agent's traffic) cost 864-961µs
// of CPU and 62-65 context switches each that way, against HAProxy's
// 141-171µs and 3; answers after 10ms of the server's time (the bench's
// LISTs' shape, 40 KiB) 231-287µs against 191-195µs. So the goroutine:
//
//   - while busy (events in the last pollerBusy) waits at most
//     pollerSlice, as a raw system call the runtime does not see
//     (waitHeld), after a yield when pollerWaitYield has passed since the
//     last one: no wait ends 10ms after a yield, so sysmon finds nothing
//     to take, and it is not woken. The P is held for up to pollerSlice,
//     as by any goroutine running that long: a stop of the world for the
//     garbage collector waits for the wait's end (with 8ms slices, a
//     busy loop made them 6-10ms; hence 4ms);
//   - while busy, waits up to pollerAwait (pollerAwaitSlice) instead,
//     the same way, if the last steps passed a request upstream whose
//     answer is due within pollerAwait (answerClock), and passed nothing
//     back, or passed bytes back only to clients whose next requests
//     come within pollerAwait (awaitedSoon): an answer, or a request,
//     4-8ms later ends the wait, where a 4ms one would end first, in a
//     wakeup for nothing and a park after it (on the harness, answers
//     5ms after each request, and requests 5ms after each answer; in
//     make bench, whose LISTs are answered 4-6ms after their requests,
//     the 4ms waits ended with nothing 0.72 times per LIST, each
//     followed by a park, until its 39-byte requests were told from
//     control frames (controlGap): 0.18 times since, in a run of 300).
//     Such a wait ends within pollerAwait of the last yield, so that the
//     round of events after it has 2ms of sysmon's slice. An answer due
//     soon that the wait outlasts (a LIST's, in make bench, came 8ms or
//     more after its request in two of five) is held for once more,
//     after a yield, until pollerAwaitHold after the last event, and
//     then the poller parks: parked at once after the first wait, the
//     loop made 0.45 parks per LIST, each with its gate's two epoll_ctl,
//     a look, a pass of Go's scheduler and its futex wakeups, where a
//     second wait costs a wakeup and one of sysmon's. In LIST-only runs
//     of make bench (1,500 LISTs each), five of each alternated on one
//     machine, parking after the first wait cost 0.94-1.15× HAProxy's
//     CPU per LIST (1.05× on average), holding once more 1.01-1.06×
//     (1.03×): within that machine's noise, but never as far above;
//     parking at once for every LIST's answer, as for a late one
//     (below), 1.11-1.17× in three. Those are the
//     only waits a stop of the world may wait 8ms for, but on a loop
//     carrying back-to-back LISTs they are most of its waits: its
//     garbage collector's pauses may last 6-10ms there, as with 8ms
//     slices. A pause stops the proxy's other goroutines (health
//     checks, discovery), not the loop's copying: the loop is what it
//     waits for;
//   - while busy, parks at once if the last steps passed a request
//     upstream on a connection whose answers come pollerAwait or more
//     after its requests (answerClock), and passed nothing back
//     (awaitedLate): a hold the answer outlasts ends in a wakeup for
//     nothing, and a park after it. In that harness, with both proxies
//     run side by side, that saved 2-11% of the CPU per LIST-shaped
//     answer (10ms after each request), and answers after 700µs cost
//     the same;
//   - once quiet, parks in Go's poller on the gate (waitPark), until an
//     event or its soonest timer (then a Go timer, the gate's deadline):
//     its P is free, no thread of the proxy's wakes until then, and
//     sysmon sleeps on. The loop's own system calls are raw for the same
//     reason (reads, writes, splices, SIOCINQ), except those of a new
//     connection (accept, socket options, connect);
//   - quiet without a gate, waits in epoll_wait as a system call
//     (waitSyscall).
//
// The same harness with this: 173-215µs and 4.4-4.7 context switches per
// sparse request, 189-227µs per LIST-shaped answer, with 2, 4 or 8ms
// slices alike. A longer busy spell cost more: 25ms 289-324µs per sparse
// request, 100ms 463-754µs (a wakeup per slice, and sysmon's, which polls
// every 10ms while the P is held). In make bench, GETs 50ms apart
// (get-sparse) cost 358µs against 1,423µs before, HAProxy's 186-191µs.
const (
	pollerBusy       = 4 * time.Millisecond
	pollerWaitYield  = time.Millisecond
	pollerSlice      = 4 // milliseconds, as epoll_wait takes them
	pollerAwait      = 8 * time.Millisecond
	pollerAwaitSlice = int(pollerAwait / time.Millisecond)
	pollerAwaitHold  = 2 * pollerAwait
)

// waitHow is how the poller waits for events (planWait).
type waitHow uint8

const (
	waitHeld waitHow = iota
	waitSyscall
	waitPark
)

// planWait is how the poller's goroutine waits, for how long in
// milliseconds (-1: no bound), and whether it yields first, given the
// timers' timeout, when the last events came, when it last yielded,
// whether it has a gate, and what the last steps that wrote left it
// awaiting.
func planWait(timeout int, now, lastEvent, yielded time.Time, gate bool, await awaited) (how waitHow, ms int, yield bool) {
	switch {
	case timeout == 0:
		return waitHeld, 0, false
	case now.Sub(lastEvent) < pollerBusy && !(gate && await == awaitedLate),
		await == awaitedSoon && now.Sub(lastEvent) < pollerAwaitHold:
		yield = now.Sub(yielded) >= pollerWaitYield
		slice := pollerSlice
		if await == awaitedSoon {
			// Ends within pollerAwait of the last yield: the round of
			// events after it has the rest of sysmon's 10ms, 2ms or
			// more, before the goroutine yields again (run).
			slice = pollerAwaitSlice
			if !yield {
				slice = int((pollerAwait - now.Sub(yielded)) / time.Millisecond)
			}
		}
		if timeout < 0 || timeout > slice {
			timeout = slice
		}
		return waitHeld, timeout, yield
	case gate:
		return waitPark, timeout, false
	default:
		return waitSyscall, timeout, false
	}
}

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
		p.gate, p.gateRC, p.gfd, _ = newGate(epfd)
		p.look = p.lookOnce
		return p, nil
	}
	if p.f, p.rc, err = pollable(epfd, "localproxy-poller"); err != nil {
		unix.Close(evfd) // pollable closed epfd
		return nil, err
	}
	return p, nil
}

// pollable hands fd to Go's poller, as an *os.File and its RawConn; on an
// error, fd is closed.
func pollable(fd int, name string) (*os.File, syscall.RawConn, error) {
	// Non-blocking, so that os.NewFile hands it to Go's poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(fd), name)
	// A file Go's poller does not wait on takes no deadline.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("epoll descriptor not pollable: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// newGate makes the poller's gate (poller.gate) on epfd.
func newGate(epfd int) (*os.File, syscall.RawConn, int, error) {
	gfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, nil, -1, os.NewSyscallError("epoll_create1", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT} // disarmed
	if err := unix.EpollCtl(gfd, unix.EPOLL_CTL_ADD, epfd, &ev); err != nil {
		unix.Close(gfd)
		return nil, nil, -1, os.NewSyscallError("epoll_ctl", err)
	}
	f, rc, err := pollable(gfd, "localproxy-poller-gate")
	return f, rc, gfd, err
}

// closeFDs closes the eventfd and the epoll descriptor.
func (p *poller) closeFDs() {
	unix.Close(p.evfd)
	if p.gate != nil {
		p.gate.Close()
	}
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
	defer p.countTally()
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
	// oneP: the P count has come down to one since newPoller (Go follows
	// a container's CPU limit), and a held wait would keep that P from
	// every other goroutine. Looked at on each yield, not on each wait:
	// runtime.GOMAXPROCS takes the scheduler's lock.
	oneP := false
	yield := func(now time.Time) {
		goyield()
		yielded = now
		oneP = runtime.GOMAXPROCS(0) == 1
	}
	var lastEvent time.Time
	for {
		now := time.Now()
		if now.Sub(yielded) >= pollerYield {
			yield(now)
			now = time.Now()
		}
		switch {
		case len(p.again) > 0:
			// More to copy: look for events without waiting.
			n, werr = p.wait(events, 0, waitHeld)
		case p.blocking:
			how, timeout, yieldFirst := p.plan(now, lastEvent, yielded)
			if yieldFirst {
				yield(now)
			}
			if how == waitHeld && timeout != 0 && oneP {
				how = waitSyscall
			}
			if how != waitHeld {
				// A wait of unbounded length, or (oneP) one the runtime
				// sees: no round counts the tally until it ends.
				p.countTally()
			}
			if how == waitPark {
				n, werr = p.park(events, p.timers.next())
			} else {
				n, werr = p.wait(events, timeout, how)
			}
		default:
			if err := p.rc.Read(wait); err != nil {
				return
			}
		}
		if werr != nil {
			return // epoll_wait fails only on a bad descriptor
		}
		now = time.Now()
		p.now = now
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
		if n > 0 {
			lastEvent = now
		}
		p.timers.run(now)
		p.runAgain()
		p.countRound(now)
	}
}

// plan is how the poller waits next (planWait), after it takes what the
// steps since its last wait leave it awaiting.
func (p *poller) plan(now, lastEvent, yielded time.Time) (how waitHow, ms int, yield bool) {
	p.await = p.seen.next(p.await)
	p.seen = stepsSeen{}
	return planWait(p.timers.timeout(now), now, lastEvent, yielded, p.gate != nil, p.await)
}

// countRound counts the tally after a round of events, if due
// (poller.tally). A loop that waits in Go's poller counts after every
// round: it does not plan its waits.
func (p *poller) countRound(now time.Time) {
	if !p.blocking || p.asked || now.Sub(p.counted) >= tallyEvery {
		p.countTally()
	}
}

// countTally has the steps' tally counted (poller.count), if there is
// something to count.
func (p *poller) countTally() {
	p.counted, p.asked = p.now, false
	if p.count != nil && p.tally.bytes != [2]int{} { // up only with bytes upstream
		p.count(&p.tally)
	}
}

// noteWrite is told by a step of a loop connection what it wrote. A
// control frame is no request or answer (stepsSeen.next): the window
// updates a client sends once it read an answer come between the answer
// and its next request, or before the answer's next bytes.
func (p *poller) noteWrite(what wroteWhat) {
	if what == wroteControl {
		p.seen.control = true
		return
	}
	p.seen.wrote = true
	switch what {
	case wroteAnswer:
		p.seen.answer, p.seen.askedLate = true, true
	case wroteAnswerAskedSoon:
		p.seen.answer = true
	case wroteSlowAsk:
		p.seen.slowAsk, p.asked = true, true
	case wroteFastAsk:
		p.seen.fastAsk, p.asked = true, true
	}
}

// wait is epoll_pwait on the epoll descriptor, with SIGURG blocked,
// retried on EINTR; timeout in milliseconds, -1: none; as a system call
// the runtime sees (waitSyscall) or not (waitHeld).
func (p *poller) wait(events []unix.EpollEvent, timeout int, how waitHow) (int, error) {
	return epollPwait(p.epfd, events, timeout, how)
}

// epollPwait is poller.wait on epfd.
func epollPwait(epfd int, events []unix.EpollEvent, timeout int, how waitHow) (int, error) {
	for {
		// Direct calls, so that the compiler keeps what the pointers
		// point to alive through them.
		var n uintptr
		var errno syscall.Errno
		if how == waitSyscall {
			n, _, errno = unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(timeout), uintptr(unsafe.Pointer(&sigurg)), unsafe.Sizeof(sigurg))
		} else {
			n, _, errno = unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(timeout), uintptr(unsafe.Pointer(&sigurg)), unsafe.Sizeof(sigurg))
		}
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

// park waits for events, until until if it is not zero, with the
// goroutine parked in Go's poller: it arms the gate, looks for events
// without waiting, and if there are none leaves the P until the gate is
// readable or until passes, then disarms the gate.
func (p *poller) park(events []unix.EpollEvent, until time.Time) (int, error) {
	if p.gateDeadline(until) != nil || p.armGate(unix.EPOLLIN|unix.EPOLLONESHOT) != 0 {
		return p.wait(events, p.timers.timeout(time.Now()), waitSyscall)
	}
	p.lookIn = events
	err := p.gateRC.Read(p.look)
	n, werr := p.lookN, p.lookErr
	p.lookIn, p.lookN, p.lookErr = nil, 0, nil
	// Disarmed again, whether it fired or not: the kernel disarms a
	// one-shot entry only when it reports it, and the events it fired for
	// were taken from epfd above, so it would stay armed and pass every
	// event of the busy poller on to Go's poller, waking a thread of its.
	// Events that come meanwhile are found by the next park's look.
	p.armGate(unix.EPOLLONESHOT)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, nil // a timer's due
	case err != nil:
		return 0, err
	}
	return n, werr
}

// gateDeadline sets the gate's read deadline to until, unless it is set
// to that already (poller.gateUntil).
func (p *poller) gateDeadline(until time.Time) error {
	if until.Equal(p.gateUntil) {
		return nil
	}
	if err := p.gate.SetReadDeadline(until); err != nil {
		return err
	}
	p.gateUntil = until
	return nil
}

// lookOnce is park's look (poller.look): the events there are, without
// waiting; true if there are some, or the wait failed.
func (p *poller) lookOnce(uintptr) bool {
	p.lookN, p.lookErr = p.wait(p.lookIn, 0, waitHeld)
	return p.lookN > 0 || p.lookErr != nil
}

// armGate sets the gate's events for epfd, as a raw system call, as the
// wait's: a system call the runtime sees wakes sysmon from the sleep it
// took while every P was idle (the poller parked), and it then polls
// every 20µs for a while.
func (p *poller) armGate(events uint32) syscall.Errno {
	ev := unix.EpollEvent{Events: events}
	_, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(p.gfd), unix.EPOLL_CTL_MOD, uintptr(p.epfd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	return errno
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

// loopEvents are what the poller watches a loop connection's socket
// for: readable (urgent data too), ended, writable; edge triggered.
const loopEvents = unix.EPOLLIN | unix.EPOLLPRI | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET

// addFD adds fd to the epoll set for events, under key. A socket ready
// for one of them is reported at once.
func (p *poller) addFD(fd int, key uint64, events uint32) error {
	return p.ctlFD(unix.EPOLL_CTL_ADD, fd, key, events)
}

// modFD sets the events fd, in the epoll set under key, is watched for.
// A socket ready for one of them is reported at once.
func (p *poller) modFD(fd int, key uint64, events uint32) error {
	return p.ctlFD(unix.EPOLL_CTL_MOD, fd, key, events)
}

// ctlFD is epoll_ctl op of fd for events under key, while the poller is
// open.
func (p *poller) ctlFD(op, fd int, key uint64, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	p.fds.RLock()
	defer p.fds.RUnlock()
	if p.closed {
		return errors.New("poller closed")
	}
	if err := unix.EpollCtl(p.epfd, op, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}
