package altsvc_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/altsvc"
)

// fakeRT answers every request with the response its fields describe.
type fakeRT struct {
	header   http.Header
	status   int
	proto    int
	verified bool
}

func (f *fakeRT) RoundTrip(req *http.Request) (*http.Response, error) {
	resp := &http.Response{
		StatusCode: f.status,
		ProtoMajor: f.proto,
		Header:     f.header.Clone(),
		Body:       io.NopCloser(strings.NewReader("")),
		Request:    req,
	}
	if f.verified {
		resp.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	} else {
		resp.TLS = &tls.ConnectionState{}
	}
	return resp, nil
}

var apiOrigin = altsvc.Origin{Scheme: "https", Host: "10.250.0.1", Port: 6443}

// sink records what a Learner hands to ClientConfig.Update.
type sink struct {
	mu    sync.Mutex
	last  []string
	calls int
}

func (s *sink) update(addrs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.IsSorted(addrs) || len(slices.Compact(slices.Clone(addrs))) != len(addrs) {
		panic("Update called with unsorted or duplicated addresses")
	}
	s.last = slices.Clone(addrs)
	s.calls++
}

// altSvcAddrs returns the alternatives last handed to Update (nil if none).
func altSvcAddrs(s *sink) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.last) == 0 {
		return nil
	}
	return slices.Clone(s.last)
}

func newClient(t *testing.T, f *fakeRT, mut func(*altsvc.ClientConfig)) (*altsvc.RoundTripper, *sink, *time.Time) {
	t.Helper()
	p := &sink{}
	now := time.Unix(1_700_000_000, 0)
	cfg := altsvc.ClientConfig{
		Update: p.update,
		Origin: apiOrigin,
		Admit:  admitCIDR(netip.MustParsePrefix("10.250.0.0/24")),
		Now:    func() time.Time { return now },
	}
	if mut != nil {
		mut(&cfg)
	}
	rt, err := altsvc.NewRoundTripper(cfg, f)
	require.NoError(t, err)
	return rt, p, &now
}

// admitCIDR admits alternatives whose address is in prefix.
func admitCIDR(prefix netip.Prefix) func(string) bool {
	return func(addr string) bool {
		ap, err := netip.ParseAddrPort(addr)
		return err == nil && prefix.Contains(ap.Addr())
	}
}

func send(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
}

func TestClientLearnsOnlyFromTrustedResponses(t *testing.T) {
	const hdr = `h2="10.250.0.2:6443";ma=60, h2="10.250.0.3:6443";ma=60`
	good := func() *fakeRT {
		return &fakeRT{header: http.Header{"Alt-Svc": {hdr}}, status: 200, proto: 2, verified: true}
	}
	tests := []struct {
		name string
		rt   *fakeRT
		url  string
		want []string
	}{
		{"h2 over verified TLS from the apiOrigin", good(), "https://10.250.0.1:6443/api", []string{"10.250.0.2:6443", "10.250.0.3:6443"}},
		{"HTTP/1.1 response", func() *fakeRT { f := good(); f.proto = 1; return f }(), "https://10.250.0.1:6443/api", nil},
		{"unverified TLS", func() *fakeRT { f := good(); f.verified = false; return f }(), "https://10.250.0.1:6443/api", nil},
		{"421 Misdirected Request", func() *fakeRT { f := good(); f.status = 421; return f }(), "https://10.250.0.1:6443/api", nil},
		{"plain http", good(), "http://10.250.0.1:6443/api", nil},
		{"another host", good(), "https://10.250.0.9:6443/api", nil},
		{"outside the allowlist", &fakeRT{header: http.Header{"Alt-Svc": {`h2="192.0.2.1:6443"`}}, status: 200, proto: 2, verified: true}, "https://10.250.0.1:6443/api", nil},
		{"not h2", &fakeRT{header: http.Header{"Alt-Svc": {`h3="10.250.0.2:6443"`}}, status: 200, proto: 2, verified: true}, "https://10.250.0.1:6443/api", nil},
		{"invalid header", &fakeRT{header: http.Header{"Alt-Svc": {`h2="10.250.0.2:0"`}}, status: 200, proto: 2, verified: true}, "https://10.250.0.1:6443/api", nil},
		{"apiOrigin host shorthand", &fakeRT{header: http.Header{"Alt-Svc": {`h2=":7443"`}}, status: 200, proto: 2, verified: true}, "https://10.250.0.1:6443/api", []string{"10.250.0.1:7443"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt, p, _ := newClient(t, tc.rt, nil)
			send(t, rt, tc.url)
			assert.Equal(t, tc.want, altSvcAddrs(p))
		})
	}
}

