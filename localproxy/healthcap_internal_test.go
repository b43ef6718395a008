package localproxy

import (
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/internal/monotime"
)

// capTest is a capListener over real TCP connections, with the client
// ends the test dialled.
type capTest struct {
	t                 *testing.T
	inner             net.Listener
	l                 *capListener
	rejected, evicted prometheus.Counter
	clients           []net.Conn
}

func newCapTest(t *testing.T, max int) *capTest {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ct := &capTest{t: t, inner: inner,
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "rejected"}),
		evicted:  prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"}),
	}
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "active"})
	ct.l = newCapListener(inner, max, gauge, ct.rejected, ct.evicted, logr.Discard())
	t.Cleanup(func() {
		ct.l.Close()
		for _, c := range ct.clients {
			c.Close()
		}
	})
	return ct
}

// dial opens a client connection, which Accept has yet to take.
func (ct *capTest) dial() net.Conn {
	ct.t.Helper()
	c, err := net.Dial("tcp", ct.inner.Addr().String())
	require.NoError(ct.t, err)
	ct.clients = append(ct.clients, c)
	return c
}

// accept dials and accepts a connection, which the server has not read
// from.
func (ct *capTest) accept() *cappedConn {
	ct.t.Helper()
	ct.dial()
	sc, err := ct.l.Accept()
	require.NoError(ct.t, err)
	return sc.(*cappedConn)
}

// serve reads from c as the health server does, until it is closed, and
// returns once it waits in a Read (or is closed already, having given its
// slot to a connection Accept held).
func (ct *capTest) serve(c *cappedConn) {
	go func() {
		b := make([]byte, 512)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
		}
	}()
	require.Eventually(ct.t, func() bool { return c.reading.Load() || ct.closed(c) }, 10*time.Second, time.Millisecond)
}

// acceptAll accepts connections in the background until the listener is
// closed; the returned function closes it and waits.
func (ct *capTest) acceptAll() (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := ct.l.Accept(); err != nil {
				return
			}
		}
	}()
	return func() {
		ct.l.Close()
		<-done
	}
}

func (ct *capTest) closed(c *cappedConn) bool {
	ct.l.mu.Lock()
	defer ct.l.mu.Unlock()
	_, open := ct.l.conns[c]
	return !open
}

