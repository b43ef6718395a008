package localproxy

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// dialState is a proxy whose poller is not running (the test goroutine
// plays the poller's), a connection of it dialing, and a listening
// address its attempts can connect to.
func dialState(t *testing.T) (*conn, netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()
	p, err := New(Config{Endpoints: []string{addr}, Registry: prometheus.NewRegistry(), AttemptTimeout: time.Second})
	require.NoError(t, err)
	poll, err := newPollerMode(true)
	require.NoError(t, err)
	p.pollInit.Do(func() { p.poll = poll })
	c := &conn{p: p}
	c.id = poll.add(c)
	t.Cleanup(func() {
		c.mu.Lock()
		if c.dial != nil {
			for _, tr := range c.dial.tries {
				unix.Close(tr.fd)
			}
		}
		c.mu.Unlock()
		poll.closeFDs()
	})
	return c, netip.MustParseAddrPort(addr)
}

// socketFD is a TCP socket, for an attempt in flight.
func socketFD(t *testing.T) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	return fd
}

// An attempt that times out starts the next candidate at once, as a
// failed one does (DialAny starts one per failed result), though another
// is in flight and the stagger is not due.
func TestDialTimerStartsTheNextForATimedOutAttempt(t *testing.T) {
	c, ap := dialState(t)
	now := time.Now()
	c.dial = &loopDial{
		cands: []string{"a", "b", ap.String()}, addrs: []netip.AddrPort{ap, ap, ap},
		next: 2, started: true, attempt: time.Second, deadline: now.Add(time.Minute), staggerAt: now.Add(time.Minute),
		tries: []loopTry{
			{addr: "a", ap: ap, fd: socketFD(t), id: c.id, start: now.Add(-2 * time.Second)},
			{addr: "b", ap: ap, fd: socketFD(t), id: c.p.poll.add(c), start: now},
		},
	}
	c.dial.timer.fire = c.dialTimer
	c.dialing.Store(true)
	c.dialTimer(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NotNil(t, c.dial, "the dial ended")
	var addrs []string
	for _, tr := range c.dial.tries {
		addrs = append(addrs, tr.addr)
	}
	assert.Equal(t, []string{"b", ap.String()}, addrs, "the attempts in flight")
}

// Past the dial's deadline nothing starts: an attempt failing then (the
// deadline's timer not run yet) ends the dial instead of trying the next
// candidate, which would have no time to connect and be reported failed.
func TestDialStartsNothingPastItsDeadline(t *testing.T) {
	c, ap := dialState(t)
	now := time.Now()
	c.dial = &loopDial{
		cands: []string{"a", ap.String()}, addrs: []netip.AddrPort{ap, ap},
		next: 1, started: true, deadline: now.Add(-time.Millisecond),
	}
	c.dialing.Store(true)
	var end dialEnd
	c.mu.Lock()
	c.advanceLocked(now, 1, &end)
	c.mu.Unlock()
	assert.Nil(t, c.dial, "the dial goes on")
	assert.Error(t, end.failed, "the dial did not fail")
	assert.Empty(t, end.reports, "an attempt started past the deadline")
}
