package main_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/localproxy"
)

// The zone selection: --zone, else the label of --node-name's (or
// NODE_NAME's) Node, read with the discovery client or the same
// credentials, else none.
func TestZoneConfigs(t *testing.T) {
	f := newFiles(t)
	defer main.SetServiceAccount(f.missing, f.missing)()
	base := []string{"--endpoints=10.0.0.1:6443@zone-a, [FD00::1]:6443@zone-b,api.example.com:443", "--ca-file=" + f.ca}

	t.Run("endpoint zones", func(t *testing.T) {
		cfg, err := main.ParseConfig(base, env())
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.1:6443@zone-a", "[fd00::1]:6443@zone-b", "api.example.com:443"}, cfg.Endpoints)
		assert.Equal(t, "kubernetes.default.svc", cfg.Origin)
		assert.Empty(t, cfg.Pool.Zone)
		assert.Empty(t, cfg.NodeName)
		_, err = localproxy.New(cfg)
		require.NoError(t, err, "the library takes them as they are")
	})
	t.Run("zone", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(base, "--zone=zone-a"), env("NODE_NAME", "n1"))
		require.NoError(t, err)
		assert.Equal(t, "zone-a", cfg.Pool.Zone)
		assert.Empty(t, cfg.NodeName, "--zone wins over the node's label")
		assert.Nil(t, cfg.NodeClient)
		cfg, err = main.ParseConfig(base, env("LOCALPROXY_ZONE", "zone-b"))
		require.NoError(t, err)
		assert.Equal(t, "zone-b", cfg.Pool.Zone)
	})
	t.Run("node name with discovery", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(base, "--kubeconfig="+f.kubeconfig), env("NODE_NAME", "n1"))
		require.NoError(t, err)
		assert.Equal(t, "n1", cfg.NodeName)
		require.NotNil(t, cfg.Discovery)
		assert.Same(t, cfg.Discovery, cfg.NodeClient, "one client for discovery and the node")
	})
	t.Run("node name without discovery", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(base, "--kubeconfig="+f.kubeconfig, "--enable-discovery=false", "--bind-port=7500"), env("NODE_NAME", "n1"))
		require.NoError(t, err)
		assert.Nil(t, cfg.Discovery)
		assert.Equal(t, "n1", cfg.NodeName)
		require.NotNil(t, cfg.NodeClient)
		assert.Equal(t, "https://127.0.0.1:7500", cfg.NodeClient.Host, "through this proxy")
		assert.Equal(t, "kubernetes.default.svc", cfg.NodeClient.ServerName)
		assert.Equal(t, "secret", cfg.NodeClient.BearerToken)
	})
	t.Run("which variable", func(t *testing.T) {
		cfg, err := main.ParseConfig(append(base, "--kubeconfig="+f.kubeconfig), env("NODE_NAME", "n1", "LOCALPROXY_NODE_NAME", "n2"))
		require.NoError(t, err)
		assert.Equal(t, "n2", cfg.NodeName, "LOCALPROXY_NODE_NAME before NODE_NAME")
		cfg, err = main.ParseConfig(append(base, "--kubeconfig="+f.kubeconfig, "--node-name=n3"), env("NODE_NAME", "n1", "LOCALPROXY_NODE_NAME", "n2"))
		require.NoError(t, err)
		assert.Equal(t, "n3", cfg.NodeName, "the flag first")
	})
	t.Run("node name without credentials", func(t *testing.T) {
		cfg, warnings, err := main.ParseConfigWarnings(base, env("NODE_NAME", "n1"))
		require.NoError(t, err)
		assert.Empty(t, cfg.NodeName)
		require.Len(t, warnings, 2) // discovery's and the zone's
		assert.Equal(t, "the zone is not learned from node n1 (NODE_NAME): there are no credentials to read it with; set --kubeconfig, or --zone", warnings[1])
	})
	t.Run("node name with an insecure kubeconfig", func(t *testing.T) {
		cfg, warnings, err := main.ParseConfigWarnings(append(base, "--kubeconfig="+f.insecure), env("NODE_NAME", "n1"))
		require.NoError(t, err)
		assert.Empty(t, cfg.NodeName)
		require.Len(t, warnings, 2)
		assert.Contains(t, warnings[1], "the zone is not learned from node n1 (NODE_NAME): the cluster of --kubeconfig=")
		assert.Contains(t, warnings[1], "insecure-skip-tls-verify")
	})
}
