package endpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

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

// DefaultDiscoveryPollInterval is how often the Endpoints fallback is
// read while listing EndpointSlices is forbidden.
const DefaultDiscoveryPollInterval = 10 * time.Second

// DefaultSliceRetryInterval is how long the Endpoints fallback is polled
// before listing EndpointSlices is tried again.
const DefaultSliceRetryInterval = 5 * time.Minute

// Discoverer keeps a pool's discovered endpoints in line with the
// kubernetes EndpointSlices in default, falling back to polling the
// kubernetes Endpoints when listing slices is forbidden (node identities)
// and trying slices again every few minutes. An update that leaves no ready
// endpoint at all keeps the last good set: an API server that answers has
// just served the update, so an empty list is a glitch (a slice recreated,
// every endpoint briefly not ready), not the truth. A smaller set applies.
// Give it a client that goes through the failover path itself (not the
// Service's ClusterIP), so that it works before the CNI does.
type Discoverer struct {
	client kubernetes.Interface
	pool   *upstream.Pool
	opts   DiscovererOptions
	log    logr.Logger

	last []upstream.Spec // the last non-empty set applied; used by Run only
}

// DiscovererOptions configures a Discoverer.
type DiscovererOptions struct {
	// PollInterval of the Endpoints fallback. If zero,
	// DefaultDiscoveryPollInterval (10s).
	PollInterval time.Duration
	// SliceRetryInterval is how long the Endpoints fallback is used before
	// listing EndpointSlices is tried again, so that an RBAC change takes
	// effect without a restart. If zero, DefaultSliceRetryInterval (5m).
	// Jittered by ±20%.
	SliceRetryInterval time.Duration
	// OnUpdate, if set, is called after every update of the pool with the
	// endpoints discovered (never none: an empty set keeps the last good
	// one and is not an update).
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
	if opts.SliceRetryInterval <= 0 {
		opts.SliceRetryInterval = DefaultSliceRetryInterval
	}
	return &Discoverer{client: client, pool: pool, opts: opts, log: opts.Logger.WithName("discovery")}
}

// Run watches EndpointSlices until ctx is done (relisting after a 410,
// backing off with jitter after errors); when listing them is forbidden it
// polls the Endpoints object instead, for SliceRetryInterval at a time,
// or, when listing them worked before, for a backoff from a second up to
// SliceRetryInterval.
func (d *Discoverer) Run(ctx context.Context) {
	b := Backoff{Min: minBackoff, Max: maxBackoff}
	fallback := false // whether the last list of slices was forbidden
	// worked: listing slices worked before. A 403 then is likely an
	// apiserver that has just started and is not authorizing yet (or an
	// RBAC change): slices are tried again after forbidden's backoff,
	// seconds at first, SliceRetryInterval once it has lasted.
	worked := false
	forbidden := Backoff{Min: minBackoff, Max: d.opts.SliceRetryInterval}
	for ctx.Err() == nil {
		err := d.watchSlices(ctx, func() {
			worked = true
			forbidden.Reset()
			if fallback {
				d.log.Info("listing EndpointSlices works again; watching them instead of polling the kubernetes Endpoints")
				fallback = false
			}
		}, b.Reset)
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			d.log.V(1).Info("EndpointSlice watch expired; listing again", "err", err.Error())
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			retry := Jitter(d.opts.SliceRetryInterval)
			if worked {
				retry = forbidden.Next()
			}
			if !fallback {
				d.log.Info("cannot list EndpointSlices; polling the kubernetes Endpoints instead", "err", err.Error(), "retrySlicesIn", retry)
			} else {
				d.log.V(1).Info("still cannot list EndpointSlices", "err", err.Error(), "retrySlicesIn", retry)
			}
			fallback = true
			d.pollEndpoints(ctx, retry)
		case err != nil:
			d.log.V(1).Info("EndpointSlice watch failed", "err", err.Error())
			if !sleepCtx(ctx, b.Next()) {
				return
			}
		}
	}
}

