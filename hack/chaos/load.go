package chaos

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// LoadReport is what the load beyond the workloads did and found: the
// CRUD workers, the caches, the bad input, the EndpointSlice churn and
// the CPU they all took.
type LoadReport struct {
	Workers  WorkerReport   `json:"workers"`
	Caches   []CacheReport  `json:"caches"`
	BadInput BadInputReport `json:"bad_input"`
	Slices   SliceReport    `json:"endpoint_slices"`
	CPU      CPUReport      `json:"cpu"`
	// OperationIDs: objects labelled with an operation id at the end;
	// DuplicateOperationIDs: ids that label more than one.
	OperationIDs          int `json:"operation_ids"`
	DuplicateOperationIDs int `json:"duplicate_operation_ids"`
}

// clientPath is one path's client configuration.
type clientPath struct {
	cfg *rest.Config
	hc  *http.Client
}

// load is the soak's load beyond the workloads and kubectl, running.
type load struct {
	admin      kubernetes.Interface // through transport.Wrap, as the admin
	namespaces map[string]string    // the workers' namespace by path
	workers    *workerSet
	informers  []*sharedInformer
	manager    *crManager
	churn      *churn
	bad        *badInput
	cpuStart   cpuSample
	lp         *proxyHandle // for the CPU account
	report     LoadReport
	violations []string
}

// startLoad starts the workers' namespaces, the shared informers and the
// manager (each waiting for its first list), then the workers; the churn
// and the bad input start with startFaulted, when the schedule's clock
// does.
func (r *run) startLoad(ctx context.Context, f *transport.Failover, paths map[string]clientPath, log logr.Logger, suffix string) (*load, error) {
	acfg := rest.CopyConfig(f.Config())
	acfg.WarningHandler = rest.NoWarnings{} // FQDN EndpointSlices are deprecated: said at every write
	admin, err := kubernetes.NewForConfigAndClient(acfg, f.HTTPClient())
	if err != nil {
		return nil, err
	}
	l := &load{admin: admin, namespaces: map[string]string{}}
	rests := map[string]rest.Interface{}
	clients := map[string]kubernetes.Interface{}
	for _, path := range []string{pathTransport, pathLocalProxy} {
		ns := fmt.Sprintf("%s-workers-%s", path, suffix)
		if err := setupWorkerNamespace(ctx, admin, ns); err != nil {
			return nil, err
		}
		l.namespaces[path] = ns
		p := paths[path]
		if rests[path], err = coreREST(p.cfg, p.hc); err != nil {
			return nil, err
		}
		rc := rest.CopyConfig(p.cfg)
		rc.QPS, rc.Burst = -1, 0
		if clients[path], err = kubernetes.NewForConfigAndClient(rc, p.hc); err != nil {
			return nil, err
		}
	}
	l.informers, err = startSharedInformers(ctx, clients, []string{pathTransport, pathLocalProxy}, sharedInformers)
	if err != nil {
		l.stopCaches()
		return nil, err
	}
	l.manager, err = startManager(ctx, paths[pathLocalProxy].cfg, []string{l.namespaces[pathTransport], l.namespaces[pathLocalProxy]}, log.WithName("manager"))
	if err != nil {
		l.stopCaches()
		return nil, err
	}
	l.workers = startWorkers(ctx, rests, l.namespaces, workersPerPath, suffix)
	return l, nil
}

// describe is the load line's part for this load.
func (l *load) describe() string {
	return fmt.Sprintf("%d CRUD workers (%d per path), each a cycle every %s of create (generateName, an operation id), GET, update with its resourceVersion, counter GET+update, delete (1 in %d kept), about %.0f requests/s in all; %d shared informers (alternate paths) and a controller-runtime manager through localproxy on their ConfigMaps; an EndpointSlice write every %s; bad input from %.0f%% to %.0f%% of the soak: %d slowloris connections to localproxy's listen address and %d to its health address, garbage every %s, a 1 MiB request every %s",
		len(l.workers.workers), workersPerPath, workerCycle, keepEvery, float64(len(l.workers.workers))*5.75/workerCycle.Seconds(), sharedInformers,
		churnEvery, badInputFrom*100, badInputTo*100, slowlorisProxy, slowlorisHealth, garbageEvery, oversizedEvery)
}

