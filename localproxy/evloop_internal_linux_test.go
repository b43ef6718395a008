package localproxy

import (
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// connectedFD is a non-blocking TCP socket connected to a listener of
// the test's, and the listener's side of the connection.
func connectedFD(t *testing.T) (int, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer ln.Close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	a := ln.Addr().(*net.TCPAddr)
	require.NoError(t, unix.Connect(fd, &unix.SockaddrInet4{Port: a.Port, Addr: [4]byte(a.IP.To4())}))
	require.NoError(t, unix.SetNonblock(fd, true))
	peer, err := ln.AcceptTCP()
	require.NoError(t, err)
	t.Cleanup(func() { peer.Close() })
	return fd, peer
}

// awaitFD waits until fd reports one of events, or hangs up or fails,
// for at most 5s.
func awaitFD(t *testing.T, fd int, events int16) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		_, err := unix.Poll(fds, 100)
		if err != nil && err != unix.EINTR {
			t.Fatalf("poll fd %d: %v", fd, err)
		}
		if fds[0].Revents&(events|unix.POLLHUP|unix.POLLERR) != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fd %d: none of events %#x within 5s", fd, events)
		}
	}
}

// loopConn is a connection on a loop of its own between clientFD and
// upFD (upstream's far side), with the first-byte watch armed for the
// client's TLS hello sent upstream; its proxy counts the endpoint's
// silence.
func loopConn(t *testing.T, clientFD, upFD int, upstream *net.TCPConn, onLoop bool) (*Proxy, *poller, *conn) {
	t.Helper()
	p, err := New(Config{Endpoints: []string{upstream.LocalAddr().String()}, Registry: prometheus.NewRegistry(), FirstByteTimeout: time.Minute})
	require.NoError(t, err)
	poll, err := newPollerMode(true)
	require.NoError(t, err)
	p.pollInit.Do(func() { p.poll = poll })
	t.Cleanup(poll.closeFDs)
	c := &conn{p: p, addr: upstream.LocalAddr().String()}
	c.id = poll.add(c)
	c.ev = &evConn{fds: [2]int{clientFD, upFD}}
	t.Cleanup(c.close) // closes both sockets, once
	for side := range c.dirs {
		c.dirs[side].c, c.dirs[side].side = c, side
	}
	c.fb = p.fb.watch(c.addr)
	require.NotNil(t, c.fb, "no first-byte watch")
	if onLoop {
		c.fb.loop = poll
	}
	c.fb.sent(flightHello) // the client's TLS hello went upstream
	return p, poll, c
}

// The upstream ends before its first byte (EOF) and passing that end on
// to a client that has reset fails (shutdown: ENOTCONN), in one step of
// the loop. The first-byte watch is told the read's outcome, an end
// without a byte, not the shutdown's error: that is the client's doing
// and says nothing of the endpoint, which must not be counted silent.
func TestLoopTellsTheWatchTheReadNotTheShutdown(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	p, _, c := loopConn(t, clientFD, upFD, upstream, false)

	require.NoError(t, client.SetLinger(0))
	client.Close() // a reset
	upstream.Close()
	for _, fd := range []int{clientFD, upFD} { // both arrived
		awaitFD(t, fd, unix.POLLIN)
	}

	c.step(toClient, stepReadable)
	require.True(t, c.isClosed(), "the failed shutdown did not close the connection: the test proves nothing")
	require.Zero(t, counterValue(p.m.silent), "the client's reset counted the endpoint silent")
}

// A loop connection's first-byte deadline is the poller's timer; the
// upstream's first byte, or its failure before one, disarms it. Left
// armed until it passed, it would keep a quiet poller's wait bounded by
// it (planWait), for nothing.
func TestLoopDisarmsTheWatchOnTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(*net.TCPConn)
	}{
		{"a byte", func(up *net.TCPConn) { up.Write([]byte{1}) }},
		{"a reset", func(up *net.TCPConn) { up.SetLinger(0); up.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clientFD, _ := connectedFD(t)
			upFD, upstream := connectedFD(t)
			_, poll, c := loopConn(t, clientFD, upFD, upstream, true)
			require.Len(t, poll.timers, 1, "sent armed no deadline on the loop: the test proves nothing")

			tc.answer(upstream)
			awaitFD(t, upFD, unix.POLLIN)
			c.step(toClient, stepReadable)
			require.Nil(t, c.fb, "the watch was not settled")
			require.Empty(t, poll.timers, "the first-byte deadline stayed armed on the loop after the answer")
		})
	}
}

