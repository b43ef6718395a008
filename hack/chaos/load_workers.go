package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apifailover/apifailover/hack/workload"
)

// The CRUD workers: workersPerPath per path, each a loop of cycles, one
// cycle every workerCycle (staggered): create a ConfigMap with
// generateName, labelled with the cycle's operation id (workload.OpLabel,
// unique across the soak); GET it; update it with the resourceVersion the
// GET returned; increment its namespace's shared counter (GET, then an
// update with its resourceVersion: the workers of a path race for it, so
// conflicts happen); delete it, with its UID as precondition, unless it is
// one of every keepEvery, which stays for the informers to hold. Every
// write is sent once (MaxRetries(0)) and every GET with client-go's
// retries (getRetries), with requestTimeout, as the workloads' are. A
// conflict (409) is a correct answer: counted, not a failure.
const (
	workersPerPath = 10
	workerCycle    = 2 * time.Second
	keepEvery      = 4
	requestTimeout = 10 * time.Second
	// workerLabel marks the workers' ConfigMaps; its value is the
	// worker's id.
	workerLabel = "chaos.apifailover.io/worker"
	counterName = "chaos-counter"
)

// objState is what a worker knows of an object it created.
type objState uint8

const (
	objKept         objState = iota + 1 // kept: must exist at the end
	objDeleted                          // delete acknowledged: must not exist
	objDeleteUnsure                     // delete failed: may exist
	objInterrupted                      // the load stopped mid-cycle: may exist
)

// known is an object a worker created (acknowledged).
type known struct {
	op    string
	state objState
	// updated: an update was acknowledged, so the object must hold it.
	updated bool
}

// workerStats are what a worker recorded.
type workerStats struct {
	gets, writes []workload.Request
	objects      map[string]*known // by name
	// unsureCreates are the operation ids of failed creates: each may
	// have made an object.
	unsureCreates map[string]bool
	conflicts     int // own-object updates answered 409
	counterAcked  int // counter increments acknowledged
	counterUnsure int // counter increments failed (may have applied)
	counterConfl  int // counter increments answered 409
	readMissing   int // GETs of an acknowledged create answered 404
	readMismatch  int // GETs returning another operation's object
	deleteMissing int // deletes of an existing object answered 404
}

// worker is one CRUD loop.
type worker struct {
	id, path, ns string
	rest         rest.Interface // core/v1
	mu           sync.Mutex     // guards st
	st           workerStats
}

// workerSet is the running workers of both paths.
type workerSet struct {
	workers []*worker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// coreREST returns a core/v1 REST client on cfg and hc, without
// client-side rate limiting, counting attempts (workload.WithAttempts).
func coreREST(cfg *rest.Config, hc *http.Client) (rest.Interface, error) {
	rc := rest.CopyConfig(cfg)
	rc.QPS, rc.Burst = -1, 0
	counted := *hc
	counted.Transport = workload.CountAttempts(hc.Transport)
	cs, err := kubernetes.NewForConfigAndClient(rc, &counted)
	if err != nil {
		return nil, err
	}
	return cs.CoreV1().RESTClient(), nil
}

// setupWorkerNamespace creates ns and its counter through admin (a client
// of the bed, not under test), retrying for a while.
func setupWorkerNamespace(ctx context.Context, admin kubernetes.Interface, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: counterName},
				Data:       map[string]string{"count": "0"},
			}, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s: %w", ns, err)
		case <-t.C:
		}
	}
}

// startWorkers starts n workers on each path: paths[path] is its REST
// client, namespaces[path] its namespace.
func startWorkers(ctx context.Context, paths map[string]rest.Interface, namespaces map[string]string, n int, suffix string) *workerSet {
	ctx, cancel := context.WithCancel(ctx)
	ws := &workerSet{cancel: cancel}
	for _, path := range []string{pathTransport, pathLocalProxy} {
		for i := range n {
			w := &worker{id: fmt.Sprintf("%c%02d-%s", path[0], i+1, suffix), path: path, ns: namespaces[path], rest: paths[path],
				st: workerStats{objects: map[string]*known{}, unsureCreates: map[string]bool{}}}
			ws.workers = append(ws.workers, w)
		}
	}
	for i, w := range ws.workers {
		delay := workerCycle * time.Duration(i) / time.Duration(len(ws.workers))
		ws.wg.Go(func() { w.run(ctx, delay) })
	}
	return ws
}

