package localproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// freezable answers each line with the same line, unless frozen: then a
// new connection is accepted (as the kernel of a SIGSTOPped server does)
// and answered only once thawed.
type freezable struct {
	*server
	frozen atomic.Bool
	thawed chan struct{}
}

func newFreezable(t *testing.T) *freezable {
	f := &freezable{thawed: make(chan struct{})}
	f.server = newServer(t, func(c *net.TCPConn) {
		if f.frozen.Load() {
			select {
			case <-f.thawed:
			case <-time.After(time.Minute):
				return
			}
		}
		io.Copy(c, c)
	})
	return f
}

func statusOf(t *testing.T, p *upstream.Pool, addr string) upstream.Status {
	t.Helper()
	for _, s := range p.Status() {
		if s.Addr == addr {
			return s
		}
	}
	t.Fatalf("%s not in the pool", addr)
	return upstream.Status{}
}

// A new connection does not go to an upstream whose last connection is
// still waiting for its first byte while another answers: a hung server
// (SIGSTOP: its kernel still accepts) gets one client stuck, not every
// client until its probes fail. That client is not cut.
func TestNewConnectionsAvoidUpstreamWithConnWaiting(t *testing.T) {
	a, b := newFreezable(t), newFreezable(t)
	byAddr := map[string]*freezable{a.addr(): a, b.addr(): b}
	r := start(t, localproxy.Config{
		Endpoints: []string{a.addr(), b.addr()},
		Pool:      upstream.Config{Prober: newProber(), Interval: time.Hour},
		// Silence is not what this test is about.
		FirstByteTimeout: time.Hour,
		// Nor the dial race: on a loaded machine a connect to the other
		// upstream slower than the stagger delay would race one to the
		// frozen upstream, whose kernel accepts at once.
		StaggerDelay: time.Minute,
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	first := r.Pool().Candidates()[0]
	byAddr[first].frozen.Store(true)

	stuck := dial(t, r.addr())
	_, err := io.WriteString(stuck, "hello\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return statusOf(t, r.Pool(), first).Waiting == 1 }, 10*time.Second, 5*time.Millisecond)
	for range 5 {
		c := dial(t, r.addr())
		require.NoError(t, roundTrip(c, "hello"), "a new connection went to the upstream with a connection waiting")
		c.Close()
	}
	assert.False(t, closedByPeer(stuck), "the waiting connection was cut")
	s := statusOf(t, r.Pool(), first)
	assert.Equal(t, 1, s.Waiting)
	assert.False(t, s.Suspect, "suspect with silence unwatched")

	close(byAddr[first].thawed)
	stuck.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(stuck).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", line)
	require.Eventually(t, func() bool { return statusOf(t, r.Pool(), first).Waiting == 0 }, 10*time.Second, 5*time.Millisecond)
	stuck.Close()
}

// Two connections to an upstream that accepts but sends nothing past their
// first-byte deadline make it suspect, long before a probe marks it down
// (here its probes fail, but too few for Fall); it is not cut, and its
// first answer trusts it again.
func TestSilentUpstreamBecomesSuspect(t *testing.T) {
	a := newFreezable(t)
	pr := newProber()
	r := start(t, localproxy.Config{
		Endpoints: []string{a.addr()},
		Pool:      upstream.Config{Prober: pr, Interval: time.Hour, Fall: 5},
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	a.frozen.Store(true)
	pr.set(a.addr(), errors.New("probe timed out"))

	var stuck []net.Conn
	for range 2 {
		c := dial(t, r.addr())
		_, err := io.WriteString(c, "hello\n")
		require.NoError(t, err)
		stuck = append(stuck, c)
	}
	require.Eventually(t, func() bool { return statusOf(t, r.Pool(), a.addr()).Suspect }, 10*time.Second, 5*time.Millisecond,
		"the silent upstream is not suspect")
	assert.Equal(t, 2.0, metric(t, r.reg, "apifailover_localproxy_silent_upstream_connections_total"))
	assert.Equal(t, upstream.StateHealthy, statusOf(t, r.Pool(), a.addr()).State, "silence alone marked it down")
	for _, c := range stuck {
		assert.False(t, closedByPeer(c), "a connection to the silent upstream was cut on suspicion")
		c.SetReadDeadline(time.Time{})
	}

	close(a.thawed)
	a.frozen.Store(false)
	for _, c := range stuck {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "hello\n", line)
		c.Close()
	}
	require.Eventually(t, func() bool { return !statusOf(t, r.Pool(), a.addr()).Suspect }, 10*time.Second, 5*time.Millisecond,
		"an upstream that answers again stays suspect")
}

// A client that trickles its TLS ClientHello (a slowloris, or one stalled
// itself) leaves the server nothing to answer yet: its connections do not
// count as waiting on, stalled by or silent from the upstream, however
// long they last, so a local process cannot make a healthy server suspect
// or move the preferred one. Its first read is a record header that
// promises more than arrived, or less than a header.
func TestTrickledClientHelloIsNotTheUpstreamsSilence(t *testing.T) {
	a := newFreezable(t)
	a.frozen.Store(true) // a real server would not answer anyway: no whole record
	t.Cleanup(func() { close(a.thawed) })
	r := start(t, localproxy.Config{
		Endpoints:        []string{a.addr()},
		Pool:             upstream.Config{Prober: newProber(), Interval: time.Hour},
		FirstByteTimeout: 50 * time.Millisecond,
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	var moved atomic.Int32
	r.Pool().Subscribe(func(e upstream.Event) {
		if e.Kind == upstream.EventPreferred {
			moved.Add(1)
		}
	})
	// A handshake record of 512 bytes, of which 9 came; and 1 byte of a
	// header.
	for _, first := range [][]byte{{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc}, {0x16}} {
		for range 3 {
			c := dial(t, r.addr())
			_, err := c.Write(first)
			require.NoError(t, err)
			defer c.Close()
		}
	}
	time.Sleep(500 * time.Millisecond) // ten first-byte deadlines
	s := statusOf(t, r.Pool(), a.addr())
	assert.Zero(t, s.Waiting, "waiting on a server that has no whole record to answer")
	assert.Zero(t, s.Stalled, "stalled")
	assert.False(t, s.Suspect, "suspect")
	assert.Zero(t, metric(t, r.reg, "apifailover_localproxy_silent_upstream_connections_total"))
	assert.Zero(t, moved.Load(), "the preferred endpoint moved")
}

// A server resets a client that sent something other than a TLS
// handshake (garbage, a plain HTTP request): Go's TLS server closes with
// the bytes unread. That reset is the server's answer to the client, not
// its silence: any local process sending garbage through the proxy must
// not make a healthy server suspect.
func TestResetAfterGarbageIsNotTheUpstreamsSilence(t *testing.T) {
	a := newServer(t, func(c *net.TCPConn) {
		c.Read(make([]byte, 5)) // a record header that is none
		c.SetLinger(0)          // closed with the rest unread: a reset
		c.Close()
	})
	r := start(t, localproxy.Config{
		Endpoints: []string{a.addr()},
		Pool:      upstream.Config{Prober: newProber(), Interval: time.Hour},
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	garbage := bytes.Repeat([]byte{0xaa}, 64<<10)
	for range 4 {
		c := dial(t, r.addr())
		c.Write(garbage) // the reset may come before the last of it
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err, "the upstream answered garbage")
		c.Close()
	}
	assert.False(t, statusOf(t, r.Pool(), a.addr()).Suspect, "suspect after resetting garbage")
	assert.Zero(t, metric(t, r.reg, "apifailover_localproxy_silent_upstream_connections_total"))
}

// rttProber answers every probe, reporting a fixed round trip per address.
type rttProber map[string]time.Duration

func (p rttProber) Probe(ctx context.Context, addr string) error { return nil }

func (p rttProber) ProbeRTT(ctx context.Context, addr string) (time.Duration, error) {
	return p[addr], nil
}

// A connection past its first-byte deadline sends the next ones elsewhere
// at once, even to an upstream with a worse round trip: the server that
// hangs is often the fastest until then, and one silent connection is not
// yet a suspicion (two are). Once it answers, the better upstream is
// first again.
func TestStalledUpstreamLosesNewConnectionsAcrossRTTTiers(t *testing.T) {
	a, b := newFreezable(t), newFreezable(t)
	r := start(t, localproxy.Config{
		Endpoints: []string{a.addr(), b.addr()},
		Pool: upstream.Config{Interval: time.Hour, Prober: rttProber{
			a.addr(): time.Millisecond,     // RTT tier 0
			b.addr(): 5 * time.Millisecond, // RTT tier 1
		}},
		FirstByteTimeout: 100 * time.Millisecond,
		StaggerDelay:     time.Minute,
	})
	require.Eventually(t, r.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{a.addr(), b.addr()}, r.Pool().Candidates())
	a.frozen.Store(true)

	stuck := dial(t, r.addr())
	_, err := io.WriteString(stuck, "hello\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return statusOf(t, r.Pool(), a.addr()).Stalled == 1 }, 10*time.Second, 5*time.Millisecond)
	for i := range 5 {
		c := dial(t, r.addr())
		require.NoError(t, roundTrip(c, "hello\n"), "connection %d went to the upstream that stalled", i+2)
		c.Close()
	}
	assert.False(t, statusOf(t, r.Pool(), a.addr()).Suspect, "one silent connection made it suspect")

	close(a.thawed)
	a.frozen.Store(false)
	stuck.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(stuck).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", line)
	require.Eventually(t, func() bool { return statusOf(t, r.Pool(), a.addr()).Stalled == 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, a.addr(), r.Pool().Candidates()[0])
	stuck.Close()
}