// A connection's answers are late once six in a row came pollerAwait or
// more after their requests, and after a spell of late ones, in time
// again after six in time; bytes passed back with no request awaiting
// them (a watch's events) time nothing; an answer is timed from the
// request's last bytes; and writes upstream of fewer than controlWrite
// bytes within controlGap of bytes passed back (HTTP/2 window updates)
// are no requests: neither those a client sends while a LIST's answer
// streams in, nor the one after an answer, long before the next
// request, make answers in time or late.
func TestAnswerClock(t *testing.T) {
	var a answerClock
	t0 := time.Unix(1_000_000, 0)
	ask := func(at time.Time) bool {
		t.Helper()
		what := a.wrote(toUpstream, 200, at)
		require.Contains(t, []wroteWhat{wroteFastAsk, wroteSlowAsk}, what, "a request of 200 bytes")
		return what == wroteSlowAsk
	}
	back := func(at time.Time) {
		t.Helper()
		require.Contains(t, []wroteWhat{wroteAnswer, wroteAnswerAskedSoon}, a.wrote(toClient, 4096, at))
	}
	update := func(at time.Time) {
		t.Helper()
		require.Equal(t, wroteControl, a.wrote(toUpstream, 48, at), "a pair of window updates")
	}
	exchange := func(took time.Duration) bool {
		t.Helper()
		ask(t0)
		t0 = t0.Add(time.Second)
		late := ask(t0) // the request's rest
		back(t0.Add(took))
		back(t0.Add(took + time.Second)) // the answer's rest
		t0 = t0.Add(took + 2*time.Second)
		return late
	}
	for i := range 6 {
		require.False(t, exchange(pollerAwait), "late before answer %d of 6 late ones", i+1)
	}
	for range 100 {
		require.True(t, exchange(10*time.Millisecond), "not late after six late answers")
	}
	for i := range 6 {
		require.True(t, exchange(pollerAwait-time.Microsecond), "in time again after %d of six answers in time", i)
	}
	require.False(t, exchange(time.Millisecond), "still late after six answers in time")
	for range 20 {
		back(t0) // nothing asked
		t0 = t0.Add(time.Minute)
	}
	require.False(t, ask(t0), "bytes passed back unasked made the answers late")
	back(t0.Add(time.Millisecond))

	// GETs 50ms apart, answered in 700µs, each answer followed by a
	// window update.
	for range 20 {
		t0 = t0.Add(50 * time.Millisecond)
		require.False(t, ask(t0), "a GET answered in 700µs, after a window update 50ms before it, judged late")
		t0 = t0.Add(700 * time.Microsecond)
		back(t0)
		update(t0.Add(50 * time.Microsecond))
	}

	// LISTs answered 10ms after each request, in ten pieces, each but
	// the first after the client's window updates.
	list := func() bool {
		t.Helper()
		late := ask(t0)
		t0 = t0.Add(10 * time.Millisecond)
		back(t0)
		for range 9 {
			update(t0.Add(20 * time.Microsecond))
			t0 = t0.Add(50 * time.Microsecond)
			back(t0)
		}
		t0 = t0.Add(time.Millisecond)
		return late
	}
	for i := range 6 {
		require.False(t, list(), "LIST %d of 6 late ones judged late", i+1)
	}
	require.True(t, list(), "not late after six LISTs answered 10ms later: the window updates counted as requests")
}

