package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Caches that must end equal to the apiservers' truth: sharedInformers
// SharedInformerFactory informers on the workers' ConfigMaps (every
// namespace, label selector workerLabel), alternately through
// transport.Wrap and localproxy, and a controller-runtime manager through
// localproxy whose cache holds the ConfigMaps of the workers' namespaces.
const (
	sharedInformers = 5
	// cacheSettle bounds the wait for the caches to catch up with the
	// truth once the load stopped: a watch cut by the last fault may be
	// re-established only after its backoff.
	cacheSettle = 60 * time.Second
)

// snapshot is a cache's content: resourceVersion by object.
type snapshot map[types.NamespacedName]string

// sharedInformer is one SharedInformerFactory with its ConfigMap informer.
type sharedInformer struct {
	path        string
	store       cache.Store
	watchErrors atomic.Int64
	cancel      context.CancelFunc
	done        chan struct{}
}

// startSharedInformers starts n informers, the i-th through the path
// paths[i%len(paths)], and waits for their first list.
func startSharedInformers(ctx context.Context, clients map[string]kubernetes.Interface, order []string, n int) ([]*sharedInformer, error) {
	var out []*sharedInformer
	for i := range n {
		path := order[i%len(order)]
		f := informers.NewSharedInformerFactoryWithOptions(clients[path], 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = workerLabel }))
		inf := f.Core().V1().ConfigMaps().Informer()
		si := &sharedInformer{path: path, store: inf.GetStore(), done: make(chan struct{})}
		if err := inf.SetWatchErrorHandlerWithContext(func(context.Context, *cache.Reflector, error) { si.watchErrors.Add(1) }); err != nil {
			return out, err
		}
		ictx, cancel := context.WithCancel(ctx)
		si.cancel = cancel
		go func() {
			defer close(si.done)
			f.StartWithContext(ictx)
			<-ictx.Done()
			f.Shutdown()
		}()
		out = append(out, si)
		sctx, scancel := context.WithTimeout(ctx, time.Minute)
		ok := cache.WaitForCacheSync(sctx.Done(), inf.HasSynced)
		scancel()
		if !ok {
			return out, fmt.Errorf("shared informer %d (%s) did not sync", i+1, path)
		}
	}
	return out, nil
}

func (si *sharedInformer) snapshot() snapshot {
	s := snapshot{}
	for _, o := range si.store.List() {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			s[types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name}] = cm.ResourceVersion
		}
	}
	return s
}

func (si *sharedInformer) stop() {
	si.cancel()
	<-si.done
}

// manager is a controller-runtime manager with a ConfigMap reconciler.
type crManager struct {
	mgr        manager.Manager
	reconciles atomic.Int64
	mu         sync.Mutex // guards seen
	seen       map[types.NamespacedName]bool
	cancel     context.CancelFunc
	done       chan error
}

var setCRLogger sync.Once

// startManager starts a manager on cfg (its HTTP client is client-go's
// for cfg: rest.HTTPClientFor shares the transport of equal
// configurations) whose cache holds the
// ConfigMaps of namespaces, with a reconciler that counts its calls and
// the objects it was called for, and waits for its cache to sync.
func startManager(ctx context.Context, cfg *rest.Config, namespaces []string, log logr.Logger) (*crManager, error) {
	nsConfig := map[string]crcache.Config{}
	for _, ns := range namespaces {
		nsConfig[ns] = crcache.Config{}
	}
	// controller-runtime's own packages log through its global logger
	// (a watch's decoding errors, for one): into the soak's logs too.
	setCRLogger.Do(func() { ctrllog.SetLogger(log) })
	skip := true
	mgr, err := manager.New(cfg, manager.Options{
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  crcache.Options{DefaultNamespaces: nsConfig},
		Controller:             config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		return nil, err
	}
	m := &crManager{mgr: mgr, seen: map[types.NamespacedName]bool{}, done: make(chan error, 1)}
	err = ctrl.NewControllerManagedBy(mgr).Named("chaos-configmaps").For(&corev1.ConfigMap{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			m.reconciles.Add(1)
			var cm corev1.ConfigMap
			err := mgr.GetClient().Get(ctx, req.NamespacedName, &cm)
			if err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
			if err == nil {
				m.mu.Lock()
				m.seen[req.NamespacedName] = true
				m.mu.Unlock()
			}
			return reconcile.Result{}, nil
		}))
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	go func() { m.done <- mgr.Start(mctx) }()
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !mgr.GetCache().WaitForCacheSync(sctx) {
		m.stop()
		return nil, fmt.Errorf("controller-runtime cache did not sync")
	}
	return m, nil
}

