package localproxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// DiscoveryConfig returns a copy of base (credentials and cluster CA, e.g.
// from rest.InClusterConfig) that talks to the API server through this
// proxy: Host is https://proxyAddr and the TLS server name is serverName
// (the origin's name, which every API server certificate carries). So
// discovery never uses the Service's ClusterIP and works before the CNI.
func DiscoveryConfig(base *rest.Config, proxyAddr, serverName string) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.Host = "https://" + proxyAddr
	cfg.TLSClientConfig.ServerName = serverName
	if cfg.UserAgent == "" {
		cfg.UserAgent = "apifailover-localproxy"
	}
	return cfg
}

// ErrInsecureDiscovery: the discovery configuration does not verify the API
// server's certificate (rest.Config.Insecure, a kubeconfig's
// insecure-skip-tls-verify).
var ErrInsecureDiscovery = errors.New("localproxy: the discovery configuration is Insecure (insecure-skip-tls-verify): " +
	"discovery would send the credentials to endpoints whose certificates are not verified; " +
	"set the cluster CA (certificate-authority in the kubeconfig, or TLSClientConfig.CAFile or CAData)")

// newDiscovery returns the shared endpoint.Discoverer for the pool, with a
// client for cfg (which goes through this proxy). It refuses an Insecure
// cfg.
func newDiscovery(cfg *rest.Config, pool *upstream.Pool, poll time.Duration, log logr.Logger) (*endpoint.Discoverer, error) {
	cs, err := newClient(cfg, "discovery")
	if err != nil {
		return nil, err
	}
	return newDiscoveryWith(cs, pool, poll, log), nil
}

// newClient returns a client for cfg, which goes through this proxy, for
// what (discovery, the node's zone). It refuses an Insecure cfg.
func newClient(cfg *rest.Config, what string) (kubernetes.Interface, error) {
	if cfg.Insecure {
		return nil, ErrInsecureDiscovery
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("localproxy: %s client: %w", what, err)
	}
	return cs, nil
}

// newDiscoveryWith returns the Discoverer with client cs. Once discovery
// finds endpoints, the state file's endpoints are dropped: discovery
// knows better.
func newDiscoveryWith(cs kubernetes.Interface, pool *upstream.Pool, poll time.Duration, log logr.Logger) *endpoint.Discoverer {
	return endpoint.NewDiscoverer(cs, pool, endpoint.DiscovererOptions{
		PollInterval: poll,
		Logger:       log,
		OnUpdate: func(specs []upstream.Spec) {
			if len(specs) > 0 {
				pool.Set(upstream.SourceStateFile, nil)
			}
		},
	})
}
