package transport_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
)

// httptrace's GotConn names the endpoint that serves each request (its
// RemoteAddr), before and after a failover, as http.Transport does for the
// connections it makes.
func TestGotConnNamesTheServingEndpoint(t *testing.T) {
	c := newCluster(t, 2)
	f := wrap(t, c, transport.Options{})
	traced := func() (remote string, reused bool, served string) {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			remote, reused = info.Conn.RemoteAddr().String(), info.Reused
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, "https://"+f.Origin()+"/api", nil)
		require.NoError(t, err)
		resp, err := f.HTTPClient().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return remote, reused, string(b)
	}
	byName := map[string]string{}
	for _, s := range c.servers {
		byName[s.name] = s.addr
	}

	remote, _, served := traced()
	assert.Equal(t, byName[served], remote)
	remote, reused, served := traced()
	assert.Equal(t, byName[served], remote)
	assert.True(t, reused, "second request on the same connection")

	victim := serving(t, c, f)
	victim.kill()
	remote, _, served = traced()
	assert.NotEqual(t, victim.name, served)
	assert.Equal(t, byName[served], remote, "after the failover")
}

// writeCounter counts the Writes to a connection.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// A request wakes its server's held connection (the onWrite hook) once
// its header block was written to the connection, not before: the PING
// that goes on the wake follows the request, so a server that froze
// before it read the request leaves that PING unanswered. For a request
// that is not idempotent the same hook notes the write (wrote). The
// connection's requests share one trace; a request with a trace of its
// own keeps it.
func TestRequestWakesOnceItsHeadersAreWritten(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	var writes atomic.Int64
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, &writes}, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	var woke, own int
	var atWake int64
	wake := &httptrace.ClientTrace{WroteHeaders: func() { woke++; atWake = writes.Load() }}
	for i, method := range []string{http.MethodGet, http.MethodGet, http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodGet} {
		body := io.Reader(nil)
		if method == http.MethodPost {
			body = strings.NewReader("{}")
		}
		ctx := t.Context()
		if i == 2 {
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { own++ }})
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL, body)
		require.NoError(t, err)
		before := writes.Load()
		woke = 0
		send, wrote := transport.TraceWrites(req, wake)
		res, err := tr.RoundTrip(send)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, 1, woke, "request %d (%s): one wake", i, method)
		if i == 2 {
			assert.Equal(t, 1, own, "the request's own trace was called")
		}
		if i > 2 {
			assert.Equal(t, 1, own, "request %d (%s): the shared trace took request 2's own hook", i, method)
		}
		assert.Greater(t, atWake, before, "request %d (%s): woke before anything was written", i, method)
		if method == http.MethodGet {
			assert.Nil(t, wrote, "a GET is retried whatever happened")
		} else if assert.NotNil(t, wrote, method) {
			assert.True(t, wrote(), "%s: its headers were written", method)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	send, wrote := transport.TraceWrites(req, nil)
	assert.Same(t, req, send, "nothing to trace: the request as it is")
	assert.Nil(t, wrote)
}
