package transport

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/transport/upstream"
)

// The API server endpoints: the EndpointSlices (and Endpoints) of the
// kubernetes Service in default.
const (
	kubernetesNamespace = "default"
	kubernetesService   = "kubernetes"
	serviceNameLabel    = discoveryv1.LabelServiceName + "=" + kubernetesService
)

// Discovery backoff after errors: doubling from min to max, with jitter.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// Discoverer keeps a pool's discovered endpoints in line with the
// kubernetes EndpointSlices in default, falling back to polling the
// kubernetes Endpoints when listing slices is forbidden (node identities).
// Give it a client that goes through the failover path itself (not the
// Service's ClusterIP), so that it works before the CNI does.
type Discoverer struct {
	client kubernetes.Interface
	pool   *upstream.Pool
	opts   DiscovererOptions
	log    logr.Logger
}

// DiscovererOptions configures a Discoverer.
type DiscovererOptions struct {
	// PollInterval of the Endpoints fallback. If zero,
	// DefaultDiscoveryPollInterval (10s).
	PollInterval time.Duration
	// OnUpdate, if set, is called after every update of the pool with the
	// endpoints discovered (possibly none).
	OnUpdate func([]upstream.Spec)
	// Logger receives fallbacks and failures. The zero value discards.
	Logger logr.Logger
}

// NewDiscoverer returns a Discoverer that sets pool's SourceDiscovery
// endpoints. Start it with Run.
func NewDiscoverer(client kubernetes.Interface, pool *upstream.Pool, opts DiscovererOptions) *Discoverer {
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultDiscoveryPollInterval
	}
	return &Discoverer{client: client, pool: pool, opts: opts, log: opts.Logger.WithName("discovery")}
}

func newDiscoverer(cfg *rest.Config, hc *http.Client, pool *upstream.Pool, poll time.Duration, log logr.Logger) (*Discoverer, error) {
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("transport: discovery client: %w", err)
	}
	return NewDiscoverer(cs, pool, DiscovererOptions{PollInterval: poll, Logger: log}), nil
}

// Run watches EndpointSlices until ctx is done (relisting after a 410,
// backing off with jitter after errors); when listing them is forbidden it
// polls the Endpoints object instead.
func (d *Discoverer) Run(ctx context.Context) {
	b := backoff{}
	for ctx.Err() == nil {
		err := d.watchSlices(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			d.log.V(1).Info("EndpointSlice watch expired; listing again", "err", err.Error())
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			d.log.Info("cannot list EndpointSlices; polling the kubernetes Endpoints instead", "err", err.Error())
			d.pollEndpoints(ctx)
			return
		case err != nil:
			d.log.V(1).Info("EndpointSlice watch failed", "err", err.Error())
			if !sleepCtx(ctx, b.next()) {
				return
			}
		default:
			b.reset()
		}
	}
}

// watchSlices lists the slices and follows the watch until it ends. It
// returns nil when the watch ended normally (to be resumed by a new list)
// and the error otherwise. A 410 Gone leads to a fresh list.
func (d *Discoverer) watchSlices(ctx context.Context) error {
	api := d.client.DiscoveryV1().EndpointSlices(kubernetesNamespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: serviceNameLabel})
	if err != nil {
		return err
	}
	slicesByName := make(map[string]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		slicesByName[list.Items[i].Name] = &list.Items[i]
	}
	d.apply(slicesByName)
	rv := list.ResourceVersion
	for ctx.Err() == nil {
		w, err := api.Watch(ctx, metav1.ListOptions{LabelSelector: serviceNameLabel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			return err
		}
		rv, err = d.follow(w, slicesByName, rv)
		w.Stop()
		if err != nil {
			return err
		}
	}
	return nil
}

