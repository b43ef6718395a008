package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// getenvOf is a getenv that knows the variables kv (name, value, ...).
func getenvOf(kv ...string) func(string) string {
	return func(k string) string {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1]
			}
		}
		return ""
	}
}

// notifySocket listens where NOTIFY_SOCKET points, as systemd does, and
// returns the socket's name and its datagrams.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	name := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	msgs := make(chan string, 1000)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	return name, msgs
}

func TestSDNotifierEnvironment(t *testing.T) {
	sock, _ := notifySocket(t)
	n, err := newSDNotifier(getenvOf(), 42)
	require.NoError(t, err)
	assert.Nil(t, n, "no NOTIFY_SOCKET: no notifier")

	for _, tc := range []struct {
		name     string
		kv       []string
		watchdog time.Duration
	}{
		{"no watchdog", []string{"NOTIFY_SOCKET", sock}, 0},
		{"watchdog", []string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "30000000"}, 30 * time.Second},
		{"watchdog for this process", []string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "4000000", "WATCHDOG_PID", "42"}, 4 * time.Second},
		{"watchdog for another process", []string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "4000000", "WATCHDOG_PID", "41"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := newSDNotifier(getenvOf(tc.kv...), 42)
			require.NoError(t, err)
			require.NotNil(t, n)
			defer n.close()
			assert.Equal(t, tc.watchdog, n.watchdog)
		})
	}

	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{[]string{"NOTIFY_SOCKET", "run/notify"}, `NOTIFY_SOCKET="run/notify": want the path of a Unix datagram socket or an abstract one (@name)`},
		{[]string{"NOTIFY_SOCKET", "vsock:2:1234"}, `NOTIFY_SOCKET="vsock:2:1234": want`},
		{[]string{"NOTIFY_SOCKET", filepath.Join(t.TempDir(), "none")}, `NOTIFY_SOCKET=`},
		{[]string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "30s"}, `WATCHDOG_USEC="30s": want a positive whole number of microseconds`},
		{[]string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "0"}, `WATCHDOG_USEC="0": want a positive`},
		{[]string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "-1"}, `WATCHDOG_USEC="-1": want a positive`},
		{[]string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "99999999999999999999"}, `WATCHDOG_USEC="99999999999999999999": want a positive`},
		{[]string{"NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "1000", "WATCHDOG_PID", "me"}, `WATCHDOG_PID="me": want a process ID`},
	} {
		_, err := newSDNotifier(getenvOf(tc.kv...), 42)
		if assert.Error(t, err, "%v", tc.kv) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
}

// fakeNotified stands for the proxy: ready once ready is closed, live
// unless notLive is set.
type fakeNotified struct {
	ready   chan struct{}
	mu      sync.Mutex
	notLive error
	conns   int64
}

func (f *fakeNotified) Ready() <-chan struct{} { return f.ready }

func (f *fakeNotified) Live() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.notLive
}

func (f *fakeNotified) setLive(err error) {
	f.mu.Lock()
	f.notLive = err
	f.mu.Unlock()
}

func (f *fakeNotified) Status() localproxy.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return localproxy.Status{ActiveConnections: f.conns, Upstreams: []localproxy.UpstreamStatus{
		{Status: upstream.Status{Addr: "10.0.0.2:6443", Preferred: true}, State: "healthy"},
		{Status: upstream.Status{Addr: "10.0.0.1:6443"}, State: "unhealthy"},
	}}
}

// next returns the next datagram, failing after d.
func next(t *testing.T, msgs <-chan string, d time.Duration) string {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(d):
		t.Fatalf("no notification within %v", d)
		return ""
	}
}

