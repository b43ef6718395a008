package localproxy_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
)

// TestListensOnIPv4AndIPv6Loopback proxies through both listeners of a
// proxy on 127.0.0.1 and [::1], as deployed for clients that resolve
// localhost to either.
func TestListensOnIPv4AndIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("cannot bind [::1] on this host: %v", err)
	}
	ln.Close()

	echo := newEcho(t)
	r := start(t, localproxy.Config{
		Endpoints:       []string{echo.addr()},
		ListenAddresses: []string{"127.0.0.1:0", "[::1]:0"},
	})
	addrs := r.Addrs()
	require.Len(t, addrs, 2)
	assert.Equal(t, []string{addrs[0].String(), addrs[1].String()}, r.Status().Listeners)
	for i, want := range []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} {
		ta, ok := addrs[i].(*net.TCPAddr)
		require.True(t, ok, "%T", addrs[i])
		require.True(t, ta.IP.Equal(want), "listener %d is on %v, want %v", i, ta.IP, want)
		c := dial(t, ta.String())
		require.NoError(t, roundTrip(c, "through "+ta.String()))
		assert.True(t, c.LocalAddr().(*net.TCPAddr).IP.Equal(want), "client connected from %v", c.LocalAddr())
	}
	assert.Equal(t, 2.0, metric(t, r.reg, "apifailover_localproxy_connections_accepted_total"))
	assert.Equal(t, int64(2), echo.open.Load())
}
