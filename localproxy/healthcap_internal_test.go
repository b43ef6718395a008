package localproxy

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// At its cap the health listener closes, for each new connection, the
// one that went longest without a request in progress (new, or idle
// between requests); connections serving a request keep their slot, and
// when every one does, the new connection is closed instead.
func TestCapListenerEvictsTheOldestWithoutARequest(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "active"})
	rejected := prometheus.NewCounter(prometheus.CounterOpts{Name: "rejected"})
	evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"})
	l := newCapListener(inner, 3, gauge, rejected, evicted, logr.Discard())
	t.Cleanup(func() { l.Close() })

	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	accept := func() *cappedConn {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
		sc, err := l.Accept()
		require.NoError(t, err)
		return sc.(*cappedConn)
	}
	closed := func(c *cappedConn) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		_, open := l.conns[c]
		return !open
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
	cl, err := net.Dial("tcp", inner.Addr().String())
	require.NoError(t, err)
	clients = append(clients, cl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Accept() // blocks after turning cl away
	}()
	require.Eventually(t, func() bool { return counterValue(rejected) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, 2.0, counterValue(evicted))
	assert.False(t, closed(a) || closed(d) || closed(e))
	l.Close()
	<-done
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
