package localproxy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sysmonSlice is how long Go's sysmon lets a goroutine stay in one system
// call, or on one scheduling tick, before it takes its P (forcePreemptNS
// and retake's 10ms in the runtime's proc.go).
const sysmonSlice = 10 * time.Millisecond

func TestPlanWait(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name             string
		timeout          int
		lastEvent, yield time.Duration // ago; lastEvent < 0: none yet
		gate             bool
		await            awaited
		how              waitHow
		want             int
		wantYield        bool
	}{
		{"no events yet: parked", -1, -1, 0, true, awaitedNothing, waitPark, -1, false},
		{"quiet since pollerBusy: parked", -1, pollerBusy, 50 * time.Millisecond, true, awaitedNothing, waitPark, -1, false},
		{"quiet, no gate: a system call", -1, time.Second, time.Second, false, awaitedNothing, waitSyscall, -1, false},
		{"quiet, a timer: parked until it", 2000, time.Second, time.Second, true, awaitedNothing, waitPark, 2000, false},
		{"quiet, a timer, no gate: a system call until it", 2000, time.Second, time.Second, false, awaitedNothing, waitSyscall, 2000, false},
		{"busy, no timer", -1, time.Millisecond, 5 * time.Millisecond, true, awaitedNothing, waitHeld, pollerSlice, true},
		{"busy, no gate", -1, time.Millisecond, 5 * time.Millisecond, false, awaitedNothing, waitHeld, pollerSlice, true},
		{"busy, just yielded", -1, time.Millisecond, 0, true, awaitedNothing, waitHeld, pollerSlice, false},
		{"busy, a far timer", 2000, time.Millisecond, 0, true, awaitedNothing, waitHeld, pollerSlice, false},
		{"busy, a near timer", 3, time.Millisecond, 2 * time.Millisecond, true, awaitedNothing, waitHeld, 3, true},
		{"busy, a late answer awaited: parked", -1, time.Microsecond, 5 * time.Millisecond, true, awaitedLate, waitPark, -1, false},
		{"busy, a late answer awaited, a timer: parked until it", 3, time.Microsecond, 0, true, awaitedLate, waitPark, 3, false},
		{"busy, a late answer awaited, no gate: held", -1, time.Microsecond, 5 * time.Millisecond, false, awaitedLate, waitHeld, pollerSlice, true},
		{"quiet, a late answer awaited: parked", -1, time.Second, time.Second, true, awaitedLate, waitPark, -1, false},
		{"no wait", 0, time.Second, time.Second, true, awaitedNothing, waitHeld, 0, false},
		{"no wait, a late answer awaited", 0, time.Microsecond, time.Second, true, awaitedLate, waitHeld, 0, false},
		{"busy, an answer due soon: held longer", -1, time.Microsecond, 5 * time.Millisecond, true, awaitedSoon, waitHeld, pollerAwaitSlice, true},
		{"busy, an answer due soon, no gate: held longer", -1, time.Microsecond, 0, false, awaitedSoon, waitHeld, pollerAwaitSlice, false},
		{"busy, an answer due soon, yielded 500µs ago: held 7ms, to end within pollerAwait of the yield", -1, time.Microsecond, 500 * time.Microsecond, true, awaitedSoon, waitHeld, pollerAwaitSlice - 1, false},
		{"busy, an answer due soon, a near timer: held until it", 3, time.Microsecond, 0, true, awaitedSoon, waitHeld, 3, false},
		{"quiet since pollerBusy, an answer due soon: held on", -1, pollerBusy, 0, true, awaitedSoon, waitHeld, pollerAwaitSlice, false},
		{"an answer due soon, the first wait outlasted: held once more after a yield", -1, pollerAwait, pollerAwait, true, awaitedSoon, waitHeld, pollerAwaitSlice, true},
		{"an answer due soon, not come pollerAwaitHold after the last event: parked", -1, pollerAwaitHold, pollerAwait, true, awaitedSoon, waitPark, -1, false},
		{"an answer due soon, no gate, not come pollerAwaitHold after the last event: a system call", -1, pollerAwaitHold, pollerAwait, false, awaitedSoon, waitSyscall, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var last time.Time
			if tc.lastEvent >= 0 {
				last = now.Add(-tc.lastEvent)
			}
			how, got, yield := planWait(tc.timeout, now, last, now.Add(-tc.yield), tc.gate, tc.await)
			if how != tc.how || got != tc.want || yield != tc.wantYield {
				t.Errorf("planWait(%d, last event %v ago, yielded %v ago, gate %v, awaited %d) = %d, %d, %v; want %d, %d, %v", tc.timeout, tc.lastEvent, tc.yield, tc.gate, tc.await, how, got, yield, tc.how, tc.want, tc.wantYield)
			}
		})
	}

	// Whatever the time since the last yield, a busy poller's wait holds
	// the P no longer than ends before sysmon's slice since its last yield
	// runs out, an answer due soon or not.
	// So does a wait held on for an answer due soon after pollerBusy.
	for _, await := range []awaited{awaitedNothing, awaitedSoon} {
		for ago := time.Duration(0); ago <= 3*sysmonSlice; ago += 100 * time.Microsecond {
			for _, timeout := range []int{-1, 1, 7, 9, 50, 2000} {
				event := time.Microsecond
				if await == awaitedSoon {
					event = ago % pollerAwaitHold
				}
				how, got, yield := planWait(timeout, now, now.Add(-event), now.Add(-ago), true, await)
				if how != waitHeld || got <= 0 {
					t.Fatalf("planWait(%d, awaited %d, last event %v ago) = %d, %d: not a bounded held wait", timeout, await, event, how, got)
				}
				since := ago
				if yield {
					since = 0
				}
				// The round of events after the wait, before the
				// goroutine yields again, has the rest of sysmon's
				// slice: 2ms or more.
				if end := since + time.Duration(got)*time.Millisecond; end > pollerAwait {
					t.Errorf("planWait(%d, awaited %d), yielded %v ago: wait %dms, yield %v: the wait ends %v after the last yield, sysmon's slice is %v, and the round after the wait needs some of it", timeout, await, ago, got, yield, end, sysmonSlice)
				}
			}
		}
	}
}