func (m *crManager) snapshot(ctx context.Context) (snapshot, error) {
	var l corev1.ConfigMapList
	if err := m.mgr.GetCache().List(ctx, &l); err != nil {
		return nil, err
	}
	s := snapshot{}
	for _, cm := range l.Items {
		s[types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name}] = cm.ResourceVersion
	}
	return s, nil
}

// notReconciled counts the objects of truth the reconciler never found.
func (m *crManager) notReconciled(truth snapshot) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k := range truth {
		if !m.seen[k] {
			n++
		}
	}
	return n
}

func (m *crManager) stop() error {
	m.cancel()
	return <-m.done
}

// CacheReport is one cache compared with the truth.
type CacheReport struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Objects int    `json:"objects"`
	// Lost: objects of the truth the cache does not hold; Phantoms:
	// objects the cache holds that the truth does not (a deleted object
	// still cached); Stale: objects held at another resourceVersion.
	Lost     int `json:"lost"`
	Phantoms int `json:"phantoms"`
	Stale    int `json:"stale"`
	// Settled is how long the cache took to equal the truth after the
	// load stopped (or cacheSettle, when it never did).
	Settled     float64 `json:"settled_s"`
	WatchErrors int64   `json:"watch_errors,omitempty"`
	// Reconciles (the manager only): calls of its reconciler, and
	// objects of the truth it was never called for while they existed.
	Reconciles    int64 `json:"reconciles,omitempty"`
	NotReconciled int   `json:"not_reconciled,omitempty"`
}

// compare counts what differs between a cache and the truth.
func compare(c, truth snapshot) (lost, phantoms, stale int) {
	for k, rv := range truth {
		switch crv, ok := c[k]; {
		case !ok:
			lost++
		case crv != rv:
			stale++
		}
	}
	for k := range c {
		if _, ok := truth[k]; !ok {
			phantoms++
		}
	}
	return lost, phantoms, stale
}

// settle waits, until deadline, for get's snapshot to equal truth, and
// reports the last comparison.
func settle(ctx context.Context, name, path string, truth snapshot, began time.Time, deadline time.Time, get func() (snapshot, error)) CacheReport {
	rep := CacheReport{Name: name, Path: path, Objects: len(truth)}
	for {
		c, err := get()
		if err == nil {
			rep.Lost, rep.Phantoms, rep.Stale = compare(c, truth)
			if rep.Lost+rep.Phantoms+rep.Stale == 0 {
				rep.Settled = time.Since(began).Seconds()
				return rep
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			rep.Settled = time.Since(began).Seconds()
			return rep
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkCaches compares the shared informers and the manager with the
// truth (items: every ConfigMap of the workers' namespaces), then stops
// them. began is when the load stopped.
func checkCaches(ctx context.Context, infs []*sharedInformer, m *crManager, items []corev1.ConfigMap, began time.Time) ([]CacheReport, []string) {
	labelled, all := snapshot{}, snapshot{}
	for _, cm := range items {
		k := types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name}
		all[k] = cm.ResourceVersion
		if cm.Labels[workerLabel] != "" {
			labelled[k] = cm.ResourceVersion
		}
	}
	deadline := began.Add(cacheSettle)
	var reps []CacheReport
	var v []string
	for i, si := range infs {
		rep := settle(ctx, fmt.Sprintf("informer-%d", i+1), si.path, labelled, began, deadline, func() (snapshot, error) { return si.snapshot(), nil })
		rep.WatchErrors = si.watchErrors.Load()
		reps = append(reps, rep)
	}
	if m != nil {
		rep := settle(ctx, "controller-runtime", pathLocalProxy, all, began, deadline, func() (snapshot, error) { return m.snapshot(ctx) })
		// Every object of the truth was reconciled while it existed; the
		// queue may still be draining.
		for {
			rep.NotReconciled = m.notReconciled(all)
			if rep.NotReconciled == 0 || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		rep.Reconciles = m.reconciles.Load()
		reps = append(reps, rep)
	}
	for _, r := range reps {
		if r.Lost+r.Phantoms+r.Stale > 0 {
			v = append(v, fmt.Sprintf("%s (%s) differs from the apiservers %.0fs after the load stopped: %d lost, %d phantoms, %d stale of %d objects",
				r.Name, r.Path, r.Settled, r.Lost, r.Phantoms, r.Stale, r.Objects))
		}
		if r.NotReconciled > 0 {
			v = append(v, fmt.Sprintf("%s: %d objects of the truth never reconciled", r.Name, r.NotReconciled))
		}
	}
	slices.SortFunc(reps, func(a, b CacheReport) int { return strings.Compare(a.Name, b.Name) })
	return reps, v
}
