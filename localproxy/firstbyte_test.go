package localproxy

import (
	"fmt"
	"io"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

const fbA, fbB = "10.0.0.1:6443", "10.0.0.2:6443"

func newWatchBed(t *testing.T) (*firstByteWatch, *upstream.Pool) {
	t.Helper()
	pool, err := upstream.New(upstream.Config{})
	require.NoError(t, err)
	require.NoError(t, pool.Set(upstream.SourceStatic, []upstream.Spec{{Addr: fbA}, {Addr: fbB}}))
	pool.ReportSuccess(fbA)
	pool.ReportSuccess(fbB)
	return newFirstByteWatch(pool, DefaultFirstByteTimeout, logr.Discard()), pool
}

func suspect(t *testing.T, pool *upstream.Pool, addr string) bool {
	t.Helper()
	for _, s := range pool.Status() {
		if s.Addr == addr {
			return s.Suspect
		}
	}
	t.Fatalf("%s not in the pool", addr)
	return false
}

// The deadline is max(floor, 2·SRTT + 4·RTTVAR) of the endpoint's
// first-byte times, at most maxFirstByteTimeout.
func TestFirstByteTimeoutRule(t *testing.T) {
	w, _ := newWatchBed(t)
	assert.Equal(t, DefaultFirstByteTimeout, w.timeout(fbA), "no sample: the floor")
	for range 50 {
		w.answered(fbA, time.Millisecond)
	}
	assert.Equal(t, DefaultFirstByteTimeout, w.timeout(fbA), "a fast endpoint: the floor")

	// A loaded server that steadily answers in 300ms gets ~600ms.
	for range 200 {
		w.answered(fbB, 300*time.Millisecond)
	}
	assert.InDelta(t, 600*time.Millisecond, w.timeout(fbB), float64(10*time.Millisecond))
	// Jitter widens it: 200ms and 400ms alternating.
	for i := range 200 {
		w.answered(fbB, time.Duration(200+200*(i%2))*time.Millisecond)
	}
	assert.Greater(t, w.timeout(fbB), 900*time.Millisecond)
	// Samples are capped, and so is the deadline.
	for range 200 {
		w.answered(fbB, time.Minute)
	}
	assert.Equal(t, maxFirstByteTimeout, w.timeout(fbB))
	w.forget(fbB)
	assert.Equal(t, DefaultFirstByteTimeout, w.timeout(fbB), "forgotten")
}

// One silent connection is not enough; two within silentWindow make the
// endpoint suspect; an answer trusts it again.
func TestSilentConnectionsMakeEndpointSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, pool := newWatchBed(t)
		silent := func() {
			f := w.watch(fbA)
			f.sent(flightHello)
			time.Sleep(DefaultFirstByteTimeout)
			synctest.Wait()
			f.stop()
		}
		silent()
		assert.False(t, suspect(t, pool, fbA), "one silent connection")
		time.Sleep(silentWindow)
		silent()
		assert.False(t, suspect(t, pool, fbA), "two, further apart than the window")
		silent()
		assert.True(t, suspect(t, pool, fbA), "two within the window")

		// A late answer on a connection that went silent trusts it again.
		f := w.watch(fbA)
		f.sent(flightHello)
		time.Sleep(DefaultFirstByteTimeout + time.Second)
		synctest.Wait()
		f.received()
		assert.False(t, suspect(t, pool, fbA), "answered, still suspect")
	})
}

// A first byte within the deadline is a sample and no silence.
func TestAnsweredInTimeIsNoSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, pool := newWatchBed(t)
		for range 5 {
			f := w.watch(fbA)
			f.sent(flightHello)
			time.Sleep(DefaultFirstByteTimeout - time.Millisecond)
			f.received()
			time.Sleep(time.Second)
			synctest.Wait()
		}
		assert.False(t, suspect(t, pool, fbA))
		// The samples raised the deadline: 2·249ms + 4·RTTVAR.
		assert.Greater(t, w.timeout(fbA), 2*(DefaultFirstByteTimeout-time.Millisecond))
	})
}

// A reset before the first byte, after the client spoke, is silence at
// once; an EOF, a reset before the client spoke, or a close by the proxy
// is not.
func TestFailedBeforeFirstByte(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, pool := newWatchBed(t)
		fail := func(sent bool, err error, closed bool) {
			f := w.watch(fbA)
			if sent {
				f.sent(flightHello)
			}
			f.failed(err, closed)
			f.stop()
		}
		reset := syscall.ECONNRESET
		fail(false, reset, false)
		fail(true, fmt.Errorf("read: %w", io.EOF), false)
		fail(true, reset, true)
		fail(false, reset, false)
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.False(t, suspect(t, pool, fbA))
		fail(true, reset, false)
		fail(true, reset, false)
		assert.True(t, suspect(t, pool, fbA), "two resets after the client spoke")
	})
}

// firstFlight reads a client's first bytes from the network: whatever
// they are, it does not panic; fewer than 5 bytes or a handshake record
// header promising more than came are partial, a whole handshake record
// a hello, anything else other.
func FuzzFirstFlight(f *testing.F) {
	f.Add([]byte{0x16})
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x02, 0x01, 0x00})
	f.Add([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got := firstFlight(b)
		switch {
		case len(b) < 5:
			assert.Equal(t, flightPartial, got, "%x: fewer bytes than a record header", b)
		case b[0] != 0x16:
			assert.Equal(t, flightOther, got, "%x: no handshake record", b)
		case len(b)-5 >= int(b[3])<<8|int(b[4]):
			assert.Equal(t, flightHello, got, "%x: a whole handshake record", b)
		default:
			assert.Equal(t, flightPartial, got, "%x: a handshake record cut short", b)
		}
	})
}
