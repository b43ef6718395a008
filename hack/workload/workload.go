// Package workload is the client workload of the end-to-end suite and the
// demo: a typical controller's traffic through a client under test, with
// everything it sees recorded.
//
// Given a rest.Config and the *http.Client to use with it (from
// transport.Wrap, a localproxy kubeconfig, or anything else), Start runs:
//
//   - an informer on ConfigMaps in Config.Namespace, recording the first
//     sight of every object and every list request (a relist means the
//     watch could not resume from its resource version);
//   - a writer creating ConfigMaps Prefix-1, Prefix-2, ... one after the
//     other at Config.WriteInterval (or, with GenerateName, objects named
//     by the server), recording which creates succeeded;
//   - a GET loop reading the namespace every Config.GetInterval, each GET
//     on its own so a hung request does not stop the clock;
//   - a sampler of Config.Serving, the apiserver serving the client now.
//
// Each create is sent once (rest.Request.MaxRetries(0)), and so is each
// GET unless Config.GetRetries says otherwise: client-go by itself
// retries GETs after connection resets and EOFs and retries any verb
// answered 429 or 5xx with Retry-After (up to 10 times, for a POST too),
// which would hide the behaviour of the client under test and could
// itself create a GenerateName object twice. Client-side rate limiting is
// off, so the rates are the configured ones.
//
// Stop ends the writer and the GET loop, waits (bounded by its context)
// for the informer to see every created object, stops the informer and
// returns the Results. Events are also passed to Config.OnEvent as they
// happen, for live printing.
package workload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Labels put on every ConfigMap the writer creates.
const (
	// PrefixLabel holds Config.Prefix.
	PrefixLabel = "workload.apifailover.io/prefix"
	// SeqLabel holds the create's sequence number: one logical create, one
	// label value, so duplicates can be counted.
	SeqLabel = "workload.apifailover.io/seq"
	// OpLabel holds the create's operation id, Config.OpIDPrefix followed
	// by the sequence number, when OpIDPrefix is set: unique across every
	// workload that shares the prefix's scheme (a soak's), so that one
	// listing of every namespace tells a logical create that made two
	// objects apart from two creates.
	OpLabel = "workload.apifailover.io/op"
)

// Defaults for Config fields left zero.
const (
	DefaultPrefix          = "cm"
	DefaultWriteInterval   = 100 * time.Millisecond
	DefaultGetInterval     = 50 * time.Millisecond
	DefaultRequestTimeout  = 10 * time.Second
	DefaultMaxInFlightGets = 64
	DefaultServingInterval = 100 * time.Millisecond
)

// Config configures a workload.
type Config struct {
	// RESTConfig and HTTPClient are the client under test. Required.
	RESTConfig *rest.Config
	HTTPClient *http.Client
	// Namespace holds the ConfigMaps; Start creates it if missing.
	// Required. Use a fresh one per run so the informer starts empty.
	Namespace string
	// Prefix of the ConfigMap names (Prefix-1, Prefix-2, ...). If empty,
	// DefaultPrefix.
	Prefix string
	// GenerateName makes the writer send metadata.generateName = Prefix-
	// instead of a name: the create is not idempotent, each logical create
	// is told apart by its SeqLabel.
	GenerateName bool
	// OpIDPrefix, if set, labels every create OpLabel=OpIDPrefix+Seq. The
	// caller makes it unique among its workloads (and short enough for a
	// label value: at most 63 characters with the number). If empty, no
	// OpLabel.
	OpIDPrefix string
	// WriteInterval is the time between the starts of two creates (a slow
	// create delays the next one). If zero, DefaultWriteInterval (100ms).
	// If negative, no writer.
	WriteInterval time.Duration
	// MaxWrites bounds the creates. If zero, no bound but Stop.
	MaxWrites int
	// GetInterval is the time between two GETs. If zero,
	// DefaultGetInterval (50ms). If negative, no GET loop.
	GetInterval time.Duration
	// MaxInFlightGets bounds concurrent GETs; ticks beyond it are counted
	// in Results.SkippedGets. If zero, DefaultMaxInFlightGets (64: a 3 s stall
	// at the default rate).
	MaxInFlightGets int
	// GetRetries is how often client-go may send a GET again
	// (rest.Request.MaxRetries) after a connection error or a 429 or 5xx
	// with Retry-After, within RequestTimeout: 0 sends each GET once, as
	// a failover scenario measures; 10 is client-go's default, what
	// kubelet and controllers have. Request.Attempts counts the tries.
	GetRetries int
	// RequestTimeout bounds each create and GET. If zero,
	// DefaultRequestTimeout (10s).
	RequestTimeout time.Duration
	// Serving, if set, reports the apiserver serving the client now
	// ("host:port", "" if unknown). It is sampled every ServingInterval
	// and when each request ends, and must be cheap and safe for
	// concurrent use. See FailoverServing.
	Serving func() string
	// ServingInterval between samples of Serving. If zero,
	// DefaultServingInterval (100ms).
	ServingInterval time.Duration
	// OnEvent, if set, receives every event as it is recorded. Calls are
	// serialized and in timeline order; it must not block for long.
	OnEvent func(Event)
}

