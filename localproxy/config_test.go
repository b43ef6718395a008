package localproxy_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// TestConfigProbe: New builds the pool's Prober from Config.Probe and
// reports one it cannot build, naming the field; Pool.Prober is used as
// given instead, but not together with Probe.
func TestConfigProbe(t *testing.T) {
	eps := []string{"127.0.0.1:6443"}
	p, err := localproxy.New(localproxy.Config{Endpoints: eps, Probe: &endpoint.ProbeConfig{Mode: endpoint.ProbeTCP}})
	require.NoError(t, err)
	require.NotNil(t, p.Prober())
	assert.Equal(t, endpoint.ProbeTCP, p.Prober().Mode)
	assert.Same(t, p.Prober(), p.Pool().Config().Prober)
	assert.Zero(t, p.Pool().Config().QuietInterval, "tcp probes: every round checks")
	p, err = localproxy.New(localproxy.Config{Endpoints: eps, Probe: &endpoint.ProbeConfig{Mode: endpoint.ProbeHeld, ServerName: "api.test"}})
	require.NoError(t, err)
	assert.Equal(t, endpoint.DefaultQuietInterval, p.Pool().Config().QuietInterval, "held probes report between rounds")

	fake := newProber()
	p, err = localproxy.New(localproxy.Config{Endpoints: eps, Pool: upstream.Config{Prober: fake}})
	require.NoError(t, err)
	assert.Nil(t, p.Prober())
	assert.Equal(t, "none", p.Prober().Credentials())
	assert.Same(t, fake, p.Pool().Config().Prober)

	_, err = localproxy.New(localproxy.Config{Endpoints: eps, Probe: &endpoint.ProbeConfig{Mode: endpoint.ProbeTCP}, Pool: upstream.Config{Prober: fake}})
	assert.ErrorContains(t, err, "Probe and Pool.Prober are both set")

	missing := filepath.Join(t.TempDir(), "ca.crt")
	_, err = localproxy.New(localproxy.Config{Endpoints: eps, Probe: &endpoint.ProbeConfig{ServerName: "api.test", CAFile: missing}})
	var pe *endpoint.ProbeConfigError
	require.True(t, errors.As(err, &pe), "error %v", err)
	assert.Equal(t, "CAFile", pe.Field)
	assert.ErrorContains(t, err, "localproxy: probe configuration: CAFile: ")
}

// TestConfigProbeOwnDial: a Probe with a DialContext of its own keeps it
// with ProxyProtocol set, and the Probe given is not changed.
func TestConfigProbeOwnDial(t *testing.T) {
	srv := newEcho(t)
	dialed := make(chan string, 10)
	pc := &endpoint.ProbeConfig{Mode: endpoint.ProbeTCP, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case dialed <- addr:
		default:
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	r := start(t, localproxy.Config{
		Endpoints:     []string{srv.addr()},
		ProxyProtocol: localproxy.ProxyProtocolV2,
		Probe:         pc,
		Pool:          upstream.Config{Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond, Rise: 1, Fall: 1},
	})
	select {
	case addr := <-dialed:
		assert.Equal(t, srv.addr(), addr)
	case <-time.After(10 * time.Second):
		t.Fatal("no probe through the Probe's own DialContext")
	}
	require.NoError(t, r.stop())
	assert.Equal(t, endpoint.ProbeTCP, pc.Mode)
	assert.Zero(t, pc.Logger, "the Probe given is not changed")
}

// TestConfigRefusesDuplicates: New refuses an API server given twice in
// Endpoints (after normalization) and an address given twice in
// ListenAddresses, naming both entries; port 0 may repeat. The caller's
// Endpoints slice is left as given.
func TestConfigRefusesDuplicates(t *testing.T) {
	for _, tc := range []struct {
		name      string
		endpoints []string
		listen    []string
		want      string // "" accepted
	}{
		{name: "endpoint twice", endpoints: []string{"10.0.0.1:6443", "10.0.0.1:6443"}, want: `Endpoints: "10.0.0.1:6443" is the same address, 10.0.0.1:6443, as "10.0.0.1:6443" before it`},
		{name: "endpoint in two zones", endpoints: []string{"10.0.0.1:6443@a", "10.0.0.2:6443", "10.0.0.1:6443@b"}, want: `"10.0.0.1:6443@b" is the same address, 10.0.0.1:6443, as "10.0.0.1:6443@a"`},
		{name: "host case and trailing dot", endpoints: []string{"API.example.com:6443", "api.example.com.:6443"}, want: `as "API.example.com:6443" before it`},
		{name: "IPv6 spelling", endpoints: []string{"[2001:db8::1]:6443", "[2001:0db8:0:0::1]:6443"}, want: "the same address, [2001:db8::1]:6443"},
		{name: "other ports", endpoints: []string{"10.0.0.1:6443", "10.0.0.1:6444"}},
		{name: "listen twice", listen: []string{"127.0.0.1:7445", "[::1]:7445", "127.0.0.1:7445"}, want: `ListenAddresses: "127.0.0.1:7445" is the same address, 127.0.0.1:7445, as "127.0.0.1:7445" before it`},
		{name: "listen IPv4-mapped", listen: []string{"127.0.0.1:7445", "[::ffff:127.0.0.1]:7445"}, want: `"[::ffff:127.0.0.1]:7445" is the same address, 127.0.0.1:7445`},
		{name: "listen port spelling", listen: []string{"localhost:7445", "LOCALHOST.:07445"}, want: `as "localhost:7445" before it`},
		{name: "listen not host:port", listen: []string{"127.0.0.1"}, want: `ListenAddresses: "127.0.0.1": want host:port`},
		// Go binds one dual-stack socket on :: for each.
		{name: "wildcard twice", listen: []string{"0.0.0.0:7445", "[::]:7445"}, want: `"[::]:7445" is the same address, [::]:7445, as "0.0.0.0:7445"`},
		{name: "wildcard without a host", listen: []string{"[::]:7445", ":7445"}, want: `":7445" is the same address`},
		{name: "listen port 0 twice", listen: []string{"127.0.0.1:0", "127.0.0.1:0"}},
		{name: "listen other ports", listen: []string{"127.0.0.1:7445", "127.0.0.1:7447"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps := tc.endpoints
			if eps == nil {
				eps = []string{"127.0.0.1:6443"}
			}
			given := slices.Clone(eps)
			_, err := localproxy.New(localproxy.Config{Endpoints: eps, ListenAddresses: tc.listen})
			assert.Equal(t, given, eps, "the caller's Endpoints")
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
