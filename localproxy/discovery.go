package localproxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// The API server endpoints: the EndpointSlices (and Endpoints) of the
// kubernetes Service in default.
const (
	kubernetesNamespace = "default"
	kubernetesService   = "kubernetes"
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

// discovery keeps the pool's discovered endpoints in line with the
// kubernetes EndpointSlices (an informer: relists on 410, backs off), or
// polls the kubernetes Endpoints when listing slices is forbidden.
type discovery struct {
	client kubernetes.Interface
	pool   *upstream.Pool
	poll   time.Duration
	log    logr.Logger
}

func newDiscovery(cfg *rest.Config, pool *upstream.Pool, poll time.Duration, log logr.Logger) (*discovery, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("localproxy: discovery client: %w", err)
	}
	return &discovery{client: cs, pool: pool, poll: poll, log: log.WithName("discovery")}, nil
}

var serviceSelector = discoveryv1.LabelServiceName + "=" + kubernetesService

// run finds out whether EndpointSlices may be listed, then watches them or
// polls the Endpoints, until ctx is done.
func (d *discovery) run(ctx context.Context) {
	api := d.client.DiscoveryV1().EndpointSlices(kubernetesNamespace)
	delay := time.Second
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := api.List(ctx, metav1.ListOptions{LabelSelector: serviceSelector, Limit: 1})
		switch {
		case err == nil:
			d.watchSlices(ctx)
			return
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			d.log.Info("cannot list EndpointSlices; polling the kubernetes Endpoints instead", "err", err.Error())
			d.pollEndpoints(ctx)
			return
		case ctx.Err() != nil:
			return
		}
		d.log.V(1).Info("listing EndpointSlices failed; retrying", "err", err.Error(), "delay", delay)
		t.Reset(jitter(delay))
		delay = min(2*delay, 30*time.Second)
	}
}

// watchSlices runs an informer on the kubernetes EndpointSlices and sets
// the pool's discovered endpoints on every change.
func (d *discovery) watchSlices(ctx context.Context) {
	lw := cache.NewFilteredListWatchFromClient(d.client.DiscoveryV1().RESTClient(), "endpointslices", kubernetesNamespace,
		func(o *metav1.ListOptions) { o.LabelSelector = serviceSelector })
	var store cache.Store
	apply := func(any) {
		var specs []upstream.Spec
		for _, o := range store.List() {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				specs = append(specs, transport.SlicesToSpecs(s)...)
			}
		}
		d.set(specs)
	}
	log := d.log
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &discoveryv1.EndpointSlice{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    apply,
			UpdateFunc: func(_, o any) { apply(o) },
			DeleteFunc: apply,
		},
		Logger: &log,
	})
	ctrl.RunWithContext(ctx)
}

// pollEndpoints reads the kubernetes Endpoints every poll interval.
func (d *discovery) pollEndpoints(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ep, err := d.client.CoreV1().Endpoints(kubernetesNamespace).Get(ctx, kubernetesService, metav1.GetOptions{}) //nolint:staticcheck // node identities may get v1 Endpoints only
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.V(1).Info("reading the kubernetes Endpoints failed", "err", err.Error())
		} else {
			d.set(transport.EndpointsToSpecs(ep))
		}
		t.Reset(jitter(d.poll))
	}
}

// set replaces the discovered endpoints. Once discovery works the state
// file's endpoints are dropped: discovery knows better.
func (d *discovery) set(specs []upstream.Spec) {
	slices.SortFunc(specs, func(a, b upstream.Spec) int { return strings.Compare(a.Addr, b.Addr) })
	if err := d.pool.Set(upstream.SourceDiscovery, specs); err != nil {
		d.log.Info("ignoring invalid discovered endpoints", "err", err.Error())
	}
	if len(specs) > 0 {
		d.pool.Set(upstream.SourceStateFile, nil)
	}
	d.log.V(2).Info("discovered endpoints", "count", len(specs))
}

// jitter returns d ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