func (c *Config) setDefaults() error {
	switch {
	case c.RESTConfig == nil:
		return errors.New("workload: RESTConfig is required")
	case c.HTTPClient == nil:
		return errors.New("workload: HTTPClient is required")
	case c.Namespace == "":
		return errors.New("workload: Namespace is required")
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.WriteInterval == 0 {
		c.WriteInterval = DefaultWriteInterval
	}
	if c.GetInterval == 0 {
		c.GetInterval = DefaultGetInterval
	}
	if c.MaxInFlightGets <= 0 {
		c.MaxInFlightGets = DefaultMaxInFlightGets
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ServingInterval <= 0 {
		c.ServingInterval = DefaultServingInterval
	}
	return nil
}

// Workload is a running workload. Its methods are safe for concurrent use.
type Workload struct {
	cfg       Config
	cs        kubernetes.Interface // requests counted by kind
	rest      rest.Interface       // core/v1, for single-attempt requests
	cmPath    string               // URL path of the ConfigMap collection
	loadStop  context.CancelFunc   // stops writer, GET loop and sampler
	loadWG    sync.WaitGroup
	infStop   context.CancelFunc // stops the informer
	infWG     sync.WaitGroup
	stopOnce  sync.Once
	final     Results
	seenCh    chan struct{} // signalled (non-blocking) on every sighting
	emitMu    sync.Mutex    // serializes OnEvent; taken before mu
	mu        sync.Mutex    // guards the fields below
	res       Results
	serving   string // last answer of Config.Serving
	watchEP   string // endpoint of the informer's last list or watch
	getsInFly int
}

// Start creates the namespace, starts the informer and waits for its
// initial list (retrying for at most 2×RequestTimeout), then starts the
// writer, the GET loop and the Serving sampler. They run until Stop or
// until ctx is done; call Stop in either case to wait for them.
func Start(ctx context.Context, cfg Config) (*Workload, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	startCtx, cancelStart := context.WithTimeout(ctx, 2*cfg.RequestTimeout)
	defer cancelStart()
	w := &Workload{cfg: cfg, seenCh: make(chan struct{}, 1)}
	rc := rest.CopyConfig(cfg.RESTConfig)
	rc.QPS, rc.Burst = -1, 0
	hc := *cfg.HTTPClient
	hc.Transport = &countingRoundTripper{next: CountAttempts(cfg.HTTPClient.Transport), w: w}
	cs, err := kubernetes.NewForConfigAndClient(rc, &hc)
	if err != nil {
		return nil, fmt.Errorf("workload: client: %w", err)
	}
	w.cs = cs
	w.rest = cs.CoreV1().RESTClient()
	w.cmPath = "/api/v1/namespaces/" + cfg.Namespace + "/configmaps"

	if err := w.ensureNamespace(startCtx); err != nil {
		return nil, err
	}
	if err := w.startInformer(ctx, startCtx); err != nil {
		return nil, err
	}
	loadCtx, cancel := context.WithCancel(ctx)
	w.loadStop = cancel
	if cfg.WriteInterval > 0 {
		w.loadWG.Add(1)
		go w.writeLoop(loadCtx)
	}
	if cfg.GetInterval > 0 {
		w.loadWG.Add(1)
		go w.getLoop(loadCtx)
	}
	if cfg.Serving != nil {
		w.loadWG.Add(1)
		go w.sampleServing(loadCtx)
	}
	return w, nil
}

// ensureNamespace creates the namespace, retrying until ctx is done: the
// workload may start while the client is still finding an apiserver.
func (w *Workload) ensureNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.cfg.Namespace}}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
		_, err := w.cs.CoreV1().Namespaces().Create(rctx, ns, metav1.CreateOptions{})
		cancel()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("workload: creating namespace %s: %w", w.cfg.Namespace, err)
		case <-t.C:
		}
	}
}