// The client's clock: a client whose next request comes within
// pollerAwait of the last bytes passed back to it asks soon once six in
// a row did, and late again after six that did not; a fresh connection's
// asks late; the window updates it sends after reading an answer are no
// request, and end nothing: timed from them, a request 5ms after the
// answer would come 5ms after them too, but one pollerAwait after it
// would not.
func TestAnswerClockTimesTheClient(t *testing.T) {
	var a answerClock
	t0 := time.Unix(1_000_000, 0)
	// round: a request, its answer 1ms later, the client's window update
	// after it, and its next request gap after the answer; says whether
	// the answer was passed back to a client that asks soon.
	round := func(gap time.Duration) bool {
		t.Helper()
		require.Contains(t, []wroteWhat{wroteFastAsk, wroteSlowAsk}, a.wrote(toUpstream, 200, t0))
		t0 = t0.Add(time.Millisecond)
		what := a.wrote(toClient, 4096, t0)
		require.Contains(t, []wroteWhat{wroteAnswer, wroteAnswerAskedSoon}, what)
		require.Equal(t, wroteControl, a.wrote(toUpstream, 48, t0.Add(50*time.Microsecond)))
		t0 = t0.Add(gap)
		return what == wroteAnswerAskedSoon
	}
	for i := range 6 {
		require.False(t, round(5*time.Millisecond), "asked soon at answer %d, after %d requests 5ms after the answer before it", i+1, i)
	}
	for range 50 {
		require.True(t, round(5*time.Millisecond), "asked late after six requests 5ms after the answer")
	}
	for i := range 6 {
		require.True(t, round(50*time.Millisecond), "asked late again after %d of six requests 50ms after the answer", i)
	}
	for range 50 {
		require.False(t, round(pollerAwait), "asked soon after requests pollerAwait after the answer")
	}

	// A client that asks soon, then only reads a watch's events, a
	// second apart, no request between: it asks late from the sixth
	// (the first comes a second after the last answer).
	for range 50 {
		round(time.Millisecond)
	}
	for i := range 7 {
		t0 = t0.Add(time.Second)
		what := a.wrote(toClient, 300, t0)
		require.Equal(t, i < 5, what == wroteAnswerAskedSoon, "event %d, a second after the last bytes passed back", i+1)
		require.Equal(t, what, a.wrote(toClient, 300, t0.Add(pollerAwait-time.Microsecond)), "bytes within pollerAwait of the last counted")
	}
}

// A repeated HTTP/2 request is as small as a pair of window updates
// (HPACK: the bench's LISTs take 39 bytes in TLS 1.3 records), and is
// told from them by its time: window updates follow the bytes passed
// back within controlGap; the next request comes once the client has
// decoded the answer. Here LISTs of 39 bytes, each answered in four
// pieces with a pair of window updates 80µs after each, the next LIST
// 2.6ms after the last piece: each request is timed, answers 5ms later
// are in time (the poller holds for them), 10ms later late (it parks);
// the client asks soon; a second request before any answer (HTTP/2
// multiplexes them) is a request too; and a window update sent late,
// taken for a request, does not make a client that asks 50ms after
// each answer one that asks soon; nor is a small write after a request
// a control frame.
func TestAnswerClockTellsSmallRequestsFromControlFrames(t *testing.T) {
	var a answerClock
	t0 := time.Unix(1_000_000, 0)
	list := func(took time.Duration) (asked, answered wroteWhat) {
		t.Helper()
		asked = a.wrote(toUpstream, 39, t0)
		t0 = t0.Add(took)
		for i := range 4 {
			what := a.wrote(toClient, 4127, t0)
			if i == 0 {
				answered = what
			}
			require.Equal(t, wroteControl, a.wrote(toUpstream, 48, t0.Add(80*time.Microsecond)), "a pair of window updates 80µs after the bytes they acknowledge")
			t0 = t0.Add(200 * time.Microsecond)
		}
		t0 = t0.Add(2600 * time.Microsecond)
		return asked, answered
	}
	for i := range 20 {
		asked, answered := list(5 * time.Millisecond)
		require.Equal(t, wroteFastAsk, asked, "LIST %d, 39 bytes, 2.6ms after the last answer: not taken for a request answered in time", i+1)
		if i >= 6 {
			require.Equal(t, wroteAnswerAskedSoon, answered, "LIST %d: its client, asking 2.6ms after each answer, not taken for one that asks soon", i+1)
		}
	}
	for range 6 {
		list(10 * time.Millisecond)
	}
	asked, _ := list(10 * time.Millisecond)
	require.Equal(t, wroteSlowAsk, asked, "39-byte LISTs answered 10ms later not judged late")
	require.Equal(t, wroteSlowAsk, a.wrote(toUpstream, 39, t0), "the next LIST")
	require.Equal(t, wroteSlowAsk, a.wrote(toUpstream, 39, t0.Add(10*time.Microsecond)), "a second request, before any answer")

	// A window update sent late (1.5ms after the bytes, by a busy
	// client) is taken for a request; the client's real one, 50ms
	// after the answer, is what its clock counts: it does not ask soon.
	var b answerClock
	for i := range 30 {
		b.wrote(toUpstream, 39, t0)
		t0 = t0.Add(700 * time.Microsecond)
		require.Equal(t, wroteAnswer, b.wrote(toClient, 2048, t0), "GET %d, 50ms after the answer before it: its client taken for one that asks soon", i+1)
		require.Equal(t, wroteFastAsk, b.wrote(toUpstream, 48, t0.Add(1500*time.Microsecond)), "a window update 1.5ms after the bytes")
		t0 = t0.Add(50 * time.Millisecond)
	}

	// A small write after a request (HTTP/1.1, 100µs after the bytes
	// before it), within controlGap of those bytes, goes with the
	// request: a second one, or the first's end.
	var c answerClock
	c.wrote(toClient, 4096, t0)
	require.Equal(t, wroteFastAsk, c.wrote(toUpstream, 200, t0.Add(100*time.Microsecond)), "a request 100µs after the bytes")
	require.Equal(t, wroteFastAsk, c.wrote(toUpstream, 39, t0.Add(200*time.Microsecond)), "39 bytes after it")
}

