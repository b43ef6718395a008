package localproxy_test

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// failingListener fails every Accept with EMFILE while failing is set;
// otherwise it hands out the conns queued with push, then blocks.
type failingListener struct {
	mu      sync.Mutex // guards failing and closed
	failing bool
	closed  bool
	queue   chan net.Conn
	done    chan struct{}
}

func newFailingListener() *failingListener {
	return &failingListener{failing: true, queue: make(chan net.Conn, 1), done: make(chan struct{})}
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	failing, closed := l.failing, l.closed
	l.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	if failing {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *failingListener) recover(c net.Conn) {
	l.mu.Lock()
	l.failing = false
	l.mu.Unlock()
	l.queue <- c
}

func (l *failingListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	return nil
}

func (l *failingListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7445}
}

// TestLivenessFailsWhenAcceptKeepsFailing: a listener whose Accept has
// failed for 30s without a success makes /healthz fail, naming it and the
// error; one accepted connection makes it pass again.
func TestLivenessFailsWhenAcceptKeepsFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newFailingListener()
		p, err := localproxy.New(localproxy.Config{
			Endpoints:       []string{"127.0.0.1:1"},
			ListenAddresses: []string{"127.0.0.1:7445"},
			Listen: func(context.Context, string, string) (net.Listener, error) {
				return ln, nil
			},
			ShutdownTimeout: -1,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-p.Ready()

		time.Sleep(29 * time.Second)
		synctest.Wait()
		require.NoError(t, p.Liveness(), "failing for 29s")

		time.Sleep(2 * time.Second)
		synctest.Wait()
		err = p.Liveness()
		require.Error(t, err, "failing for 31s")
		for _, want := range []string{"accepting on 127.0.0.1:7445 has failed for 3", "too many open files"} {
			require.True(t, strings.Contains(err.Error(), want), "%q does not say %q", err, want)
		}

		client, server := net.Pipe()
		defer client.Close()
		ln.recover(server)
		time.Sleep(time.Second) // the loop's backoff, at most a second
		synctest.Wait()
		require.NoError(t, p.Liveness(), "after an accepted connection")

		cancel()
		require.NoError(t, <-done)
	})
}
