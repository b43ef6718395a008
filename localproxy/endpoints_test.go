package localproxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want upstream.Spec
		err  string // the whole message, if the input is refused
	}{
		{in: "10.0.0.1:6443", want: upstream.Spec{Addr: "10.0.0.1:6443"}},
		{in: "10.0.0.1:6443@zone-a", want: upstream.Spec{Addr: "10.0.0.1:6443", Zone: "zone-a"}},
		{in: "[::1]:6443@z", want: upstream.Spec{Addr: "[::1]:6443", Zone: "z"}},
		{in: "[FD00::0001]:6443@eu-west-1a", want: upstream.Spec{Addr: "[fd00::1]:6443", Zone: "eu-west-1a"}},
		{in: "CP-1.Example.com.:6443@Zone_1.b", want: upstream.Spec{Addr: "cp-1.example.com:6443", Zone: "Zone_1.b"}},
		{in: "[fe80::1%eth0]:6443", want: upstream.Spec{Addr: "[fe80::1%eth0]:6443"}},
		{in: "[fe80::1%eth0]:6443@a", want: upstream.Spec{Addr: "[fe80::1%eth0]:6443", Zone: "a"}},
		{in: "10.0.0.1:6443@" + strings.Repeat("z", 63), want: upstream.Spec{Addr: "10.0.0.1:6443", Zone: strings.Repeat("z", 63)}},

		{in: "10.0.0.1:6443@", err: `invalid endpoint "10.0.0.1:6443@": zone is empty; want ` + localproxy.ZoneRule},
		{in: "10.0.0.1:6443@-a", err: `invalid endpoint "10.0.0.1:6443@-a": zone "-a" is not a label value; want ` + localproxy.ZoneRule},
		{in: "10.0.0.1:6443@a b", err: `invalid endpoint "10.0.0.1:6443@a b": zone "a b" is not a label value; want ` + localproxy.ZoneRule},
		{in: "10.0.0.1:6443@a@b", err: `invalid endpoint "10.0.0.1:6443@a@b": port "6443@a" is not a number in 1-65535`},
		{in: "10.0.0.1:6443@" + strings.Repeat("z", 64), err: `invalid endpoint "10.0.0.1:6443@` + strings.Repeat("z", 64) + `": zone "` + strings.Repeat("z", 64) + `" has 64 characters; want ` + localproxy.ZoneRule},
		{in: "10.0.0.1@a", err: `invalid endpoint "10.0.0.1@a": missing port in address`},
		{in: "@a", err: `invalid endpoint "@a": empty`},
		{in: "[::1]@a:6443", err: `invalid endpoint "[::1]@a:6443": missing port in address`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := localproxy.ParseEndpoint(tc.in)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				var ee *localproxy.EndpointError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tc.in, ee.Input)
				assert.Equal(t, strings.Contains(tc.err, ": zone "), ee.Zone)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// Whatever ParseEndpoint accepts is a valid address and zone, and its
// canonical form parses back to the same spec.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:6443", "10.0.0.1:6443@zone-a", "[::1]:6443@z", "[fe80::1%eth0]:6443@a", "[fe80::1%x@y]:6443",
		"cp.example.com:6443@eu-west-1a", "10.0.0.1:6443@", "@", "a@b@c", "[::1]:6443@-", "::1:6443@a",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := localproxy.ParseEndpoint(s)
		if err != nil {
			var ee *localproxy.EndpointError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, s, ee.Input)
			return
		}
		addr, err := upstream.ParseAddr(spec.Addr)
		require.NoError(t, err, "accepted %q with an address that does not parse", s)
		assert.Equal(t, spec.Addr, addr, "the address is canonical")
		if spec.Zone != "" {
			require.NoError(t, localproxy.CheckZone(spec.Zone))
		}
		formatted := localproxy.FormatEndpoint(spec)
		again, err := localproxy.ParseEndpoint(formatted)
		require.NoError(t, err, "%q (from %q) does not parse", formatted, s)
		assert.Equal(t, spec, again, "%q (from %q)", formatted, s)
		assert.Equal(t, formatted, localproxy.FormatEndpoint(again))
	})
}

// A static endpoint's zone shows in the pool, and discovery, which knows
// no zone, reporting the same address keeps it.
func TestStaticZoneKeptByDiscovery(t *testing.T) {
	const discovered = "127.0.0.2:1" // refuses: discovery traffic goes to the fake API server
	api := fakeAPIServer(t, false, discovered)
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: pemOf(api.Certificate().Raw)}, BearerToken: "token"}
	port := freeLocalPort(t)
	r := start(t, localproxy.Config{
		Endpoints:       []string{api.Listener.Addr().String(), discovered + "@zone-a"},
		ListenAddresses: []string{"127.0.0.1:" + port},
		Discovery:       localproxy.DiscoveryConfig(base, "127.0.0.1:"+port, "example.com"),
	})
	zoneOf := func() (string, string) {
		for _, s := range r.Status().Upstreams {
			if s.Addr == discovered {
				return s.Zone, s.Sources
			}
		}
		return "", ""
	}
	zone, _ := zoneOf()
	assert.Equal(t, "zone-a", zone, "the static zone")
	require.Eventually(t, func() bool {
		_, sources := zoneOf()
		return sources == "static,discovery"
	}, 20*time.Second, 10*time.Millisecond, "discovery reports the static endpoint")
	zone, _ = zoneOf()
	assert.Equal(t, "zone-a", zone, "discovery's empty zone does not replace the static one")
}

// New takes zones in Endpoints and keeps them, in canonical form.
func TestNewEndpointZones(t *testing.T) {
	eps := []string{"[FD00::1]:6443@zone-b", "10.0.0.1:6443"}
	p, err := localproxy.New(localproxy.Config{Endpoints: eps})
	require.NoError(t, err)
	assert.Equal(t, []string{"[FD00::1]:6443@zone-b", "10.0.0.1:6443"}, eps, "the caller's slice is not changed")
	assert.Equal(t, "[fd00::1]:6443", p.Status().Origin, "the first endpoint's address, without its zone")
	zones := map[string]string{}
	for _, s := range p.Pool().Status() {
		zones[s.Addr] = s.Zone
	}
	assert.Equal(t, map[string]string{"[fd00::1]:6443": "zone-b", "10.0.0.1:6443": ""}, zones)
	_, err = localproxy.New(localproxy.Config{Endpoints: []string{"10.0.0.1:6443@"}})
	require.EqualError(t, err, `localproxy: Endpoints: invalid endpoint "10.0.0.1:6443@": zone is empty; want `+localproxy.ZoneRule)
}
