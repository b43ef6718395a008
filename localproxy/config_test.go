package localproxy_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
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