// Requests whose answers all come late, and nothing passed back: only
// then does the poller park at once; one whose answer is due soon, and
// nothing back: the poller holds for it.
func TestStepsSeenAwaited(t *testing.T) {
	for _, tc := range []struct {
		seen       stepsSeen
		prev, next awaited
	}{
		{stepsSeen{}, awaitedLate, awaitedLate},
		{stepsSeen{}, awaitedSoon, awaitedSoon},
		{stepsSeen{control: true}, awaitedLate, awaitedNothing},
		{stepsSeen{control: true}, awaitedSoon, awaitedSoon},
		{stepsSeen{control: true}, awaitedNothing, awaitedNothing},
		{stepsSeen{wrote: true, control: true, slowAsk: true}, awaitedSoon, awaitedLate},
		{stepsSeen{wrote: true, answer: true, askedLate: true}, awaitedSoon, awaitedNothing},
	} {
		require.Equal(t, tc.next, tc.seen.next(tc.prev), "%+v after %d", tc.seen, tc.prev)
	}
	for _, tc := range []struct {
		seen stepsSeen
		want awaited
	}{
		{stepsSeen{wrote: true, slowAsk: true}, awaitedLate},
		{stepsSeen{wrote: true, slowAsk: true, fastAsk: true}, awaitedSoon},
		{stepsSeen{wrote: true, slowAsk: true, answer: true, askedLate: true}, awaitedNothing},
		{stepsSeen{wrote: true, slowAsk: true, answer: true}, awaitedSoon},
		{stepsSeen{wrote: true, fastAsk: true}, awaitedSoon},
		{stepsSeen{wrote: true, fastAsk: true, answer: true, askedLate: true}, awaitedNothing},
		{stepsSeen{wrote: true, answer: true, askedLate: true}, awaitedNothing},
		{stepsSeen{wrote: true, answer: true}, awaitedSoon},
		{stepsSeen{wrote: true}, awaitedNothing},
		{stepsSeen{}, awaitedNothing},
	} {
		require.Equal(t, tc.want, tc.seen.awaited(), "%+v", tc.seen)
	}
	var p poller
	p.noteWrite(wroteControl)
	require.Equal(t, stepsSeen{control: true}, p.seen, "a control frame taken for a request or an answer")
	p.seen = stepsSeen{}
	p.noteWrite(wroteSlowAsk)
	p.noteWrite(wroteFastAsk)
	require.Equal(t, stepsSeen{wrote: true, slowAsk: true, fastAsk: true}, p.seen)
	p.noteWrite(wroteAnswerAskedSoon)
	require.Equal(t, stepsSeen{wrote: true, slowAsk: true, fastAsk: true, answer: true}, p.seen)
	p.noteWrite(wroteAnswer)
	require.Equal(t, stepsSeen{wrote: true, slowAsk: true, fastAsk: true, answer: true, askedLate: true}, p.seen)
}

