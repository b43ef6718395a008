package transport_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// h2Mode is how a rawH2 server treats each request.
type h2Mode int

const (
	// refuse resets each stream with REFUSED_STREAM: not processed.
	refuse h2Mode = iota
	// goAwayAbove answers each request's HEADERS with a GOAWAY whose last
	// stream id is 0: the stream is above it, not processed.
	goAwayAbove
	// goAwayAfter processes the whole request, then sends a GOAWAY whose
	// last stream id covers it, with debug data that looks like one of
	// net/http's own errors, and closes the connection.
	goAwayAfter
	// closeAfter processes the whole request, then closes the connection
	// without answering.
	closeAfter
)

// rawH2 is a raw HTTP/2 server driven frame by frame, for what an
// http.Server cannot be made to do.
type rawH2 struct {
	addr      string
	mode      h2Mode
	headers   atomic.Int32 // requests that reached it
	processed atomic.Int32 // requests received in full and processed
}

func newRawH2(t *testing.T, cert tls.Certificate, mode h2Mode) *rawH2 {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	require.NoError(t, err)
	r := &rawH2{addr: ln.Addr().String(), mode: mode}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return r
}

// goAwayDebug is the GOAWAY debug data of goAwayAfter: the text of an error
// net/http returns for a request that was never sent.
const goAwayDebug = "http2: client conn not usable"

func (r *rawH2) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return
	}
	// processed runs when a request has been received in full.
	processed := func(id uint32) bool {
		r.processed.Add(1)
		switch r.mode {
		case goAwayAfter:
			fr.WriteGoAway(id, http2.ErrCodeNo, []byte(goAwayDebug))
			return false
		case closeAfter:
			return false
		}
		return true
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			r.headers.Add(1)
			switch r.mode {
			case refuse:
				fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream)
			case goAwayAbove:
				fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			default:
				if f.StreamEnded() && !processed(f.StreamID) {
					return
				}
			}
		case *http2.DataFrame:
			if r.mode >= goAwayAfter && f.StreamEnded() && !processed(f.StreamID) {
				return
			}
		}
	}
}

// rawFirst returns a Failover whose first choice is raw and whose only
// other endpoint is good: good starts unhealthy and stays so (Rise is
// high), so raw is tried first and good only as the fail-open fallback.
func rawFirst(t *testing.T, c *cluster, raw *rawH2) *transport.Failover {
	good := c.servers[0]
	cfg := c.config()
	cfg.Host = "https://" + raw.addr
	good.notReady.Store(true)
	f, err := transport.Wrap(t.Context(), cfg, transport.Options{
		Endpoints:        []string{good.addr},
		DisableDiscovery: true,
		Probe:            endpoint.ProbeTLS,
		Rise:             1000,
	})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	f.Pool().ReportFailure(good.addr, upstream.FailureDial, nil)
	first, err := f.Pool().Pick()
	require.NoError(t, err)
	require.Equal(t, raw.addr, first)
	return f
}

func TestUnprocessedRequestsGoElsewhereWhateverTheMethod(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode h2Mode
	}{
		{"REFUSED_STREAM", refuse},
		{"GOAWAY above the last stream", goAwayAbove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1)
			good := c.servers[0]
			raw := newRawH2(t, c.pki.Cert, tc.mode)
			f := rawFirst(t, c, raw)

			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader([]byte("{}")))
			require.NoError(t, err)
			resp, err := f.HTTPClient().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			assert.Equal(t, good.name, string(body))
			assert.Equal(t, int32(1), raw.headers.Load(), "the raw server saw the request once")
			assert.Equal(t, 1, good.count("POST /api/v1/namespaces/default/configmaps"))
		})
	}
}

// A server may process a request and then send a GOAWAY covering its stream;
// the debug data of the GOAWAY is the server's text, and whatever it says,
// the request is not sent again.
func TestPOSTNotReplayedAfterGoAwayCoveringIt(t *testing.T) {
	c := newCluster(t, 1)
	good := c.servers[0]
	raw := newRawH2(t, c.pki.Cert, goAwayAfter)
	f := rawFirst(t, c, raw)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader([]byte(`{"metadata":{"generateName":"x-"}}`)))
	require.NoError(t, err)
	resp, err := f.HTTPClient().Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err, "the caller must see the failure")
	t.Logf("POST error: %v", err)
	assert.Equal(t, int32(1), raw.processed.Load())
	assert.Equal(t, 0, good.count("POST /api/v1/namespaces/default/configmaps"), "the POST was sent again to another server")
}

// kube-apiserver ignores Idempotency-Key: a POST carrying one is no safer to
// repeat than any other.
func TestPOSTWithIdempotencyKeyNotReplayedAfterProcessing(t *testing.T) {
	for _, header := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		t.Run(header, func(t *testing.T) {
			c := newCluster(t, 1)
			good := c.servers[0]
			raw := newRawH2(t, c.pki.Cert, closeAfter)
			f := rawFirst(t, c, raw)

			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader([]byte(`{"metadata":{"generateName":"x-"}}`)))
			require.NoError(t, err)
			req.Header.Set(header, "7c3a")
			resp, err := f.HTTPClient().Do(req)
			if resp != nil {
				resp.Body.Close()
			}
			require.Error(t, err, "the caller must see the failure")
			t.Logf("POST error: %v", err)
			assert.Equal(t, int32(1), raw.processed.Load())
			assert.Equal(t, 0, good.count("POST /api/v1/namespaces/default/configmaps"), "the POST was sent again to another server")
		})
	}
}
