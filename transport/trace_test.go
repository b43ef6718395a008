package transport_test

import (
	"io"
	"net/http"
	"net/http/httptrace"
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