// What the loop's steps wrote decides the poller's next wait (plan):
// parked at once for a late answer; held up to pollerAwait for an answer
// due soon, or for a client that asks again soon; held up to pollerSlice
// after bytes passed back to one that does not; a round with only
// control frames keeps what was awaited, but for a late answer.
func TestPollerPlansItsWaitFromItsSteps(t *testing.T) {
	poll, err := newPollerMode(true)
	require.NoError(t, err)
	require.NotNil(t, poll.gate, "no gate: the poller cannot park, the test proves nothing")
	t.Cleanup(poll.closeFDs)
	now := time.Now()
	busy, yielded := now.Add(-time.Microsecond), now.Add(-5*time.Millisecond)
	for _, step := range []struct {
		wrote []wroteWhat
		how   waitHow
		ms    int
	}{
		{nil, waitHeld, pollerSlice},
		{[]wroteWhat{wroteSlowAsk}, waitPark, -1},
		{nil, waitPark, -1},
		{[]wroteWhat{wroteControl}, waitHeld, pollerSlice},
		{[]wroteWhat{wroteFastAsk}, waitHeld, pollerAwaitSlice},
		{[]wroteWhat{wroteControl}, waitHeld, pollerAwaitSlice},
		{[]wroteWhat{wroteAnswerAskedSoon, wroteControl}, waitHeld, pollerAwaitSlice},
		{[]wroteWhat{wroteControl}, waitHeld, pollerAwaitSlice},
		{[]wroteWhat{wroteAnswerAskedSoon, wroteAnswer}, waitHeld, pollerSlice},
		{[]wroteWhat{wroteSlowAsk, wroteControl}, waitPark, -1},
		{[]wroteWhat{wroteAnswer}, waitHeld, pollerSlice},
	} {
		for _, w := range step.wrote {
			poll.noteWrite(w)
		}
		how, ms, _ := poll.plan(now, busy, yielded)
		require.Equal(t, step.how, how, "after %v", step.wrote)
		require.Equal(t, step.ms, ms, "after %v", step.wrote)
	}
}