// At its cap the health listener closes, for each new connection, the
// one that went longest without a request in progress (new, or idle
// between requests) among those the server waits on for the client's
// bytes; connections serving a request keep their slot, and when every
// one does, the new connection is closed instead.
func TestCapListenerEvictsTheOldestWithoutARequest(t *testing.T) {
	ct := newCapTest(t, 3)
	l, closed := ct.l, ct.closed
	accept := func() *cappedConn {
		t.Helper()
		c := ct.accept()
		ct.serve(c)
		return c
	}

	a, b, c := accept(), accept(), accept()
	l.connState(a, http.StateActive) // serving a request
	time.Sleep(time.Millisecond)
	l.connState(b, http.StateIdle) // between requests, since after c's accept
	// c: new since before b went idle: the oldest without a request.
	d := accept()
	assert.True(t, closed(c), "the oldest without a request in progress")
	assert.False(t, closed(a) || closed(b) || closed(d))
	e := accept()
	assert.True(t, closed(b), "then the idle one")
	assert.False(t, closed(a) || closed(d) || closed(e))

	l.connState(d, http.StateActive)
	l.connState(e, http.StateActive)
	// Every slot serves a request: the next connection is turned away.
	ct.dial()
	stop := ct.acceptAll()
	require.Eventually(t, func() bool { return counterValue(ct.rejected) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, 2.0, counterValue(ct.evicted))
	assert.False(t, closed(a) || closed(d) || closed(e))
	stop()
}

// A burst of new connections at the cap, accepted before the server has
// read from any (its goroutines have not run yet: a loaded machine), does
// not close the one accepted just before it: a kubelet probe whose request
// is already on its way keeps its slot until the server gets to it. The
// burst's connections beyond the cap are closed instead, once Accept has
// waited healthUnreadWait for the server.
func TestCapListenerBurstKeepsAConnectionTheServerHasNotRead(t *testing.T) {
	const max, burst = 3, 5
	ct := newCapTest(t, max)
	probe := ct.accept()
	for range burst {
		ct.dial()
	}
	// The first max-1 of the burst fill the free slots.
	var admitted []*cappedConn
	for range max - 1 {
		sc, err := ct.l.Accept()
		require.NoError(t, err)
		admitted = append(admitted, sc.(*cappedConn))
	}
	stop := ct.acceptAll()
	require.Eventually(t, func() bool { return counterValue(ct.rejected)+counterValue(ct.evicted) == burst-(max-1) }, 10*time.Second, time.Millisecond)
	assert.False(t, ct.closed(probe), "the connection accepted before the burst, not yet read")
	assert.Equal(t, float64(burst-(max-1)), counterValue(ct.rejected), "the burst's connections beyond the cap")
	assert.Zero(t, counterValue(ct.evicted))
	for i, c := range admitted {
		assert.False(t, ct.closed(c), "admitted %d", i)
	}
	stop()
}

// A connection the server waits in a Read on, with its client's request
// queued in the kernel (the Read's goroutine has not run yet: a loaded
// machine), keeps its slot: it is a probe on its way, not an idle one.
// The next oldest waiting one without bytes gives its slot instead.
func TestCapListenerKeepsAConnectionWithBytesQueued(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the receive queue is asked on Linux only")
	}
	ct := newCapTest(t, 3)
	probe := ct.accept()
	probeClient := ct.clients[0]
	probe.reading.Store(true) // blocked in a Read that has not returned yet
	a, b := ct.accept(), ct.accept()
	ct.serve(a)
	ct.serve(b)
	_, err := probeClient.Write([]byte("GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return queuedBytes(probe.Conn) > 0 }, 5*time.Second, time.Millisecond)

	ct.dial()
	c, err := ct.l.Accept()
	require.NoError(t, err)
	assert.False(t, ct.closed(probe), "the connection with its request queued")
	assert.True(t, ct.closed(a), "the oldest waiting one without bytes")
	assert.False(t, ct.closed(b) || ct.closed(c.(*cappedConn)))
	assert.Equal(t, 1.0, counterValue(ct.evicted))
}

// At the cap with only connections the server has not got to, Accept
// waits for it: once the server waits in a Read on one, the new
// connection takes that one's slot. A connection whose bytes the server
// has read and not yet made a request of (parsing) keeps its slot too.
func TestCapListenerWaitsForTheServerToReadAConnection(t *testing.T) {
	ct := newCapTest(t, 3)
	ct.l.unreadWait = time.Minute
	probe := ct.accept()
	probeClient := ct.clients[0]
	a, b := ct.accept(), ct.accept()
	// The server reads the probe's first bytes and has not read on.
	_, err := probeClient.Write([]byte("GET /readyz HTTP/1.1\r\n"))
	require.NoError(t, err)
	_, err = probe.Read(make([]byte, 512))
	require.NoError(t, err)

	ct.dial()
	accepted := make(chan *cappedConn, 1)
	go func() {
		sc, err := ct.l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- sc.(*cappedConn)
	}()
	select {
	case <-accepted:
		t.Fatal("a connection accepted while the server had got to none of the open ones")
	case <-time.After(50 * time.Millisecond):
	}
	ct.serve(b)
	var c *cappedConn
	select {
	case c = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waits after the server waits in a Read on a connection")
	}
	require.NotNil(t, c)
	assert.True(t, ct.closed(b), "the one the server waits on")
	assert.False(t, ct.closed(probe) || ct.closed(a) || ct.closed(c))
	assert.Equal(t, 1.0, counterValue(ct.evicted))
	assert.Zero(t, counterValue(ct.rejected))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// failingOnce is a listener whose first Accept fails with err.
type failingOnce struct {
	net.Listener
	err    error
	failed atomic.Bool
}

func (f *failingOnce) Accept() (net.Conn, error) {
	if !f.failed.Swap(true) {
		return nil, f.err
	}
	return f.Listener.Accept()
}

// An accept error that http.Server does not know as temporary (ENOBUFS)
// does not end the health server: the listener tries again, and the
// next client is served; once closed, Accept returns.
func TestCapListenerRetriesAFailedAccept(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "active"})
	counter := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}) }
	l := newCapListener(&failingOnce{Listener: inner, err: os.NewSyscallError("accept4", syscall.ENOBUFS)}, 4, gauge, counter(), counter(), logr.Discard())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), ConnState: l.connState}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + inner.Addr().String() + "/")
	require.NoError(t, err, "the server stopped at the failed accept")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, srv.Close())
	select {
	case err := <-served:
		assert.ErrorIs(t, err, http.ErrServerClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}

// Among connections serving a request, at the cap, the one whose
// answer's write has been blocked over healthStalledWrite (its client
// reads nothing) gives its slot first, then the one with the longest run
// of requests back to back; one serving a single request keeps its slot.
func TestCapListenerEvictsAStalledWriterThenABackToBackAsker(t *testing.T) {
	ct := newCapTest(t, 3)
	l, closed := ct.l, ct.closed
	probe, asker, stalled := ct.accept(), ct.accept(), ct.accept()
	for _, c := range []*cappedConn{probe, asker, stalled} {
		ct.serve(c)
		l.connState(c, http.StateActive)
	}
	for range healthBackToBack + 2 {
		l.connState(asker, http.StateIdle)
		l.connState(asker, http.StateActive)
	}
	require.Equal(t, int32(healthBackToBack+3), asker.backToBack.Load())
	assert.Equal(t, int32(1), probe.backToBack.Load())
	// The client of stalled reads nothing: the write blocks once the
	// socket buffers are full.
	go stalled.Write(make([]byte, 64<<20))
	require.Eventually(t, func() bool {
		w := stalled.writing.Load()
		return w != 0 && monotime.Now()-w > int64(healthStalledWrite)
	}, 10*time.Second, time.Millisecond)

	next := ct.accept()
	assert.True(t, closed(stalled), "the connection whose client reads nothing")
	assert.False(t, closed(probe) || closed(asker) || closed(next))
	ct.serve(next)
	l.connState(next, http.StateActive)
	last := ct.accept()
	assert.True(t, closed(asker), "then the one asking back to back")
	assert.False(t, closed(probe) || closed(next) || closed(last))
	assert.Equal(t, 2.0, counterValue(ct.evicted))

	// Every slot serves a single request: the next connection is turned
	// away.
	ct.serve(last)
	l.connState(last, http.StateActive)
	ct.dial()
	stop := ct.acceptAll()
	require.Eventually(t, func() bool { return counterValue(ct.rejected) == 1 }, 5*time.Second, time.Millisecond)
	assert.False(t, closed(probe) || closed(next) || closed(last))
	stop()
}
