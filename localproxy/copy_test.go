package localproxy_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// TestCopyEndsAreTCPConns checks the precondition of the kernel splice
// path of the copies on goroutines: with a listener of the caller's,
// whose connections Go accepts, the two connections the proxy copies
// between are bare *net.TCPConn (io.Copy into a *net.TCPConn from an
// io.LimitedReader over another one splices on Linux). It does not observe
// splice(2) itself; a wrapper on either side would make it fail.
func TestCopyEndsAreTCPConns(t *testing.T) {
	echo := newEcho(t)
	var lc net.ListenConfig
	r := start(t, localproxy.Config{Endpoints: []string{echo.addr()}, Listen: lc.Listen})
	c := dial(t, r.addr())
	require.NoError(t, roundTrip(c, "splice"))
	ends := r.CopyEnds()
	require.Len(t, ends, 1)

	assert.IsType(t, (*net.TCPConn)(nil), ends[0].Client, "client side")
	assert.IsType(t, (*net.TCPConn)(nil), ends[0].Upstream, "upstream side")
	// And they are the sockets of this connection.
	assert.Equal(t, c.LocalAddr().String(), ends[0].Client.RemoteAddr().String())
	assert.Equal(t, c.RemoteAddr().String(), ends[0].Client.LocalAddr().String())
	assert.Equal(t, echo.addr(), ends[0].Upstream.RemoteAddr().String())
}
