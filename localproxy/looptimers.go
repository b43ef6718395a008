package localproxy

import (
	"container/heap"
	"time"
)

// loopTimer is a deadline of the poller's loop: fire runs on the
// poller's goroutine once it has passed. Only that goroutine arms, stops
// and runs loop timers; an owner that ends elsewhere leaves its timer to
// fire and find nothing to do.
type loopTimer struct {
	fire func(now time.Time)
	when time.Time
	// pos is the timer's index in loopTimers plus one; 0: not armed.
	pos int
}

// loopTimers is a heap of armed timers, soonest first.
type loopTimers []*loopTimer

func (h loopTimers) Len() int           { return len(h) }
func (h loopTimers) Less(i, j int) bool { return h[i].when.Before(h[j].when) }
func (h loopTimers) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i+1, j+1
}
func (h *loopTimers) Push(x any) {
	t := x.(*loopTimer)
	t.pos = len(*h) + 1
	*h = append(*h, t)
}
func (h *loopTimers) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.pos = 0
	return t
}

// at arms t for when, or moves it there if armed.
func (h *loopTimers) at(t *loopTimer, when time.Time) {
	t.when = when
	if t.pos > 0 {
		heap.Fix(h, t.pos-1)
		return
	}
	heap.Push(h, t)
}

// stop disarms t.
func (h *loopTimers) stop(t *loopTimer) {
	if t.pos > 0 {
		heap.Remove(h, t.pos-1)
	}
}

// run fires the timers due at now, soonest first.
func (h *loopTimers) run(now time.Time) {
	for len(*h) > 0 && !(*h)[0].when.After(now) {
		t := heap.Pop(h).(*loopTimer)
		t.fire(now)
	}
}

// timeout is how long the poller may wait for events, in milliseconds
// as epoll_wait takes it, rounded up: until the soonest timer, -1 for
// none.
func (h loopTimers) timeout(now time.Time) int {
	if len(h) == 0 {
		return -1
	}
	d := h[0].when.Sub(now)
	if d <= 0 {
		return 0
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

// next is when the soonest timer is due; zero: none.
func (h loopTimers) next() time.Time {
	if len(h) == 0 {
		return time.Time{}
	}
	return h[0].when
}
