package transport

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// newDiscoverer follows the EndpointSlices of the cluster cfg talks to,
// through hc (the Failover's own client).
func newDiscoverer(cfg *rest.Config, hc *http.Client, pool *upstream.Pool, poll time.Duration, log logr.Logger) (*endpoint.Discoverer, error) {
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("transport: discovery client: %w", err)
	}
	return endpoint.NewDiscoverer(cs, pool, endpoint.DiscovererOptions{PollInterval: poll, Logger: log}), nil
}

// checkInsecure refuses, for a configuration that does not verify the API
// servers' certificates (rest.Config.Insecure), the sources of endpoints
// the user did not name: discovery and Alt-Svc would send the credentials
// to whoever answers on a discovered or advertised address. Static
// endpoints stay allowed: the user named them.
func checkInsecure(cfg *rest.Config, opts Options) error {
	if !cfg.Insecure {
		return nil
	}
	const ca = "set a CA (TLSClientConfig.CAFile or CAData)"
	switch {
	case !opts.DisableDiscovery:
		return errors.New("transport: rest.Config is Insecure: EndpointSlice discovery would send the credentials to endpoints whose certificates are not verified; " +
			ca + ", or set Options.DisableDiscovery and name the API servers in Options.Endpoints")
	case opts.AltSvc != nil:
		return errors.New("transport: rest.Config is Insecure: Alt-Svc would send the credentials to alternatives whose certificates are not verified; " +
			ca + ", or leave Options.AltSvc nil")
	}
	return nil
}