// ClientConfig.Trust keeps the responses to the requests it refuses from
// teaching, or clearing, anything.
func TestClientTrust(t *testing.T) {
	f := &fakeRT{header: http.Header{"Alt-Svc": {`h2="10.250.0.2:6443";ma=60`}}, status: 200, proto: 2, verified: true}
	rt, p, _ := newClient(t, f, func(c *altsvc.ClientConfig) {
		c.Trust = func(req *http.Request) bool { return !strings.HasSuffix(req.URL.Path, "/proxy") }
	})
	send(t, rt, "https://10.250.0.1:6443/api/v1/pods/x/proxy")
	assert.Nil(t, altSvcAddrs(p), "learned from a refused request")
	send(t, rt, "https://10.250.0.1:6443/api")
	assert.Equal(t, []string{"10.250.0.2:6443"}, altSvcAddrs(p))
	f.header = http.Header{"Alt-Svc": {"clear"}}
	send(t, rt, "https://10.250.0.1:6443/api/v1/pods/x/proxy")
	assert.Equal(t, []string{"10.250.0.2:6443"}, altSvcAddrs(p), "cleared by a refused request")
}

func TestClientExpiryAndClear(t *testing.T) {
	f := &fakeRT{header: http.Header{"Alt-Svc": {`h2="10.250.0.2:6443";ma=30`}, "Age": {"10"}}, status: 200, proto: 2, verified: true}
	rt, p, now := newClient(t, f, nil)
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Equal(t, []string{"10.250.0.2:6443"}, altSvcAddrs(p))

	// No header any more: the alternative lives ma - Age = 20s.
	f.header = http.Header{}
	*now = now.Add(19 * time.Second)
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Equal(t, []string{"10.250.0.2:6443"}, altSvcAddrs(p))
	*now = now.Add(2 * time.Second)
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Empty(t, altSvcAddrs(p))

	f.header = http.Header{"Alt-Svc": {`h2="10.250.0.2:6443"`}}
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Equal(t, []string{"10.250.0.2:6443"}, altSvcAddrs(p))
	f.header = http.Header{"Alt-Svc": {`clear`}}
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Empty(t, altSvcAddrs(p))
}

func TestClientAdmit(t *testing.T) {
	f := &fakeRT{header: http.Header{"Alt-Svc": {`h2="192.0.2.7:6443", h2="[2001:DB8::0:1]:6443", h2="192.0.2.8:6443", h2=":7443"`}}, status: 200, proto: 2, verified: true}
	var asked []string
	rt, p, _ := newClient(t, f, func(c *altsvc.ClientConfig) {
		c.Admit = func(addr string) bool {
			asked = append(asked, addr)
			return addr == "192.0.2.7:6443"
		}
	})
	send(t, rt, "https://10.250.0.1:6443/")
	assert.Equal(t, []string{"192.0.2.7:6443"}, altSvcAddrs(p), "only the admitted one is used")
	assert.ElementsMatch(t, []string{"192.0.2.7:6443", "[2001:db8::1]:6443", "192.0.2.8:6443", "10.250.0.1:7443"}, asked,
		"Admit sees canonical addresses, with the origin's host for the shorthand")
}

func TestNewRoundTripperValidates(t *testing.T) {
	p := &sink{}
	_, err := altsvc.NewRoundTripper(altsvc.ClientConfig{Origin: apiOrigin, Admit: admitCIDR(netip.Prefix{})}, http.DefaultTransport)
	assert.ErrorContains(t, err, "Update")
	_, err = altsvc.NewRoundTripper(altsvc.ClientConfig{Update: p.update, Origin: apiOrigin}, http.DefaultTransport)
	assert.ErrorContains(t, err, "Admit")
	_, err = altsvc.NewRoundTripper(altsvc.ClientConfig{Update: p.update, Origin: altsvc.Origin{Scheme: "http", Host: "a", Port: 80}, Admit: admitCIDR(netip.Prefix{})}, http.DefaultTransport)
	assert.ErrorContains(t, err, "https")
}

func TestHandlerAdvertises(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	eps := []string{"10.250.0.1:6443", "[2001:db8::1]:6443", "not an endpoint", "10.250.0.2:6443"}
	h := altsvc.NewHandler(next, altsvc.HandlerConfig{
		Endpoints:   func() []string { return eps },
		MaxAge:      30 * time.Second,
		ClientCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	for _, tc := range []struct {
		name   string
		tls    bool
		remote string
		want   string
	}{
		{"TLS client in range", true, "10.1.2.3:5555", `h2="10.250.0.1:6443";ma=30,h2="[2001:db8::1]:6443";ma=30,h2="10.250.0.2:6443";ma=30`},
		{"client out of range", true, "192.0.2.1:5555", ""},
		{"plain http", false, "10.1.2.3:5555", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			if !tc.tls {
				r.TLS = nil
			} else {
				r.TLS = &tls.ConnectionState{}
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, tc.want, w.Header().Get("Alt-Svc"))
			assert.Equal(t, "ok", w.Body.String())
			if tc.want != "" {
				v, err := altsvc.Parse(tc.want)
				require.NoError(t, err)
				assert.Len(t, v.Alternatives, 3)
			}
		})
	}
}