// startFaulted starts what runs with the faults: the EndpointSlice churn
// and the bad input, and the CPU account.
func (l *load) startFaulted(ctx context.Context, r *run, f *transport.Failover, lp *proxyHandle, plan []Step) {
	l.cpuStart = takeCPU(lp)
	l.lp = lp
	l.churn = startChurn(ctx, l.admin, r.bed, []pathPool{{pathTransport, f.Pool().Status}, {pathLocalProxy, lp.poolStatus}}, plan, r.began)
	listen := strings.TrimPrefix(r.bed.RESTConfig(testbed.LocalProxy).Host, "https://")
	l.bad = startBadInput(ctx, lp, listen, r.began, r.opts.Duration, r.proberBin, r.opts.Out)
}

// finish stops the load, compares what it recorded and the caches with
// the apiservers, and returns the workers' requests by path.
func (l *load) finish(ctx context.Context) map[string]workload.Results {
	if l.bad != nil {
		var v []string
		l.report.BadInput, v = l.bad.finish(ctx)
		l.violations = append(l.violations, v...)
	}
	l.workers.stop()
	stopped := time.Now()
	if l.cpuStart.at.IsZero() {
		l.cpuStart = takeCPU(l.lp)
	}
	l.report.CPU = cpuBetween(l.cpuStart, takeCPU(l.lp), runtime.NumCPU())
	if l.churn != nil {
		var v []string
		l.report.Slices, v = l.churn.finish(ctx)
		l.violations = append(l.violations, v...)
	}
	items, err := l.truth(ctx)
	if err != nil {
		l.violations = append(l.violations, fmt.Sprintf("reading the workers' objects: %v", err))
	} else {
		var v []string
		l.report.Workers, v = checkWorkers(l.workers, items)
		l.violations = append(l.violations, v...)
		l.report.Caches, v = checkCaches(ctx, l.informers, l.manager, items, stopped)
		l.violations = append(l.violations, v...)
	}
	l.stopCaches()
	return l.workers.results()
}

// truth lists the workers' namespaces, trying for a minute: the last
// fault may just have been lifted.
func (l *load) truth(ctx context.Context) ([]corev1.ConfigMap, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var items []corev1.ConfigMap
		var err error
		for _, ns := range l.namespaces {
			var list *corev1.ConfigMapList
			if list, err = l.admin.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
				break
			}
			items = append(items, list.Items...)
		}
		if err == nil {
			return items, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-t.C:
		}
	}
}

func (l *load) stopCaches() {
	for _, si := range l.informers {
		si.stop()
	}
	l.informers = nil
	if l.manager != nil {
		if err := l.manager.stop(); err != nil {
			l.violations = append(l.violations, fmt.Sprintf("controller-runtime manager: %v", err))
		}
		l.manager = nil
	}
}

// opIDs counts the objects labelled with an operation id in the whole
// cluster (the workloads' and the workers') and the ids that label more
// than one: a logical create made twice.
func opIDs(ctx context.Context, cs kubernetes.Interface) (objects, duplicates int, err error) {
	list, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: workload.OpLabel})
	if err != nil {
		return 0, 0, fmt.Errorf("listing operation ids: %w", err)
	}
	n := map[string]int{}
	for _, cm := range list.Items {
		if n[cm.Labels[workload.OpLabel]]++; n[cm.Labels[workload.OpLabel]] == 2 {
			duplicates++
		}
	}
	return len(list.Items), duplicates, nil
}

// notMadeUp passes on the pool events but those of the EndpointSlice
// churn's made-up addresses to rec: they come and go by the hundred.
func notMadeUp(rec func(upstream.Event)) func(upstream.Event) {
	return func(ev upstream.Event) {
		if !madeUp(ev.Addr) {
			rec(ev)
		}
	}
}