// healthyWatch is how long an EndpointSlice watch must last for
// discovery to count it as working: its end, or its error, then waits
// the shortest backoff again. A watch that ends without an error before
// shortWatch (a server, or something between, that closes watches at
// once) is an error (errShortWatch): the next list waits its backoff,
// where watching again at once would loop as fast as the watches end. A
// client whose rest.Config.Timeout ends every watch after a few seconds
// watches again at once, as before.
const (
	healthyWatch = 10 * time.Second
	shortWatch   = time.Second
)

// errShortWatch is a watch that ended, without an error, before
// shortWatch.
var errShortWatch = errors.New("the watch ended at once")

// watchSlices lists the slices and follows watches from there until one
// fails, or ends without an error before shortWatch (errShortWatch),
// or ctx is done. It calls listed after a successful list, and healthy
// after each watch that lasted healthyWatch. A 410 Gone leads to a fresh
// list.
func (d *Discoverer) watchSlices(ctx context.Context, listed, healthy func()) error {
	api := d.client.DiscoveryV1().EndpointSlices(kubernetesNamespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: serviceNameLabel})
	if err != nil {
		return err
	}
	listed()
	slicesByName := make(map[string]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		slicesByName[list.Items[i].Name] = &list.Items[i]
	}
	d.apply(slicesByName)
	rv := list.ResourceVersion
	for ctx.Err() == nil {
		began := time.Now()
		w, err := api.Watch(ctx, metav1.ListOptions{LabelSelector: serviceNameLabel, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			return err
		}
		rv, err = d.follow(ctx, w, slicesByName, rv)
		w.Stop()
		lasted := time.Since(began)
		if lasted >= healthyWatch {
			healthy()
		}
		switch {
		case err != nil:
			return err
		case lasted < shortWatch && ctx.Err() == nil:
			return fmt.Errorf("EndpointSlice watch: %w after %s", errShortWatch, lasted.Round(time.Millisecond))
		}
	}
	return ctx.Err()
}

