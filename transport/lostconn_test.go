package transport_test

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// A watch whose connection goes away must end the way client-go resumes
// from: io.ErrUnexpectedEOF (the reflector watches again from its resource
// version), not an HTTP/2 connection error (an error event: relist).
func TestStreamOnLostConnectionEndsWithUnexpectedEOF(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(s *server, cancel context.CancelFunc)
		want  error
	}{
		// The server dies under the stream.
		{"endpoint down", func(s *server, _ context.CancelFunc) { s.kill() }, io.ErrUnexpectedEOF},
		// The ping goes unanswered: "http2: client connection lost".
		{"connection lost", func(s *server, _ context.CancelFunc) { s.ln.freeze() }, io.ErrUnexpectedEOF},
		// The caller gives up: its error, unchanged.
		{"caller cancels", func(_ *server, cancel context.CancelFunc) { cancel() }, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2)
			f := wrap(t, c, transport.Options{
				ProbeInterval: 100 * time.Millisecond,
				PingInterval:  200 * time.Millisecond,
				PingTimeout:   200 * time.Millisecond,
			})
			victim := serving(t, c, f)
			victim.setHandler(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "event\n")
				w.(http.Flusher).Flush()
				<-r.Context().Done() // a watch that never ends by itself
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+f.Origin()+"/api/v1/pods?watch=1", nil)
			require.NoError(t, err)
			resp, err := f.HTTPClient().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			first := make([]byte, len("event\n"))
			_, err = io.ReadFull(resp.Body, first)
			require.NoError(t, err)

			tc.fault(victim, cancel)
			done := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(make([]byte, 64))
				done <- err
			}()
			select {
			case err := <-done:
				// client-go compares with ==, not errors.Is.
				assert.True(t, err == tc.want, "body read error %v (%T), want %v", err, err, tc.want)
			case <-time.After(10 * time.Second):
				t.Fatal("the stream did not end")
			}
		})
	}
}

// dialAttempts counts connection attempts from the transport's metrics.
func dialAttempts(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, mf := range mfs {
		if mf.GetName() == "apifailover_dial_duration_seconds" {
			for _, m := range mf.GetMetric() {
				n += int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return n
}

// While every endpoint is down, requests fail at once from the last failed
// round for the dial holdoff (endpoint.DefaultHoldoff) instead of each
// dialing every endpoint. The assertions count, whatever the machine's
// speed: how many rounds a holdoff allows per request rate is
// TestHoldoffBoundsRoundsWhateverTheRequestRate (transport/endpoint), on a
// simulated clock.
func TestDialsHeldOffWhileEveryEndpointIsDown(t *testing.T) {
	c := newCluster(t, 2)
	reg := prometheus.NewRegistry()
	f := wrap(t, c, transport.Options{Registerer: reg})
	mustGet(t, f, "/api")
	for _, s := range c.servers {
		s.kill()
	}
	start := time.Now()
	requests, held, rounds := 0, 0, 0
	for time.Since(start) < 3*endpoint.DefaultHoldoff || requests < 30 {
		before := dialAttempts(t, reg)
		_, err := get(t, f, "/api")
		require.ErrorIs(t, err, endpoint.ErrUnreachable)
		requests++
		dials := dialAttempts(t, reg) - before
		if isHeldOff(err) {
			held++
			require.Zero(t, dials, "request %d was held off but dialed: %v", requests, err)
			continue
		}
		rounds++
		// The first may fail on its broken connection first, and then
		// dial only the other endpoints.
		require.LessOrEqual(t, dials, len(c.servers), "request %d made more than one round of connection attempts: %v", requests, err)
	}
	t.Logf("%d requests in %v: %d rounds of connection attempts, %d held off", requests, time.Since(start), rounds, held)
	assert.Positive(t, held, "connection attempts must not follow the request rate: no request was held off")
	assert.Less(t, rounds, requests, "connection attempts must not follow the request rate")
}

// isHeldOff reports whether err is a holdoff's (endpoint.Holdoff.Err): the
// failure of the last round, repeated without dialing.
func isHeldOff(err error) bool {
	return err != nil && strings.Contains(err.Error(), "next attempt in")
}

// An endpoint that comes back ends the holdoff at once. That it ends at
// once, not when it runs out, is TestHoldoffEndsAtOnceWhenAnEndpointComesBack
// (transport/endpoint), on a simulated clock; this test checks that the
// transport's holdoff hears of the endpoint coming back.
func TestHoldoffEndsWhenAnEndpointComesBack(t *testing.T) {
	c := newCluster(t, 1)
	s := c.servers[0]
	f := wrap(t, c, transport.Options{ProbeInterval: 60 * time.Millisecond, Rise: 1, Fall: 1})
	mustGet(t, f, "/api")
	s.kill()
	var failedAt time.Time
	for range 3 { // the first may fail on the broken connection
		_, err := get(t, f, "/api")
		require.Error(t, err)
		failedAt = time.Now()
	}
	restartAt(t, s.addr, c.pki.Cert)
	require.Eventually(t, func() bool {
		st := f.Pool().Status()
		return len(st) == 1 && st[0].State == upstream.StateHealthy
	}, 5*time.Second, time.Millisecond)
	_, err := get(t, f, "/api")
	since := time.Since(failedAt)
	require.NoError(t, err, "request %v after the last failure, the endpoint being healthy again", since)
	if since >= endpoint.DefaultHoldoff {
		t.Skipf("the request came %v after the last failure, after the holdoff had run out: nothing was tested (the machine is slow)", since)
	}
}

// restartAt serves again on addr, like a restarted API server.
func restartAt(t *testing.T, addr string, cert tls.Certificate) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "restarted")
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
}