// startInformer runs a ConfigMap informer in the namespace until ctx is
// done or Stop, and waits for its initial list until syncCtx is done.
func (w *Workload) startInformer(ctx, syncCtx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithNamespace(w.cfg.Namespace))
	inf := f.Core().V1().ConfigMaps().Informer()
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		w.record(Event{Kind: KindWatchError, Err: err})
	}); err != nil {
		return fmt.Errorf("workload: informer: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{AddFunc: w.onAdd}); err != nil {
		return fmt.Errorf("workload: informer: %w", err)
	}
	infCtx, cancel := context.WithCancel(ctx)
	w.infStop = cancel
	w.infWG.Add(1)
	go func() {
		defer w.infWG.Done()
		f.StartWithContext(infCtx)
		<-infCtx.Done()
		f.Shutdown()
	}()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		cancel()
		w.infWG.Wait()
		return fmt.Errorf("workload: informer did not sync: %w", context.Cause(syncCtx))
	}
	w.mu.Lock()
	w.res.Synced = time.Now()
	w.mu.Unlock()
	return nil
}

// onAdd records the first sight of a ConfigMap. Only adds matter: every
// object is created once and never changed.
func (w *Workload) onAdd(obj any, _ bool) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	seq, _ := strconv.Atoi(cm.Labels[SeqLabel])
	w.record(Event{Kind: KindSeen, Name: cm.Name, Seq: seq})
	select {
	case w.seenCh <- struct{}{}:
	default:
	}
}

// writeLoop creates one ConfigMap per WriteInterval, sequentially.
func (w *Workload) writeLoop(ctx context.Context) {
	defer w.loadWG.Done()
	t := time.NewTicker(w.cfg.WriteInterval)
	defer t.Stop()
	for seq := 1; w.cfg.MaxWrites <= 0 || seq <= w.cfg.MaxWrites; seq++ {
		w.create(ctx, seq)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *Workload) create(ctx context.Context, seq int) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			PrefixLabel: w.cfg.Prefix,
			SeqLabel:    strconv.Itoa(seq),
		}},
		Data: map[string]string{"seq": strconv.Itoa(seq)},
	}
	if w.cfg.OpIDPrefix != "" {
		cm.Labels[OpLabel] = w.cfg.OpIDPrefix + strconv.Itoa(seq)
	}
	name := fmt.Sprintf("%s-%d", w.cfg.Prefix, seq)
	if w.cfg.GenerateName {
		cm.GenerateName = w.cfg.Prefix + "-"
		name = ""
	} else {
		cm.Name = name
	}
	var ep endpointRecorder
	actx, attempts := WithAttempts(ep.trace(ctx))
	rctx, cancel := context.WithTimeout(actx, w.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	var out corev1.ConfigMap
	err := w.rest.Post().Namespace(w.cfg.Namespace).Resource("configmaps").
		Body(cm).MaxRetries(0).Do(rctx).Into(&out)
	if err == nil {
		name = out.Name
	}
	if ctx.Err() != nil && err != nil {
		return // stopped: not a failure of the client under test
	}
	w.finish(KindWrite, Request{Seq: seq, Name: name, Start: start, Endpoint: ep.get(), Attempts: attempts(), Err: err})
}

// getLoop starts one GET per GetInterval, each on its own goroutine.
func (w *Workload) getLoop(ctx context.Context) {
	defer w.loadWG.Done()
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(w.cfg.GetInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		if w.getsInFly >= w.cfg.MaxInFlightGets {
			w.res.SkippedGets++
			w.mu.Unlock()
			continue
		}
		w.getsInFly++
		w.mu.Unlock()
		wg.Add(1)
		go w.get(ctx, &wg)
	}
}

func (w *Workload) get(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	var ep endpointRecorder
	actx, attempts := WithAttempts(ep.trace(ctx))
	rctx, cancel := context.WithTimeout(actx, w.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	err := w.rest.Get().Resource("namespaces").Name(w.cfg.Namespace).MaxRetries(w.cfg.GetRetries).Do(rctx).Error()
	w.mu.Lock()
	w.getsInFly--
	w.mu.Unlock()
	if ctx.Err() != nil && err != nil {
		return // stopped
	}
	w.finish(KindGet, Request{Start: start, Endpoint: ep.get(), Attempts: attempts(), Err: err})
}

// finish records a finished request.
func (w *Workload) finish(kind Kind, r Request) {
	r.End = time.Now()
	r.Serving = w.servingNow()
	w.emitMu.Lock()
	defer w.emitMu.Unlock()
	w.mu.Lock()
	if kind == KindGet {
		w.res.Gets = append(w.res.Gets, r)
	} else {
		w.res.Writes = append(w.res.Writes, r)
	}
	ev := Event{Time: r.End, Kind: kind, Seq: r.Seq, Name: r.Name, Latency: r.End.Sub(r.Start), Serving: r.Serving, Endpoint: r.Endpoint, Err: r.Err}
	w.res.Timeline = append(w.res.Timeline, ev)
	w.mu.Unlock()
	w.deliver(ev)
}

// record adds a non-request event to the timeline.
func (w *Workload) record(ev Event) {
	ev.Time = time.Now()
	w.emitMu.Lock()
	defer w.emitMu.Unlock()
	w.mu.Lock()
	if ev.Kind != KindServing {
		ev.Serving = w.serving
	}
	switch ev.Kind {
	case KindSeen:
		w.res.Seen = append(w.res.Seen, Sighting{Name: ev.Name, Seq: ev.Seq, Time: ev.Time})
	case KindList:
		w.res.Lists++
	case KindWatch:
		w.res.Watches++
	case KindWatchError:
		w.res.WatchErrors++
	}
	w.res.Timeline = append(w.res.Timeline, ev)
	w.mu.Unlock()
	w.deliver(ev)
}

func (w *Workload) deliver(ev Event) {
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(ev)
	}
}

