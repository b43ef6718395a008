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
	"github.com/apifailover/apifailover/transport/upstream"
)

// refuser is a raw HTTP/2 server that answers every request with
// REFUSED_STREAM or with a GOAWAY whose last stream id is 0: either way the
// request was provably not processed.
type refuser struct {
	addr    string
	goaway  bool
	headers atomic.Int32 // requests that reached it
}

func newRefuser(t *testing.T, cert tls.Certificate, goaway bool) *refuser {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	require.NoError(t, err)
	r := &refuser{addr: ln.Addr().String(), goaway: goaway}
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

func (r *refuser) serve(c net.Conn) {
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
			if r.goaway {
				fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			} else {
				fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream)
			}
		}
	}
}

func TestUnprocessedRequestsGoElsewhereWhateverTheMethod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		goaway bool
	}{
		{"REFUSED_STREAM", false},
		{"GOAWAY above the last stream", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1)
			good := c.servers[0]
			ref := newRefuser(t, c.pki.cert, tc.goaway)
			cfg := c.config()
			cfg.Host = "https://" + ref.addr
			// The good server starts unhealthy and stays so (Rise is
			// high), so the refuser is tried first and the good one only
			// as the fail-open fallback.
			good.notReady.Store(true)
			f, err := transport.Wrap(t.Context(), cfg, transport.Options{
				Endpoints:        []string{good.addr},
				DisableDiscovery: true,
				Probe:            transport.ProbeTLS,
				Rise:             1000,
			})
			require.NoError(t, err)
			defer f.Close()
			f.Pool().ReportFailure(good.addr, upstream.FailureDial, nil)
			first, err := f.Pool().Pick()
			require.NoError(t, err)
			require.Equal(t, ref.addr, first)

			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+f.Origin()+"/api/v1/namespaces/default/configmaps", bytes.NewReader([]byte("{}")))
			require.NoError(t, err)
			resp, err := f.HTTPClient().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			assert.Equal(t, good.name, string(body))
			assert.Equal(t, int32(1), ref.headers.Load(), "the refuser saw the request once")
			assert.Equal(t, 1, good.count("POST /api/v1/namespaces/default/configmaps"))
		})
	}
}