// stop stops the workers and waits for them.
func (ws *workerSet) stop() {
	ws.cancel()
	ws.wg.Wait()
}

// run runs cycles until ctx is done.
func (w *worker) run(ctx context.Context, delay time.Duration) {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	tick := time.NewTicker(workerCycle)
	defer tick.Stop()
	for n := 1; ; n++ {
		w.cycle(ctx, n)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// do sends one request and records it (write: in writes, else in gets);
// a conflict is recorded as answered. It returns whether the load was
// stopped (then nothing is recorded), and the error.
func (w *worker) do(ctx context.Context, write bool, req func(context.Context) error) (bool, error) {
	actx, attempts := workload.WithAttempts(ctx)
	rctx, cancel := context.WithTimeout(actx, requestTimeout)
	defer cancel()
	rq := workload.Request{Start: time.Now()}
	err := req(rctx)
	rq.End, rq.Attempts = time.Now(), attempts()
	if err != nil && ctx.Err() != nil {
		return true, err
	}
	if err != nil && !apierrors.IsConflict(err) {
		rq.Err = err
	}
	w.mu.Lock()
	if write {
		w.st.writes = append(w.st.writes, rq)
	} else {
		w.st.gets = append(w.st.gets, rq)
	}
	w.mu.Unlock()
	return false, err
}

// cycle is one create, get, update, counter increment and delete.
func (w *worker) cycle(ctx context.Context, n int) {
	op := w.id + "-" + strconv.Itoa(n)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "w-", Labels: map[string]string{workerLabel: w.id, workload.OpLabel: op}},
		Data:       map[string]string{"op": op, "state": "created"},
	}
	var out corev1.ConfigMap
	stopped, err := w.do(ctx, true, func(ctx context.Context) error {
		return w.rest.Post().Namespace(w.ns).Resource("configmaps").Body(cm).MaxRetries(0).Do(ctx).Into(&out)
	})
	if err != nil {
		w.mu.Lock()
		w.st.unsureCreates[op] = true // stopped or failed: it may exist
		w.mu.Unlock()
		return
	}
	name, uid := out.Name, out.UID
	k := &known{op: op, state: objInterrupted}
	w.mu.Lock()
	w.st.objects[name] = k
	w.mu.Unlock()
	if stopped {
		return
	}

	// Read it back: an acknowledged create must be there.
	var got corev1.ConfigMap
	stopped, err = w.do(ctx, false, func(ctx context.Context) error {
		return w.rest.Get().Namespace(w.ns).Resource("configmaps").Name(name).MaxRetries(getRetries).Do(ctx).Into(&got)
	})
	if stopped {
		return
	}
	rv := out.ResourceVersion
	switch {
	case apierrors.IsNotFound(err):
		w.count(&w.st.readMissing)
	case err == nil && got.Data["op"] != op:
		w.count(&w.st.readMismatch)
	case err == nil:
		rv = got.ResourceVersion
	}

	// Update it with that resourceVersion.
	upd := out.DeepCopy()
	upd.ResourceVersion = rv
	upd.Data["state"] = "updated"
	stopped, err = w.do(ctx, true, func(ctx context.Context) error {
		return w.rest.Put().Namespace(w.ns).Resource("configmaps").Name(name).Body(upd).MaxRetries(0).Do(ctx).Error()
	})
	if stopped {
		return
	}
	switch {
	case err == nil:
		k.updated = true // only this goroutine writes k
	case apierrors.IsConflict(err):
		w.count(&w.st.conflicts)
	}

	if w.incrementCounter(ctx) {
		return
	}

	if n%keepEvery == 0 {
		k.state = objKept
		return
	}
	stopped, err = w.do(ctx, true, func(ctx context.Context) error {
		return w.rest.Delete().Namespace(w.ns).Resource("configmaps").Name(name).
			Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}).MaxRetries(0).Do(ctx).Error()
	})
	switch {
	case stopped:
	case err == nil:
		k.state = objDeleted
	case apierrors.IsNotFound(err):
		w.count(&w.st.deleteMissing)
		k.state = objDeleteUnsure
	default:
		k.state = objDeleteUnsure
	}
}