// The watchdog is fed while the proxy is live, and not while it is not;
// READY=1 waits for the listeners; STOPPING=1 comes as the shutdown
// begins.
func TestSDNotifierFeedsTheWatchdogOnlyWhileLive(t *testing.T) {
	sock, msgs := notifySocket(t)
	n, err := newSDNotifier(getenvOf("NOTIFY_SOCKET", sock, "WATCHDOG_USEC", strconv.Itoa(200_000)), 1)
	require.NoError(t, err)
	defer n.close()
	assert.Equal(t, 100*time.Millisecond, n.every(false), "half the watchdog's timeout")
	assert.Equal(t, 100*time.Millisecond, n.every(true))
	p := &fakeNotified{ready: make(chan struct{}), conns: 3}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); n.run(ctx, p, logr.Discard()) }()

	select {
	case m := <-msgs:
		t.Fatalf("notified before the proxy listens: %q", m)
	case <-time.After(300 * time.Millisecond):
	}
	close(p.ready)
	assert.Equal(t, "READY=1\nSTATUS=1 of 2 API servers healthy, preferred 10.0.0.2:6443; 3 client connections", next(t, msgs, 5*time.Second))
	assert.Equal(t, "WATCHDOG=1", next(t, msgs, 5*time.Second))

	p.setLive(errors.New("no health probe for 31s\n(expected every 5s)"))
	// A WATCHDOG=1 may have been sent as Live was set.
	m := next(t, msgs, 5*time.Second)
	if m == "WATCHDOG=1" {
		m = next(t, msgs, 5*time.Second)
	}
	assert.Equal(t, "STATUS=not live: no health probe for 31s (expected every 5s)", m)
	select {
	case m := <-msgs:
		t.Fatalf("notified while not live: %q", m)
	case <-time.After(500 * time.Millisecond): // five of the watchdog's paces
	}

	p.setLive(nil)
	assert.Equal(t, "WATCHDOG=1\nSTATUS=1 of 2 API servers healthy, preferred 10.0.0.2:6443; 3 client connections", next(t, msgs, 5*time.Second))
	cancel()
	<-done
	for {
		m := next(t, msgs, 5*time.Second)
		if m == "WATCHDOG=1" {
			continue
		}
		assert.Equal(t, "STOPPING=1\nSTATUS=shutting down: draining client connections", m)
		break
	}
}

// Without a watchdog only the status goes, when it changes.
func TestSDNotifierWithoutWatchdog(t *testing.T) {
	sock, msgs := notifySocket(t)
	n, err := newSDNotifier(getenvOf("NOTIFY_SOCKET", sock, "WATCHDOG_USEC", "1000", "WATCHDOG_PID", "2"), 1)
	require.NoError(t, err)
	defer n.close()
	assert.Equal(t, time.Duration(0), n.watchdog, "the watchdog is another process's")
	assert.Equal(t, notifyStatusEvery, n.every(false))
	assert.Equal(t, notifyStatusSoon, n.every(true), "while API servers are still to be checked")
	n.watchdog = time.Microsecond
	assert.Equal(t, notifyLeast, n.every(false), "no spinning")
	p := &fakeNotified{ready: make(chan struct{})}
	close(p.ready)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); n.run(ctx, p, logr.Discard()) }()
	assert.True(t, strings.HasPrefix(next(t, msgs, 5*time.Second), "READY=1\n"))
	cancel()
	<-done
	assert.True(t, strings.HasPrefix(next(t, msgs, 5*time.Second), "STOPPING=1\n"))
}

// The proxy never came to listen (Run failed): run returns with its
// context, having sent nothing.
func TestSDNotifierNotReady(t *testing.T) {
	sock, msgs := notifySocket(t)
	n, err := newSDNotifier(getenvOf("NOTIFY_SOCKET", sock), 1)
	require.NoError(t, err)
	defer n.close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	n.run(ctx, &fakeNotified{ready: make(chan struct{})}, logr.Discard())
	select {
	case m := <-msgs:
		t.Fatalf("notified: %q", m)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestStatusLine(t *testing.T) {
	st := localproxy.Status{ActiveConnections: 7, Upstreams: []localproxy.UpstreamStatus{
		{Status: upstream.Status{Addr: "10.0.0.1:6443", Preferred: true}, State: "unknown"},
		{Status: upstream.Status{Addr: "10.0.0.2:6443"}, State: "healthy"},
		{Status: upstream.Status{Addr: "10.0.0.3:6443"}, State: "unknown"},
	}}
	assert.True(t, checking(st))
	assert.Equal(t, "1 of 3 API servers healthy (2 not checked yet), preferred 10.0.0.1:6443; 7 client connections", statusLine(st, nil))
	st.Upstreams[0].State, st.Upstreams[2].State = "quarantined", "unhealthy"
	assert.False(t, checking(st))
	assert.Equal(t, "1 of 3 API servers healthy, preferred 10.0.0.1:6443; 7 client connections", statusLine(st, nil))
	assert.Equal(t, "0 of 0 API servers healthy; 0 client connections", statusLine(localproxy.Status{}, nil))
	assert.Equal(t, "not live: 1 of 2 accept loops running", statusLine(st, errors.New("1 of 2 accept loops running")))
}