// A quiet poller parks in Go's poller (planWait), and still wakes for its
// soonest timer, then for an event: its close.
func TestParkedPollerWakesForItsTimerAndItsClose(t *testing.T) {
	poll, err := newPollerMode(true)
	require.NoError(t, err)
	require.NotNil(t, poll.gate, "no gate: the poller cannot park, the test proves nothing")
	fired := make(chan time.Time, 1)
	lt := loopTimer{fire: func(now time.Time) { fired <- now }}
	due := time.Now().Add(50 * time.Millisecond)
	poll.at(&lt, due) // before run: the test's goroutine is the poller's
	go poll.run()
	select {
	case at := <-fired:
		require.False(t, at.Before(due), "the timer fired %v early", due.Sub(at))
	case <-time.After(10 * time.Second):
		t.Fatal("the parked poller's timer did not fire")
	}
	closed := make(chan struct{})
	go func() {
		poll.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not wake the parked poller")
	}
}

// gatedPoller is a blocking poller with its gate, and a pipe whose read
// end it watches (edge triggered): a write to fds[1] is its event.
func gatedPoller(t *testing.T) (*poller, [2]int) {
	t.Helper()
	poll, err := newPollerMode(true)
	require.NoError(t, err)
	t.Cleanup(poll.closeFDs)
	require.NotNil(t, poll.gate, "no gate: the test proves nothing")
	var fds [2]int
	require.NoError(t, unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC))
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: 2}
	require.NoError(t, unix.EpollCtl(poll.epfd, unix.EPOLL_CTL_ADD, fds[0], &ev))
	return poll, fds
}

// The gate is armed only while the poller parks: events that come once
// it woke are not passed on to Go's poller, whose thread they would wake
// for nothing.
func TestParkDisarmsTheGate(t *testing.T) {
	poll, fds := gatedPoller(t)

	events := make([]unix.EpollEvent, pollerBatch)
	for _, parked := range []bool{false, true} {
		if !parked { // the event is there when the poller parks
			unix.Write(fds[1], []byte{1})
		} else { // it comes while the poller is parked
			time.AfterFunc(20*time.Millisecond, func() { unix.Write(fds[1], []byte{1}) })
		}
		n, err := poll.park(events, time.Now().Add(10*time.Second))
		require.NoError(t, err)
		require.Equal(t, 1, n, "parked %v: the pipe's event was not found", parked)

		unix.Write(fds[1], []byte{1}) // the busy poller's next event
		got := make([]unix.EpollEvent, 1)
		n, err = unix.EpollWait(poll.gfd, got, 0)
		require.NoError(t, err)
		require.Zero(t, n, "parked %v: the gate stayed armed after the poller woke, and passed the next event on to Go's poller", parked)
		drain := make([]unix.EpollEvent, pollerBatch)
		unix.EpollWait(poll.epfd, drain, 0)
	}
}

// TestParkDoesNotAllocate: a park costs no allocation, whether an event
// is there when it looks or its deadline passes first (a function made
// on each park cost three).
func TestParkDoesNotAllocate(t *testing.T) {
	poll, fds := gatedPoller(t)
	events := make([]unix.EpollEvent, pollerBatch)
	one, buf := []byte{1}, make([]byte, 1)

	for _, fixed := range []bool{false, true} {
		// fixed: the same deadline each time, which park sets once.
		until := time.Now().Add(time.Minute)
		found := testing.AllocsPerRun(100, func() {
			unix.Write(fds[1], one)
			if !fixed {
				until = time.Now().Add(10 * time.Second)
			}
			if n, err := poll.park(events, until); n != 1 || err != nil {
				t.Fatalf("park = %d, %v; want the pipe's event", n, err)
			}
			unix.Read(fds[0], buf)
		})
		require.Zero(t, found, "allocations per park that found an event (the same deadline each time: %v)", fixed)
	}
	timedOut := testing.AllocsPerRun(5, func() {
		if n, err := poll.park(events, time.Now().Add(time.Millisecond)); n != 0 || err != nil {
			t.Fatalf("park = %d, %v; want its deadline", n, err)
		}
	})
	require.Zero(t, timedOut, "allocations per park that reached its deadline")
}