// incrementCounter adds one to the namespace's counter: a GET and an
// update with its resourceVersion. It reports whether the load stopped.
func (w *worker) incrementCounter(ctx context.Context) bool {
	var c corev1.ConfigMap
	stopped, err := w.do(ctx, false, func(ctx context.Context) error {
		return w.rest.Get().Namespace(w.ns).Resource("configmaps").Name(counterName).MaxRetries(getRetries).Do(ctx).Into(&c)
	})
	if stopped || err != nil {
		return stopped
	}
	v, _ := strconv.Atoi(c.Data["count"])
	c.Data["count"] = strconv.Itoa(v + 1)
	stopped, err = w.do(ctx, true, func(ctx context.Context) error {
		return w.rest.Put().Namespace(w.ns).Resource("configmaps").Name(counterName).Body(&c).MaxRetries(0).Do(ctx).Error()
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case stopped:
		w.st.counterUnsure++ // cancelled: it may have applied
	case err == nil:
		w.st.counterAcked++
	case apierrors.IsConflict(err):
		w.st.counterConfl++
	default:
		w.st.counterUnsure++
	}
	return stopped
}

func (w *worker) count(n *int) {
	w.mu.Lock()
	*n++
	w.mu.Unlock()
}

// WorkerReport is what the CRUD workers did and what the apiservers hold
// of it at the end.
type WorkerReport struct {
	Workers int `json:"workers"`
	// CycleSeconds is each worker's period.
	CycleSeconds float64 `json:"cycle_s"`
	// Requests by path (GETs, creates, updates, deletes, counter).
	Requests map[string]int `json:"requests_by_path"`
	Creates  int            `json:"creates_acked"`
	// CreatesUnsure: failed creates (each may have made an object), and
	// how many of them did (found at the end).
	CreatesUnsure       int `json:"creates_unsure"`
	CreatesUnsureLanded int `json:"creates_unsure_landed"`
	Kept                int `json:"kept"`
	Deleted             int `json:"deletes_acked"`
	// Conflicts: updates of a worker's own object answered 409 (none is
	// expected: nobody else writes it), and counter increments answered
	// 409 (the workers race for the counter).
	Conflicts        int `json:"conflicts"`
	CounterConflicts int `json:"counter_conflicts"`
	// CounterAcked, CounterUnsure and CounterFinal: acknowledged and
	// failed increments and the counters' final sum, which must lie in
	// [acked, acked+unsure].
	CounterAcked  int `json:"counter_acked"`
	CounterUnsure int `json:"counter_unsure"`
	CounterFinal  int `json:"counter_final"`
	// Violations of the model, each a failed invariant:
	// ReadMissing: GETs of an acknowledged create answered 404.
	ReadMissing int `json:"read_missing"`
	// ReadMismatch: GETs returning another operation's data.
	ReadMismatch int `json:"read_mismatch"`
	// DeleteMissing: deletes of an object answered 404 (nobody else
	// deletes it).
	DeleteMissing int `json:"delete_missing"`
	// AckedMissing: kept objects the apiservers do not have.
	AckedMissing int `json:"acked_missing"`
	// LostUpdates: kept objects without their acknowledged update.
	LostUpdates int `json:"lost_updates"`
	// Resurrected: objects whose delete was acknowledged, still there.
	Resurrected int `json:"resurrected"`
	// ResurrectedObjects names them: namespace/name (operation).
	ResurrectedObjects []string `json:"resurrected_objects,omitempty"`
	// Duplicates: objects of an acknowledged create's operation id other
	// than the one the create returned (the create was made twice).
	Duplicates int `json:"duplicates"`
	// Unexplained: objects no create of a worker accounts for.
	Unexplained int `json:"unexplained_objects"`
}

// checkWorkers compares what the workers recorded with the truth: the
// workers' objects and counters (items: every ConfigMap of the workers'
// namespaces).
func checkWorkers(ws *workerSet, items []corev1.ConfigMap) (WorkerReport, []string) {
	rep := WorkerReport{Workers: len(ws.workers), CycleSeconds: workerCycle.Seconds(), Requests: map[string]int{}}
	truth := map[types.NamespacedName]*corev1.ConfigMap{}
	byOp := map[string][]string{} // op -> names
	for i := range items {
		cm := &items[i]
		if cm.Name == counterName {
			v, _ := strconv.Atoi(cm.Data["count"])
			rep.CounterFinal += v
			continue
		}
		if cm.Labels[workerLabel] == "" {
			continue
		}
		truth[types.NamespacedName{Namespace: cm.Namespace, Name: cm.Name}] = cm
		op := cm.Labels[workload.OpLabel]
		byOp[op] = append(byOp[op], cm.Name)
	}
	explained := map[types.NamespacedName]bool{}
	for _, w := range ws.workers {
		w.mu.Lock()
		st := w.st
		rep.Requests[w.path] += len(st.gets) + len(st.writes)
		rep.Conflicts += st.conflicts
		rep.CounterAcked += st.counterAcked
		rep.CounterUnsure += st.counterUnsure
		rep.CounterConflicts += st.counterConfl
		rep.ReadMissing += st.readMissing
		rep.ReadMismatch += st.readMismatch
		rep.DeleteMissing += st.deleteMissing
		rep.CreatesUnsure += len(st.unsureCreates)
		for op := range st.unsureCreates {
			for _, n := range byOp[op] {
				rep.CreatesUnsureLanded++
				explained[types.NamespacedName{Namespace: w.ns, Name: n}] = true
			}
		}
		for name, k := range st.objects {
			rep.Creates++
			key := types.NamespacedName{Namespace: w.ns, Name: name}
			cm, exists := truth[key]
			explained[key] = true
			for _, other := range byOp[k.op] {
				if other != name {
					rep.Duplicates++
					explained[types.NamespacedName{Namespace: w.ns, Name: other}] = true
				}
			}
			switch k.state {
			case objKept:
				rep.Kept++
				switch {
				case !exists:
					rep.AckedMissing++
				case k.updated && cm.Data["state"] != "updated":
					rep.LostUpdates++
				}
			case objDeleted:
				rep.Deleted++
				// The apiservers may give a generated name again once
				// its object is gone: only this create's object counts.
				if exists && cm.Labels[workload.OpLabel] == k.op {
					rep.Resurrected++
					rep.ResurrectedObjects = append(rep.ResurrectedObjects, fmt.Sprintf("%s (%s)", key, k.op))
				}
			}
		}
		w.mu.Unlock()
	}
	for key := range truth {
		if !explained[key] {
			rep.Unexplained++
		}
	}
	var v []string
	add := func(n int, format string) {
		if n > 0 {
			v = append(v, fmt.Sprintf(format, n))
		}
	}
	add(rep.ReadMissing, "workers: %d acknowledged creates answered 404 to the GET that followed")
	add(rep.ReadMismatch, "workers: %d GETs returned another operation's object")
	add(rep.DeleteMissing, "workers: %d deletes of an acknowledged object answered 404")
	add(rep.AckedMissing, "workers: %d acknowledged creates (kept) missing from the apiservers")
	add(rep.LostUpdates, "workers: %d acknowledged updates lost")
	if rep.Resurrected > 0 {
		v = append(v, fmt.Sprintf("workers: %d objects still there after their delete was acknowledged: %s", rep.Resurrected, strings.Join(rep.ResurrectedObjects, ", ")))
	}
	add(rep.Duplicates, "workers: %d objects made twice by one logical create")
	add(rep.Unexplained, "workers: %d objects no worker's create accounts for")
	add(rep.Conflicts, "workers: %d updates of a worker's own object answered 409 (nobody else writes it)")
	if rep.CounterFinal < rep.CounterAcked || rep.CounterFinal > rep.CounterAcked+rep.CounterUnsure {
		v = append(v, fmt.Sprintf("workers: the counters hold %d increments, want %d acknowledged to %d with the failed ones",
			rep.CounterFinal, rep.CounterAcked, rep.CounterAcked+rep.CounterUnsure))
	}
	return rep, v
}

// results returns the workers' requests as workload results by path, for
// the success ratios, the failure classes and the timeline.
func (ws *workerSet) results() map[string]workload.Results {
	out := map[string]workload.Results{}
	for _, w := range ws.workers {
		w.mu.Lock()
		r := out[w.path]
		r.Gets = append(r.Gets, w.st.gets...)
		r.Writes = append(r.Writes, w.st.writes...)
		out[w.path] = r
		w.mu.Unlock()
	}
	return out
}
