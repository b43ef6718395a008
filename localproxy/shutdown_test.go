package localproxy_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// closeSignalListener closes closed, and records when, once Close is
// called.
type closeSignalListener struct {
	net.Listener
	once     sync.Once
	closed   chan struct{}
	closedAt time.Time // set before closed is closed
}

func (l *closeSignalListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		l.closedAt = time.Now()
		close(l.closed)
	})
	return err
}

// TestShutdownCutsConnectionsAtDeadline: after Run's context is cancelled
// the listener refuses new clients at once, a client that keeps sending is
// served until ShutdownTimeout has passed and is then closed by the
// proxy, on both sides, and Run returns.
func TestShutdownCutsConnectionsAtDeadline(t *testing.T) {
	const grace = 200 * time.Millisecond
	echo := newEcho(t)
	ln := &closeSignalListener{closed: make(chan struct{})}
	var lc net.ListenConfig
	r := start(t, localproxy.Config{
		Endpoints:       []string{echo.addr()},
		ShutdownTimeout: grace,
		Listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			inner, err := lc.Listen(ctx, network, address)
			if err != nil {
				return nil, err
			}
			ln.Listener = inner
			return ln, nil
		},
	})
	addr := r.addr()
	c := dial(t, addr)
	require.NoError(t, roundTrip(c, "before"))

	// The client keeps the connection busy until it fails.
	type cut struct {
		at  time.Time
		err error
	}
	cuts := make(chan cut, 1)
	stop := make(chan struct{})
	var trips atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				cuts <- cut{}
				return
			default:
			}
			if err := roundTrip(c, "busy"); err != nil {
				cuts <- cut{at: time.Now(), err: err}
				return
			}
			trips.Add(1)
		}
	}()
	var got cut
	gotCut := false
	defer func() { // the client goroutine ends before the test does
		if !gotCut {
			close(stop)
			c.Close()
			<-cuts
		}
	}()

	cancelAt := time.Now()
	r.cancel()
	select {
	case <-ln.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener was not closed after cancel")
	}
	_, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.Error(t, err, "a new client was accepted after cancel")
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	tripsAtClose := trips.Load()

	select {
	case got = <-cuts:
		gotCut = true
	case <-time.After(10 * time.Second):
		t.Fatal("the busy connection was not closed after the shutdown deadline")
	}
	require.Error(t, got.err)
	var ne net.Error
	require.False(t, errors.As(got.err, &ne) && ne.Timeout(), "the client timed out instead of being closed: %v", got.err)
	assert.GreaterOrEqual(t, got.at.Sub(cancelAt), grace, "closed before the shutdown deadline: %v", got.err)
	assert.True(t, ln.closedAt.Before(got.at), "the listener closed after the connection was cut")
	t.Logf("cut %v after cancel (%v); %d round trips after the listener closed", got.at.Sub(cancelAt), got.err, trips.Load()-tripsAtClose)

	select {
	case <-r.done:
		require.NoError(t, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the shutdown deadline")
	}
	assert.GreaterOrEqual(t, time.Since(cancelAt), grace)
	require.Eventually(t, func() bool { return echo.open.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "the upstream side is closed too")
}