// servingNow asks Config.Serving, recording a change.
func (w *Workload) servingNow() string {
	if w.cfg.Serving == nil {
		return ""
	}
	s := w.cfg.Serving()
	w.mu.Lock()
	changed := s != w.serving
	w.serving = s
	w.mu.Unlock()
	if changed {
		w.record(Event{Kind: KindServing, Serving: s})
	}
	return s
}

// sampleServing samples Config.Serving every ServingInterval.
func (w *Workload) sampleServing(ctx context.Context) {
	defer w.loadWG.Done()
	t := time.NewTicker(w.cfg.ServingInterval)
	defer t.Stop()
	for {
		w.servingNow()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Snapshot returns a copy of the results so far.
func (w *Workload) Snapshot() Results {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.res.clone()
}

func (r *Results) clone() Results {
	c := *r
	c.Gets = append([]Request(nil), r.Gets...)
	c.Writes = append([]Request(nil), r.Writes...)
	c.Seen = append([]Sighting(nil), r.Seen...)
	c.Timeline = append([]Event(nil), r.Timeline...)
	return c
}

// WatchEndpoint returns the endpoint the informer's current watch (or last
// list) was sent to, "" if the client does not report it (see
// Request.Endpoint).
func (w *Workload) WatchEndpoint() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watchEP
}

// Serving returns the last answer of Config.Serving.
func (w *Workload) Serving() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.serving
}

// Stop stops the writer, the GET loop and the sampler, waits until the
// informer has seen every successfully created ConfigMap or ctx is done,
// stops the informer and returns the results. Later calls return the same
// results.
func (w *Workload) Stop(ctx context.Context) Results {
	w.stopOnce.Do(func() {
		w.loadStop()
		w.loadWG.Wait()
		w.waitSeen(ctx)
		w.infStop()
		w.infWG.Wait()
		w.final = w.Snapshot()
	})
	return w.final
}

// waitSeen waits until nothing created is missing from the sightings.
func (w *Workload) waitSeen(ctx context.Context) {
	for {
		r := w.Snapshot()
		if len(r.Lost()) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-w.seenCh:
		}
	}
}

// countingRoundTripper records the informer's list and watch requests.
type countingRoundTripper struct {
	next http.RoundTripper
	w    *Workload

	mu      sync.Mutex // guards listing
	listing bool       // the last informer request was a list
}

// RoundTrip implements http.RoundTripper.
func (c *countingRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || strings.TrimSuffix(req.URL.Path, "/") != c.w.cmPath {
		return c.next.RoundTrip(req)
	}
	q := req.URL.Query()
	list := !isTrue(q.Get("watch")) || isTrue(q.Get("sendInitialEvents"))
	c.mu.Lock()
	again := list && c.listing
	c.listing = list
	c.mu.Unlock()
	var ep endpointRecorder
	resp, err := c.next.RoundTrip(req.WithContext(ep.trace(req.Context())))
	failure := err
	if err == nil && resp.StatusCode >= 300 {
		failure = errors.New(resp.Status)
	}
	if failure == nil {
		c.w.mu.Lock()
		c.w.watchEP = ep.get()
		c.w.mu.Unlock()
	}
	switch {
	case again:
		// The same list phase: a watch-list the server did not complete
		// falling back to a LIST, or a list retried.
	case list:
		c.w.record(Event{Kind: KindList, Endpoint: ep.get(), Err: failure})
	default:
		c.w.record(Event{Kind: KindWatch, Endpoint: ep.get(), Err: failure})
	}
	return resp, err
}

// WrappedRoundTripper returns the wrapped RoundTripper.
func (c *countingRoundTripper) WrappedRoundTripper() http.RoundTripper { return c.next }

func isTrue(s string) bool { return s == "true" || s == "1" }

// endpointRecorder learns the remote address of the connection a request
// is sent on from httptrace's GotConn (the last one, if it is retried).
type endpointRecorder struct {
	mu   sync.Mutex
	addr string
}

func (r *endpointRecorder) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			r.mu.Lock()
			r.addr = info.Conn.RemoteAddr().String()
			r.mu.Unlock()
		},
	})
}

func (r *endpointRecorder) get() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}