// The loop's steps time a connection's answers (answerClock) by the
// poller's clock, and tell the poller when a request they passed on is
// one whose answer comes late (planWait then parks at once): a LIST-like
// upstream, answering 10ms after each request, is late from its seventh.
func TestLoopNotesALateAnswer(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	_, poll, c := loopConn(t, clientFD, upFD, upstream, false)
	buf := make([]byte, 64)
	now := time.Now()
	for i := range 8 {
		_, err := client.Write([]byte("GET /api/v1/pods HTTP/1.1\r\nHost: 10.0.0.1:6443\r\nUser-Agent: kubelet\r\n\r\n"))
		require.NoError(t, err)
		awaitFD(t, clientFD, unix.POLLIN)
		poll.now, poll.seen = now, stepsSeen{}
		c.step(toUpstream, stepReadable)
		require.Equal(t, stepsSeen{wrote: true, slowAsk: i >= 6, fastAsk: i < 6}, poll.seen, "request %d", i+1)
		_, err = upstream.Read(buf)
		require.NoError(t, err)

		_, err = upstream.Write([]byte("a list"))
		require.NoError(t, err)
		awaitFD(t, upFD, unix.POLLIN)
		poll.now, poll.seen = now.Add(10*time.Millisecond), stepsSeen{}
		c.step(toClient, stepReadable)
		require.Equal(t, stepsSeen{wrote: true, answer: true, askedLate: true}, poll.seen, "answer %d: its client asks again a second later", i+1)
		_, err = client.Read(buf)
		require.NoError(t, err)
		now = now.Add(time.Second)
	}
}

// The loop's steps tally what they write, and the poller has it counted
// once per round of events; a step that ends its connection has it
// counted first, so that a connection gone from the proxy has its bytes
// in the metrics (as TestForwardsAndCounts reads them). Here no poller
// runs: only the steps count.
func TestLoopCountsBeforeTheConnectionEnds(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	p, poll, c := loopConn(t, clientFD, upFD, upstream, false)
	poll.count = p.count
	p.pipes.Add(1) // as serve does; finish ends it
	_, err := client.Write([]byte("hello"))
	require.NoError(t, err)
	require.NoError(t, client.CloseWrite())
	awaitFD(t, clientFD, unix.POLLRDHUP) // the FIN, behind the bytes
	c.step(toUpstream, stepEnded)
	_, err = upstream.Write([]byte("world!"))
	require.NoError(t, err)
	require.NoError(t, upstream.CloseWrite())
	awaitFD(t, upFD, unix.POLLRDHUP)
	c.step(toClient, stepEnded)
	require.True(t, c.isClosed(), "both ends passed on, and the connection is not closed: the test proves nothing")
	require.Equal(t, 5.0, counterValue(p.bytesIn), "bytes in")
	require.Equal(t, 6.0, counterValue(p.bytesOut), "bytes out")
	require.Empty(t, poll.tally.up, "the tally was not emptied")
}

func TestLoopTally(t *testing.T) {
	var tl loopTally
	tl.add(toUpstream, 3, "10.0.0.1:6443")
	tl.add(toClient, 40, "10.0.0.1:6443")
	tl.add(toUpstream, 2, "10.0.0.2:6443")
	tl.add(toUpstream, 1, "10.0.0.1:6443")
	require.Equal(t, [2]int{6, 40}, tl.bytes)
	require.Equal(t, []string{"10.0.0.1:6443", "10.0.0.2:6443"}, tl.up, "each upstream written to, once")
}

