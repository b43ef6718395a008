package transport_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport"
)

// A configuration that does not verify the API server's certificate must
// not send its credentials to endpoints it discovers or learns: nothing
// would tell an API server from anyone else on a discovered address.
func TestInsecureConfig(t *testing.T) {
	c := newCluster(t, 2)
	insecure := func() *rest.Config {
		cfg := c.config()
		cfg.TLSClientConfig = rest.TLSClientConfig{Insecure: true}
		cfg.BearerToken = "secret"
		return cfg
	}
	t.Run("discovery is refused", func(t *testing.T) {
		_, err := transport.Wrap(t.Context(), insecure(), transport.Options{})
		require.Error(t, err)
		for _, want := range []string{"Insecure", "discovery", "CAFile", "CAData", "DisableDiscovery"} {
			assert.ErrorContains(t, err, want)
		}
	})
	t.Run("Alt-Svc is refused", func(t *testing.T) {
		_, err := transport.Wrap(t.Context(), insecure(), transport.Options{DisableDiscovery: true, AltSvc: &transport.AltSvcOptions{AllowedCIDRs: loopback}})
		require.Error(t, err)
		for _, want := range []string{"Insecure", "Alt-Svc", "CAFile", "CAData", "Options.AltSvc"} {
			assert.ErrorContains(t, err, want)
		}
	})
	t.Run("static endpoints are allowed", func(t *testing.T) {
		// The user named these endpoints.
		f, err := transport.Wrap(t.Context(), insecure(), transport.Options{DisableDiscovery: true, Endpoints: []string{c.servers[1].addr}})
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		assert.Contains(t, []string{c.servers[0].name, c.servers[1].name}, mustGet(t, f, "/api"))
	})
}
