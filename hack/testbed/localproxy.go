package testbed

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// LocalProxyConfig is the configuration of a localproxy run in the bed's
// network namespace in front of its apiservers, listening on listen (the
// bed's LocalProxy target points at Options.LocalProxyAddr) with health on
// health: probes of mode verified with the bed's CA and origin name and
// authenticated as cmd/localproxy's are, with the credentials of its
// kubeconfig (kube-apiserver closes anonymous HTTP/2 connections);
// cmd/localproxy's pool defaults (1s interval, 500ms timeout, rise and
// fall 2); discovery through the proxy as the LocalProxyIdentity; what is
// left closed at once on shutdown, so that the next proxy can bind the
// same port. Callers add a Registry and a Logger and change what they
// test.
func (b *Bed) LocalProxyConfig(listen, health string, mode endpoint.ProbeMode) (localproxy.Config, error) {
	var eps []string
	for _, s := range b.APIServers() {
		eps = append(eps, s.Addr())
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.CAPEM()) {
		return localproxy.Config{}, errors.New("testbed: the bed's CA has no certificate")
	}
	id := b.RESTConfigAs(Origin, LocalProxyIdentity)
	return localproxy.Config{
		Endpoints:       eps,
		Origin:          b.OriginName(),
		ListenAddresses: []string{listen},
		HealthAddress:   health,
		Probe:           &endpoint.ProbeConfig{Mode: mode, ServerName: b.OriginName(), RootCAs: roots, BearerToken: id.BearerToken},
		Pool:            upstream.Config{Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 2},
		Discovery:       localproxy.DiscoveryConfig(id, listen, b.OriginName()),
		ShutdownTimeout: -1,
	}, nil
}

// RunLocalProxy runs a localproxy with cfg in this process (cfg from
// LocalProxyConfig, with a Registry and a Logger) until ctx is done or
// stop is called, and returns once it is ready. stop ends it and waits.
func RunLocalProxy(ctx context.Context, cfg localproxy.Config) (p *localproxy.Proxy, stop func(), err error) {
	p, err = localproxy.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	stop = func() { cancel(); <-done }
	select {
	case <-p.Ready():
		return p, stop, nil
	case err := <-done:
		cancel()
		return nil, nil, fmt.Errorf("localproxy: %w", err)
	}
}
