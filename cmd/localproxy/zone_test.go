package main_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	main "github.com/apifailover/apifailover/cmd/localproxy"
	"github.com/apifailover/apifailover/localproxy"
)

// Zones: --zone, zones in --endpoints and --node-name are refused with
// the flag or variable, the value and what is allowed.
func TestZoneBadValues(t *testing.T) {
	ok := []string{"--endpoints=10.0.0.1:6443", "--probe=tcp"}
	const rule = "want " + localproxy.ZoneRule
	tests := []struct {
		name string
		args []string
		env  []string
		want []string // the lines expected, without the "localproxy: " prefix
	}{
		{"zone", append(ok, "--zone=-a"), nil, []string{`invalid --zone="-a": the zone "-a" is not a label value; ` + rule}},
		{"zone too long", append(ok, "--zone="+strings.Repeat("z", 64)), nil, []string{`invalid --zone="` + strings.Repeat("z", 64) + `": the zone "` + strings.Repeat("z", 64) + `" has 64 characters; ` + rule}},
		{"zone from env", ok, []string{"LOCALPROXY_ZONE", "eu west"}, []string{`invalid LOCALPROXY_ZONE="eu west" (--zone): the zone "eu west" is not a label value; ` + rule}},
		{"endpoint zone empty", []string{"--endpoints=10.0.0.1:6443@", "--probe=tcp"}, nil, []string{`invalid --endpoints="10.0.0.1:6443@": zone is empty; ` + rule + ` (host:port@zone)`}},
		{"endpoint zone bad", []string{"--endpoints=10.0.0.1:6443@a,[::1]:6443@a/b", "--probe=tcp"}, nil, []string{`invalid --endpoints="[::1]:6443@a/b": zone "a/b" is not a label value; ` + rule + ` (host:port@zone)`}},
		{"endpoint zone from env", []string{"--probe=tcp"}, []string{"LOCALPROXY_ENDPOINTS", "10.0.0.1:6443@-"}, []string{`invalid LOCALPROXY_ENDPOINTS="10.0.0.1:6443@-" (--endpoints): zone "-" is not a label value; ` + rule + ` (host:port@zone)`}},
		{"endpoint address before a zone", []string{"--endpoints=10.0.0.1@zone-a", "--probe=tcp"}, nil, []string{`invalid --endpoints="10.0.0.1@zone-a": missing port in address; want host:port with an IPv4 address, a bracketed IPv6 address or an RFC 1123 DNS name, and a port 1-65535, optionally followed by @zone`}},
		{"node name", append(ok, "--node-name=Node_1"), nil, []string{`invalid --node-name="Node_1": want a Node name: an RFC 1123 subdomain of at most 253 lowercase letters, digits, '-' and '.'`}},
		{"node name from NODE_NAME", ok, []string{"NODE_NAME", "-n1"}, []string{`invalid NODE_NAME="-n1" (--node-name): want a Node name: an RFC 1123 subdomain of at most 253 lowercase letters, digits, '-' and '.'`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := main.Run(t.Context(), tc.args, env(tc.env...), io.Discard, &stderr)
			assert.Equal(t, main.ExitUsage, code, "stderr: %s", stderr.String())
			var want []string
			for _, w := range tc.want {
				want = append(want, "localproxy: "+w)
			}
			want = append(want, "Run 'localproxy --help' for the flags.")
			assert.Equal(t, want, strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n"))
		})
	}
}

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