// follow applies watch events until the watch or ctx ends. It returns the
// last resource version seen.
func (d *Discoverer) follow(ctx context.Context, w watch.Interface, slicesByName map[string]*discoveryv1.EndpointSlice, rv string) (string, error) {
	for {
		var ev watch.Event
		select {
		case <-ctx.Done():
			return rv, ctx.Err()
		case e, ok := <-w.ResultChan():
			if !ok {
				return rv, nil
			}
			ev = e
		}
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
}

// MaxDiscoveredEndpoints bounds the endpoints discovery gives the pool:
// a control plane has a handful of API servers, and whoever may write
// EndpointSlices in default can add a slice labelled for the kubernetes
// Service with a thousand addresses, each of which the pool would probe.
// Beyond it, the addresses of the slice the API servers write themselves
// (named kubernetes) come first, then the other slices' by name.
const MaxDiscoveredEndpoints = 64

// apply sets the pool's discovered endpoints to the ready addresses of all
// slices: the kubernetes slice's first (see MaxDiscoveredEndpoints).
func (d *Discoverer) apply(slicesByName map[string]*discoveryv1.EndpointSlice) {
	names := slices.Sorted(maps.Keys(slicesByName))
	if i := slices.Index(names, "kubernetes"); i > 0 {
		names = slices.Insert(slices.Delete(names, i, i+1), 0, "kubernetes")
	}
	var specs []upstream.Spec
	for _, n := range names {
		specs = append(specs, SlicesToSpecs(slicesByName[n])...)
	}
	d.set(specs, "EndpointSlices")
}

// set sets the pool's discovered endpoints to the valid ones of specs
// (upstream.ParseAddr, discoverable),
// each address once (the first with a zone gives it), at most
// MaxDiscoveredEndpoints of them in the order given, unless there are
// none: then the last good set stays.
func (d *Discoverer) set(specs []upstream.Spec, from string) {
	valid := make([]upstream.Spec, 0, min(len(specs), MaxDiscoveredEndpoints))
	seen := make(map[string]int, len(specs))
	var invalid []error
	dropped := 0
	for _, s := range specs {
		addr, err := upstream.ParseAddr(s.Addr)
		if err == nil {
			err = discoverable(addr)
		}
		if err != nil {
			invalid = append(invalid, err)
			continue
		}
		s.Addr = addr
		if i, ok := seen[addr]; ok {
			if valid[i].Zone == "" {
				valid[i].Zone = s.Zone
			}
			continue
		}
		if len(valid) == MaxDiscoveredEndpoints {
			dropped++
			continue
		}
		seen[addr] = len(valid)
		valid = append(valid, s)
	}
	if len(invalid) > 0 {
		d.log.Info("ignoring invalid discovered endpoints", "from", from, "err", errors.Join(invalid...).Error())
	}
	if dropped > 0 {
		d.log.Info("too many discovered endpoints: the others are ignored", "from", from, "max", MaxDiscoveredEndpoints, "ignored", dropped)
	}
	if len(valid) == 0 {
		if len(d.last) > 0 {
			d.log.Info("no ready API server endpoint discovered; keeping the last good set", "from", from, "kept", specAddrs(d.last))
		}
		return
	}
	slices.SortFunc(valid, func(a, b upstream.Spec) int { return strings.Compare(a.Addr, b.Addr) })
	d.pool.Set(upstream.SourceDiscovery, valid) // valid: cannot fail
	d.last = valid
	d.log.V(2).Info("discovered endpoints", "from", from, "count", len(valid))
	if d.opts.OnUpdate != nil {
		d.opts.OnUpdate(valid)
	}
}

// discoverable refuses a discovered address (normalized by
// upstream.ParseAddr) that the API server's endpoint reconciler never
// writes: a host name, or an IP address that is unspecified, link-local
// or multicast, which Kubernetes refuses in Endpoints and in IPv4 and
// IPv6 EndpointSlices (loopback too, but unit tests' servers listen
// there). Slices of host names (FQDN) are skipped whole (SlicesToSpecs):
// anyone allowed to write EndpointSlices in default can label one as the
// kubernetes Service's, and one listing localhost, or 127.0.0.1, on the
// node-local proxy's port would have the proxy connect to itself for
// every client connection.
func discoverable(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%s: a host name; want an IP address, as API servers list themselves", addr)
	}
	if ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
		return fmt.Errorf("%s: an unspecified, link-local or multicast address; want an API server's own address, as API servers list themselves", addr)
	}
	return nil
}

func specAddrs(specs []upstream.Spec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Addr
	}
	return out
}

// SlicesToSpecs returns the ready endpoints of an EndpointSlice of the
// kubernetes Service as pool specs: every address with the slice's https
// port (or its only port), and the endpoint's zone. An endpoint whose Ready
// condition is unset counts as ready, as the API documents. A slice of
// host names (FQDN), which API servers never write, gives none
// (discoverable).
func SlicesToSpecs(s *discoveryv1.EndpointSlice) []upstream.Spec {
	port := slicePort(s.Ports)
	if port == 0 || s.AddressType == discoveryv1.AddressTypeFQDN {
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
// (node identities may get it but not list EndpointSlices) until ctx is
// done or the time given has passed.
func (d *Discoverer) pollEndpoints(ctx context.Context, until time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	end := time.NewTimer(until)
	defer end.Stop()
	b := Backoff{Min: minBackoff, Max: maxBackoff}
	for {
		select {
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-t.C:
		}
		ep, err := d.client.CoreV1().Endpoints(kubernetesNamespace).Get(ctx, kubernetesService, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.V(1).Info("reading the kubernetes Endpoints failed", "err", err.Error())
			t.Reset(max(b.Next(), d.opts.PollInterval))
			continue
		}
		b.Reset()
		d.set(EndpointsToSpecs(ep), "Endpoints")
		t.Reset(Jitter(d.opts.PollInterval))
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
