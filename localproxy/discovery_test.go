//lint:file-ignore SA1019 the v1 Endpoints fallback for node identities is what these tests exercise.

package localproxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

// fakeAPIServer answers the discovery requests: the kubernetes
// EndpointSlices (or 403 for them, and the Endpoints instead).
func fakeAPIServer(t *testing.T, forbidSlices bool, discovered string) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasPrefix(r.URL.Path, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"):
			if forbidSlices {
				w.WriteHeader(http.StatusForbidden)
				json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonForbidden, Code: 403})
				return
			}
			host, port, _ := strings.Cut(discovered, ":")
			p := int32(0)
			for _, c := range port {
				p = p*10 + int32(c-'0')
			}
			name, ready := "https", true
			slice := discoveryv1.EndpointSlice{
				TypeMeta:    metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
				ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", ResourceVersion: "1"},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
				Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &p}},
			}
			if r.URL.Query().Get("watch") == "true" {
				enc := json.NewEncoder(w)
				if r.URL.Query().Get("sendInitialEvents") == "true" {
					// Watch-list: the initial objects, then the bookmark
					// that ends them.
					enc.Encode(map[string]any{"type": "ADDED", "object": slice})
					enc.Encode(map[string]any{"type": "BOOKMARK", "object": discoveryv1.EndpointSlice{
						TypeMeta:   slice.TypeMeta,
						ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
					}})
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
				return
			}
			json.NewEncoder(w).Encode(discoveryv1.EndpointSliceList{
				TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "1"},
				Items:    []discoveryv1.EndpointSlice{slice},
			})
		case r.URL.Path == "/api/v1/namespaces/default/endpoints/kubernetes":
			host, port, _ := strings.Cut(discovered, ":")
			p := int32(0)
			for _, c := range port {
				p = p*10 + int32(c-'0')
			}
			json.NewEncoder(w).Encode(corev1.Endpoints{ //nolint:staticcheck // the fallback reads v1 Endpoints
				TypeMeta:   metav1.TypeMeta{Kind: "Endpoints", APIVersion: "v1"},
				ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"},
				Subsets: []corev1.EndpointSubset{{ //nolint:staticcheck
					Addresses: []corev1.EndpointAddress{{IP: host}},
					Ports:     []corev1.EndpointPort{{Name: "https", Port: p}}, //nolint:staticcheck
				}},
			})
		default:
			http.NotFound(w, r)
		}
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func TestDiscoveryThroughTheProxy(t *testing.T) {
	// The discovered endpoint refuses connections: discovery traffic moves
	// on to the static endpoint, the fake API server.
	const discovered = "127.0.0.2:1"
	for _, forbid := range []bool{false, true} {
		name := "endpointslices"
		if forbid {
			name = "endpoints fallback"
		}
		t.Run(name, func(t *testing.T) {
			api := fakeAPIServer(t, forbid, discovered)
			ca := api.Certificate()
			base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: pemOf(ca.Raw)}, BearerToken: "token"}
			var r *running
			lc := localproxy.Config{
				Endpoints:             []string{api.Listener.Addr().String()},
				DiscoveryPollInterval: 50 * time.Millisecond,
			}
			// The proxy's own address is known only once it listens: use a
			// fixed port picked now.
			port := freeLocalPort(t)
			lc.ListenAddresses = []string{"127.0.0.1:" + port}
			lc.Discovery = localproxy.DiscoveryConfig(base, "127.0.0.1:"+port, "example.com")
			r = start(t, lc)
			require.Eventually(t, func() bool { return r.Pool().Has(discovered) }, 20*time.Second, 10*time.Millisecond)
			for _, s := range r.Status().Upstreams {
				if s.Addr == discovered {
					assert.Equal(t, upstream.SourceDiscovery.String(), s.Sources)
				}
			}
		})
	}
}

// Discovery with a configuration that does not verify the API server's
// certificate would send its credentials to whoever answers on a
// discovered address: refused.
func TestDiscoveryRefusesInsecure(t *testing.T) {
	pool, err := upstream.New(upstream.Config{})
	require.NoError(t, err)
	base := &rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}, BearerToken: "token"}
	_, err = localproxy.NewDiscovery(localproxy.DiscoveryConfig(base, "127.0.0.1:7445", "kubernetes.default.svc"), pool, time.Second, logr.Discard())
	require.Error(t, err)
	for _, want := range []string{"Insecure", "insecure-skip-tls-verify", "CA"} {
		assert.ErrorContains(t, err, want)
	}
}