// After a round of events that passed a request upstream, the poller
// has its tally counted at once: the request wakes its server's held
// connection (Proxy.wrote). The rounds of an answer, and of the window
// updates its client sends back, are counted only tallyEvery after the
// last count (or before the poller waits quiet, run).
func TestLoopCountsRequestsAtOnceAndAnswersInBatches(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	p, poll, c := loopConn(t, clientFD, upFD, upstream, false)
	var counts []loopTally
	poll.count = func(tl *loopTally) {
		counts = append(counts, loopTally{bytes: tl.bytes, up: slices.Clone(tl.up)})
		p.count(tl)
	}
	addr := upstream.LocalAddr().String()
	buf := make([]byte, 64<<10)
	start := time.Now()
	// round is one round of events at start+at: n bytes from src's far
	// end through direction side, read at dst's.
	round := func(at time.Duration, side, n int) {
		t.Helper()
		src, dst, fd := client, upstream, clientFD
		if side == toClient {
			src, dst, fd = upstream, client, upFD
		}
		_, err := src.Write(make([]byte, n))
		require.NoError(t, err)
		awaitFD(t, fd, unix.POLLIN)
		poll.now = start.Add(at) // as run sets it
		c.step(side, stepReadable)
		require.NoError(t, dst.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = io.ReadFull(dst, buf[:n])
		require.NoError(t, err)
		poll.countRound(poll.now)
	}

	poll.counted = start      // as if the poller had just counted
	round(0, toUpstream, 200) // a request
	require.Equal(t, []loopTally{{bytes: [2]int{200, 0}, up: []string{addr}}}, counts, "the request's round was not counted at once")
	ms := time.Millisecond
	round(5*ms, toClient, 4096)                      // its answer's first part
	round(5*ms+100*time.Microsecond, toUpstream, 48) // the client's window update
	round(6*ms, toClient, 4096)
	require.Len(t, counts, 1, "an answer's rounds were counted within tallyEvery of the last count")
	round(tallyEvery, toClient, 1000)
	require.Len(t, counts, 2, "nothing counted tallyEvery after the last count")
	require.Equal(t, loopTally{bytes: [2]int{48, 9192}, up: []string{addr}}, counts[1])
	round(tallyEvery+ms, toClient, 10)
	round(tallyEvery+3*ms, toUpstream, 200) // the next request
	require.Len(t, counts, 3, "the next request's round was not counted at once")
	require.Equal(t, loopTally{bytes: [2]int{200, 10}, up: []string{addr}}, counts[2])
	require.Equal(t, 448.0, counterValue(p.bytesIn), "bytes in")
	require.Equal(t, 9202.0, counterValue(p.bytesOut), "bytes out")
}

// The poller keeps loopBufs empty copy buffers for its reads, the last
// given back first, and takes the pool's when it has none.
func TestPollerKeepsCopyBuffers(t *testing.T) {
	var p poller
	a, b, c := p.getBuf(), p.getBuf(), p.getBuf()
	require.Len(t, *a, copyBufSize)
	p.putBuf(a)
	p.putBuf(b)
	p.putBuf(c) // one more than it keeps: to the pool
	require.Len(t, p.bufs, loopBufs)
	require.Same(t, b, p.getBuf())
	require.Same(t, a, p.getBuf())
	require.Empty(t, p.bufs)
}

// The half-open timeout of a connection on a loop that waits in
// epoll_wait is a timer of the loop's, armed when the first direction
// ends and disarmed by the last step: a connection that ended normally
// leaves nothing in the loop's timers (which bound its waits, and would
// hold the connection for a minute each).
func TestLoopHalfOpenTimerEndsWithTheConnection(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	_, poll, c := loopConn(t, clientFD, upFD, upstream, false)
	require.True(t, poll.blocking)
	require.Positive(t, c.p.cfg.HalfOpenTimeout)
	c.p.pipes.Add(1) // done by the last step's finish, as for a dialed connection

	require.NoError(t, client.CloseWrite())
	awaitFD(t, clientFD, unix.POLLIN)
	c.step(toUpstream, stepEnded)
	require.Len(t, poll.timers, 1, "no half-open timer on the loop")
	assert.WithinDuration(t, time.Now().Add(c.p.cfg.HalfOpenTimeout), poll.timers[0].when, 10*time.Second)

	require.NoError(t, upstream.CloseWrite())
	awaitFD(t, upFD, unix.POLLIN)
	c.step(toClient, stepEnded)
	require.True(t, c.isClosed(), "both directions ended: the connection is not closed")
	assert.Empty(t, poll.timers, "the half-open timer outlived the connection")
}

// A pipe the kernel keeps small (its user's pipe pages spent: two pages,
// not to be grown) is not spliced through: the copy goes on through the
// buffer, and the pipe is closed, not kept; for pipeShortFor, no pipe is
// made, but a pooled one is handed out. One it grows is taken, and so is
// one it refuses to grow past its default 64 KiB (fs.pipe-max-size
// lowered).
func TestLoopSplicesOnlyThroughAPipeThatGrew(t *testing.T) {
	clientFD, client := connectedFD(t)
	upFD, upstream := connectedFD(t)
	p, poll, c := loopConn(t, clientFD, upFD, upstream, false)
	poll.splicing = &p.splicing
	_, err := client.Write(make([]byte, 2*spliceMin))
	require.NoError(t, err)
	var queued int
	for deadline := time.Now().Add(5 * time.Second); queued < spliceMin && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		queued, err = unix.IoctlGetInt(clientFD, unix.SIOCINQ)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, queued, spliceMin)
	// The pipes open now, by inode: Go's own splices (copies on
	// goroutines) close theirs when it collects them, at any time.
	pipes := func() map[string]bool {
		m := make(map[string]bool)
		es, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		for _, e := range es {
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
				m[l] = true
			}
		}
		return m
	}
	noneLeft := func(before map[string]bool, msg string) {
		t.Helper()
		for l := range pipes() {
			assert.True(t, before[l], "%s: %s", msg, l)
		}
	}
	before := pipes()
	e := &c.ev.dirs[toUpstream]

	defer func(f func(int, int) (int, error)) { pipeResize = f }(pipeResize)
	resized := 0
	resizeTo := func(size int, err error) func(int, int) (int, error) {
		return func(fd, n int) (int, error) {
			resized++
			if size == 0 {
				return unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, n)
			}
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, size); err != nil {
				return 0, err
			}
			return 0, err
		}
	}
	// As the kernel does once the quota is spent.
	pipeResize = resizeTo(2*os.Getpagesize(), unix.EPERM)
	poll.now = time.Now()
	poll.takePipe(e, clientFD)
	assert.Equal(t, [2]int{}, e.pipe, "took a pipe of two pages")
	assert.Zero(t, p.splicing.Load(), "counted as splicing")
	noneLeft(before, "pipe left open")
	require.Equal(t, 1, resized)

	// For a while, no pipe is made at all; a pooled one is handed out.
	pipeResize = resizeTo(0, nil)
	poll.now = poll.now.Add(pipeShortFor - time.Millisecond)
	poll.takePipe(e, clientFD)
	assert.Equal(t, [2]int{}, e.pipe, "made a pipe right after a shortage")
	assert.Equal(t, 1, resized, "made a pipe right after a shortage")
	assert.Zero(t, p.splicing.Load(), "counted as splicing")
	var pooled [2]int
	require.NoError(t, unix.Pipe2(pooled[:], unix.O_NONBLOCK|unix.O_CLOEXEC))
	poll.pipes = append(poll.pipes, pooled)
	poll.takePipe(e, clientFD)
	assert.Equal(t, pooled, e.pipe, "the pooled pipe not handed out")
	assert.EqualValues(t, 1, p.splicing.Load())
	poll.dropPipe(e)

	poll.now = poll.now.Add(time.Millisecond)
	poll.takePipe(e, clientFD)
	require.NotEqual(t, [2]int{}, e.pipe, "no pipe taken")
	size, err := unix.FcntlInt(uintptr(e.pipe[0]), unix.F_GETPIPE_SZ, 0)
	require.NoError(t, err)
	assert.Equal(t, spliceMax, size)
	assert.Equal(t, 2, resized)
	assert.EqualValues(t, 1, p.splicing.Load())
	poll.dropPipe(e)
	noneLeft(before, "pipe left open")

	// The kernel refuses to grow a pipe past fs.pipe-max-size, lowered
	// below spliceMax: the default 64 KiB is taken.
	pipeResize = func(int, int) (int, error) { resized++; return 0, unix.EPERM }
	poll.takePipe(e, clientFD)
	require.NotEqual(t, [2]int{}, e.pipe, "a pipe of 64 KiB not taken")
	size, err = unix.FcntlInt(uintptr(e.pipe[0]), unix.F_GETPIPE_SZ, 0)
	require.NoError(t, err)
	assert.Equal(t, spliceMin, size)
	assert.Equal(t, 3, resized)
	poll.dropPipe(e)
	assert.Zero(t, p.splicing.Load())
	noneLeft(before, "pipe left open")
}
