package transport_test

import (
	"context"
	"fmt"
	"log"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apifailover/apifailover/transport"
)

// The one-line use: wrap the rest.Config, build clients from the result.
func ExampleWrap() {
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", "/etc/kubernetes/admin.conf")
	if err != nil {
		log.Print(err)
		return
	}
	f, err := transport.Wrap(ctx, cfg, transport.Options{})
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
	_ = client // list, watch, informers: every request fails over
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