// follow applies watch events until the watch ends. It returns the last
// resource version seen.
func (d *Discoverer) follow(w watch.Interface, slicesByName map[string]*discoveryv1.EndpointSlice, rv string) (string, error) {
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			return rv, apierrors.FromObject(ev.Object)
		case watch.Bookmark:
			if s, ok := ev.Object.(*discoveryv1.EndpointSlice); ok {
				rv = s.ResourceVersion
			}
			continue
		}
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		rv = s.ResourceVersion
		if ev.Type == watch.Deleted {
			delete(slicesByName, s.Name)
		} else {
			slicesByName[s.Name] = s
		}
		d.apply(slicesByName)
	}
	return rv, nil
}

// apply sets the pool's discovered endpoints to the ready addresses of all
// slices.
func (d *Discoverer) apply(slicesByName map[string]*discoveryv1.EndpointSlice) {
	var specs []upstream.Spec
	for _, s := range slicesByName {
		specs = append(specs, SlicesToSpecs(s)...)
	}
	d.set(specs)
}

func (d *Discoverer) set(specs []upstream.Spec) {
	slices.SortFunc(specs, func(a, b upstream.Spec) int {
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	if err := d.pool.Set(upstream.SourceDiscovery, specs); err != nil {
		d.log.Info("ignoring invalid discovered endpoints", "err", err.Error())
	}
	d.log.V(2).Info("discovered endpoints", "count", len(specs))
	if d.opts.OnUpdate != nil {
		d.opts.OnUpdate(specs)
	}
}

// SlicesToSpecs returns the ready endpoints of an EndpointSlice of the
// kubernetes Service as pool specs: every address with the slice's https
// port (or its only port), and the endpoint's zone. An endpoint whose Ready
// condition is unset counts as ready, as the API documents.
func SlicesToSpecs(s *discoveryv1.EndpointSlice) []upstream.Spec {
	port := slicePort(s.Ports)
	if port == 0 {
		return nil
	}
	var specs []upstream.Spec
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		zone := ""
		if ep.Zone != nil {
			zone = *ep.Zone
		}
		for _, a := range ep.Addresses {
			specs = append(specs, upstream.Spec{Addr: net.JoinHostPort(a, strconv.Itoa(int(port))), Zone: zone})
		}
	}
	return specs
}

func slicePort(ports []discoveryv1.EndpointPort) int32 {
	for _, p := range ports {
		if p.Name != nil && *p.Name == "https" && p.Port != nil {
			return *p.Port
		}
	}
	if len(ports) == 1 && ports[0].Port != nil {
		return *ports[0].Port
	}
	return 0
}

// pollEndpoints reads the kubernetes Endpoints object every poll interval
// (node identities may get it but not list EndpointSlices).
func (d *Discoverer) pollEndpoints(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	b := backoff{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ep, err := d.client.CoreV1().Endpoints(kubernetesNamespace).Get(ctx, kubernetesService, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.V(1).Info("reading the kubernetes Endpoints failed", "err", err.Error())
			t.Reset(max(b.next(), d.opts.PollInterval))
			continue
		}
		b.reset()
		d.set(EndpointsToSpecs(ep))
		t.Reset(jitter(d.opts.PollInterval))
	}
}

// EndpointsToSpecs returns the ready addresses of the kubernetes Endpoints
// object with its https port (or its only port).
//
//lint:ignore SA1019 node identities may get v1 Endpoints but not list EndpointSlices.
func EndpointsToSpecs(ep *corev1.Endpoints) []upstream.Spec {
	var specs []upstream.Spec
	for _, ss := range ep.Subsets {
		var port int32
		for _, p := range ss.Ports {
			if p.Name == "https" || len(ss.Ports) == 1 {
				port = p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, a := range ss.Addresses {
			specs = append(specs, upstream.Spec{Addr: net.JoinHostPort(a.IP, strconv.Itoa(int(port)))})
		}
	}
	return specs
}

// backoff doubles from minBackoff to maxBackoff, with ±20% jitter.
type backoff struct{ cur time.Duration }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = minBackoff
	} else {
		b.cur = min(2*b.cur, maxBackoff)
	}
	return jitter(b.cur)
}

func (b *backoff) reset() { b.cur = 0 }

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
