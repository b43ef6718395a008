package transport_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport"
)

// The one-line use: wrap the rest.Config, build clients from the result.
// A stand-in API server (httptest, HTTP/2 over TLS) plays the cluster here;
// with a real one, cfg comes from a kubeconfig or rest.InClusterConfig.
func ExampleWrap() {
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			fmt.Fprint(w, "ok")
		case "/api/v1/namespaces/default":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"default"}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	api.EnableHTTP2 = true
	api.StartTLS()
	defer api.Close()
	cfg := &rest.Config{
		Host:            api.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})},
	}

	ctx := context.Background()
	f, err := transport.Wrap(ctx, cfg, transport.Options{
		DisableDiscovery: true, // the stand-in has no EndpointSlices
	})
	if err != nil {
		log.Print(err)
		return
	}
	defer f.Close()
	client, err := kubernetes.NewForConfigAndClient(f.Config(), f.HTTPClient())
	if err != nil {
		log.Print(err)
		return
	}
	// List, watch, informers: every request fails over between servers.
	ns, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(ns.Name)
	// Output: default
}

// Wrap needs https and validates the extra endpoints.
func ExampleWrap_badEndpoint() {
	_, err := transport.Wrap(context.Background(), cfgFor("https://10.0.0.1:6443"), transport.Options{
		Endpoints:        []string{"10.0.0.2:6443", "10.0.0.3"},
		DisableDiscovery: true,
	})
	fmt.Println(err)
	// Output:
	// transport: Options.Endpoints: invalid endpoint "10.0.0.3": missing port in address (want host:port with an IPv4 address, a bracketed IPv6 address or a DNS name, and a port 1-65535)
}

func cfgFor(host string) *rest.Config { return &rest.Config{Host: host} }
