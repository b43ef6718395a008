package localproxy_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// TestHandOverToSuccessor replaces a proxy by a new one on the same
// addresses, the way a DaemonSet surge pod or an upgrade script does:
// the new one binds while the old serves (SO_REUSEPORT), then the old is
// stopped. Clients dialing all the while are never refused or reset, the
// old proxy waits for the successor's /readyz, and afterwards the new one
// alone serves.
func TestHandOverToSuccessor(t *testing.T) {
	echo := newEcho(t)
	addr := "127.0.0.1:" + freeLocalPort(t)
	health := "127.0.0.1:" + freeLocalPort(t)
	cfg := func() localproxy.Config {
		return localproxy.Config{
			Endpoints:       []string{echo.addr()},
			ListenAddresses: []string{addr},
			HealthAddress:   health,
			HandoverTimeout: 10 * time.Second,
			// A probe timeout the race detector on a loaded machine does not
			// reach: with one endpoint and Fall 1, a probe timing out marks
			// it down, and its connections are closed (not the hand-over's
			// doing).
			Pool: upstream.Config{Prober: newProber(), Interval: 500 * time.Millisecond, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 1},
		}
	}
	old := start(t, cfg())
	require.Eventually(t, old.Pool().Healthy, 10*time.Second, 5*time.Millisecond)

	// Clients dial and round-trip without pause until told to stop.
	var (
		stop     atomic.Bool
		ok       atomic.Int64
		failures []error
		mu       sync.Mutex
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					err = roundTrip(c, "hello")
					c.Close()
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					continue
				}
				ok.Add(1)
			}
		})
	}
	waitCount := func(n int64) {
		require.Eventually(t, func() bool { return ok.Load() >= n }, 10*time.Second, time.Millisecond)
	}
	waitCount(50)

	next := start(t, cfg())
	base := ok.Load()
	waitCount(base + 50)
	require.NoError(t, old.stop())
	base = ok.Load()
	waitCount(base + 50)
	stop.Store(true)
	wg.Wait()

	for _, err := range failures {
		t.Errorf("client failed during the hand-over: %v (refused: %v, reset: %v)", err,
			errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET))
	}
	t.Logf("%d round trips, %d failed", ok.Load(), len(failures))
	assert.Positive(t, metric(t, next.reg, "apifailover_localproxy_connections_accepted_total"))
	// Only the successor is left: every new client goes to it.
	before := metric(t, next.reg, "apifailover_localproxy_connections_accepted_total")
	for range 10 {
		c := dial(t, addr)
		require.NoError(t, roundTrip(c, "after"))
		c.Close()
	}
	assert.Equal(t, before+10, metric(t, next.reg, "apifailover_localproxy_connections_accepted_total"))
}

// TestHandOverWaitsForReadySuccessor: the successor listens but has no
// healthy endpoint yet, so its /readyz fails; the stopping proxy keeps
// serving and does not hand over until the successor turns ready.
func TestHandOverWaitsForReadySuccessor(t *testing.T) {
	echo := newEcho(t)
	addr := "127.0.0.1:" + freeLocalPort(t)
	health := "127.0.0.1:" + freeLocalPort(t)
	var mu sync.Mutex
	var logs []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		logs = append(logs, args)
		mu.Unlock()
	}, funcr.Options{})
	cfg := func(pr *prober) localproxy.Config {
		return localproxy.Config{
			Endpoints:       []string{echo.addr()},
			ListenAddresses: []string{addr},
			HealthAddress:   health,
			HandoverTimeout: time.Minute,
			Pool:            upstream.Config{Prober: pr, Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1},
			Logger:          log,
		}
	}
	old := start(t, cfg(newProber()))
	require.Eventually(t, old.Pool().Healthy, 10*time.Second, 5*time.Millisecond)
	notReady := newProber()
	notReady.set(echo.addr(), errors.New("readyz: 500"))
	next := start(t, cfg(notReady))

	stopped := make(chan error, 1)
	go func() { stopped <- old.stop() }()
	// The old proxy is stopping (its /readyz fails) and waits: the only
	// 200 can come from the successor, which is not ready.
	require.Eventually(t, func() bool { return old.Status().ShuttingDown }, 10*time.Second, time.Millisecond)
	for i := range 20 {
		c := dial(t, addr)
		require.NoError(t, roundTrip(c, fmt.Sprint("waiting ", i)))
		c.Close()
	}
	select {
	case err := <-stopped:
		t.Fatalf("the old proxy stopped before its successor was ready: %v", err)
	default:
	}
	notReady.set(echo.addr(), nil)
	require.NoError(t, <-stopped)
	mu.Lock()
	defer mu.Unlock()
	handed := false
	for _, l := range logs {
		if strings.Contains(l, "successor listening; handing over") {
			handed = true
			assert.Contains(t, l, `"ready"=true`)
		}
	}
	assert.True(t, handed, "the old proxy logged no hand-over: %v", logs)
	assert.True(t, next.Pool().Healthy())
}
