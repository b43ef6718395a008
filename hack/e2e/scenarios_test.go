package e2e_test

import (
	"context"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport/endpoint"
)

// resume measures how the client came back after a fault at t0 and
// records it: the first successful GET and create sent after t0, the first
// such create seen by the informer, and the longest time without a
// successful GET. With budget > 0 the GET and informer times must be
// within it. It returns the GET resume time.
func (e *env) resume(r workload.Results, t0 time.Time, budget time.Duration) time.Duration {
	e.t.Helper()
	get, ok := r.FirstGetOK(t0)
	if !ok {
		e.t.Errorf("no GET sent after the fault succeeded")
		return 0
	}
	getResume := get.Sub(t0)
	e.row.FailoverSeconds = e.seconds("get_resume", getResume)
	for _, g := range r.Gets {
		if g.End.Equal(get) && g.Endpoint != "" {
			e.t.Logf("first GET sent after the fault answered via %s", g.Endpoint)
		}
	}
	if w, ok := r.FirstWriteOK(t0); ok {
		e.seconds("write_resume", w.Sub(t0))
	}
	seen, ok := r.FirstSeenWrite(t0)
	if !ok {
		e.t.Errorf("the informer saw no object created after the fault")
	} else {
		e.seconds("informer_resume", seen.Sub(t0))
	}
	e.seconds("longest_get_gap", r.LongestGetGap(t0, get.Add(afterResume)))
	if budget > 0 {
		if getResume > budget {
			e.t.Errorf("GETs resumed %s after the fault, budget %s", getResume.Round(time.Millisecond), budget)
		}
		if ok && seen.Sub(t0) > budget {
			e.t.Errorf("the informer saw a fresh write %s after the fault, budget %s", seen.Sub(t0).Round(time.Millisecond), budget)
		}
	}
	return getResume
}

// inject applies a fault and returns when it is in place: requests sent
// later cannot reach the faulted apiserver (a blackhole takes some 100 ms
// of iptables runs). Times are measured from there.
func (e *env) inject(what string, fault func() error) time.Time {
	e.t.Helper()
	began := time.Now()
	if err := fault(); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	t0 := time.Now()
	e.t.Logf("%s: in place after %s", what, t0.Sub(began).Round(time.Millisecond))
	if e.faultAt.IsZero() {
		e.faultAt = t0
	}
	return t0
}

// detect polls until the client no longer counts addr healthy (or it left
// the client's endpoints) and records how long that took after t0.
func (e *env) detect(addr string, t0 time.Time) time.Duration {
	e.t.Helper()
	err := e.waitFor("client marks "+addr+" down", observeLimit, func() bool {
		return e.c.Endpoints()[addr] != "healthy"
	})
	if err != nil {
		e.t.Error(err)
		return 0
	}
	d := time.Since(t0)
	e.seconds("detection", d)
	return d
}

// movedAway checks that the client's traffic and the informer's watch
// left s.
func (e *env) movedAway(w *workload.Workload, s *testbed.APIServer) {
	e.t.Helper()
	if got := e.c.Serving(); got == s.Addr() || got == "" {
		e.t.Errorf("client still served by %q after the fault on %s", got, s.Addr())
	}
	if got := w.WatchEndpoint(); got == s.Addr() {
		e.t.Errorf("the informer's watch is still on %s", s.Addr())
	}
}

// faultServing runs the common shape of S1-S3: load, fault the serving
// apiserver, wait for the client to resume elsewhere, stop, assert.
func faultServing(e *env, fault func(*testbed.APIServer) error, budget time.Duration) (*testbed.APIServer, workload.Results, time.Time) {
	w := e.startLoad(workload.Config{})
	e.waitSteady(w)
	s := e.serving(w)
	t0 := e.inject("fault on "+s.Addr()+" (serving)", func() error { return fault(s) })
	if d := e.detect(s.Addr(), t0); e.probe == endpoint.ProbeHeld && d > heldDetectBudget {
		e.t.Errorf("%s marked down %s after the fault, budget with held probes %s", s.Addr(), d.Round(time.Millisecond), heldDetectBudget)
	}
	e.waitResumed(w, t0)
	e.movedAway(w, s)
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.resume(r, t0, budget)
	if n := r.ListsSince(t0); n > 0 {
		e.t.Errorf("the informer relisted %d times: its watch should have resumed from its resource version", n)
	}
	return s, r, t0
}

// S1: SIGKILL of the apiserver serving the informer's watch. The watch
// resumes elsewhere without a relist, every created object reaches the
// informer, GETs go on.
func s1Kill(e *env) {
	_, r, t0 := faultServing(e, (*testbed.APIServer).Kill, resumeBudget)
	if get, ok := r.FirstGetOK(t0); ok && e.c.KillBudget > 0 && get.Sub(t0) > e.c.KillBudget {
		e.t.Errorf("GETs resumed %s after the kill, budget %s for this path", get.Sub(t0).Round(time.Millisecond), e.c.KillBudget)
	}
}

// S2: the serving apiserver is blackholed. Dead connections must be
// noticed (HTTP/2 pings, probes) and requests and the watch resume
// elsewhere within resumeBudget, without a relist; no event is lost.
func s2Blackhole(e *env) {
	faultServing(e, (*testbed.APIServer).Blackhole, resumeBudget)
}

// S3: the serving apiserver is SIGSTOPped: TCP still accepts, nothing
// answers. As S2. On an L4 path a client that opens a new connection per
// request runs beside the load: new connections must stop going to the
// hung server (a connection left waiting for its first byte, silence)
// before its probes mark it down.
func s3Hang(e *env) {
	var nc *newConnLoad
	var events *eventLog
	if e.c.ClientConns != nil {
		events = e.recordEvents()
		nc = e.startNewConnLoad()
	}
	s, _, t0 := faultServing(e, (*testbed.APIServer).Hang, resumeBudget)
	if nc != nil {
		e.checkAvoided(nc, events, s.Addr(), t0)
	}
}

// S4: the serving apiserver shuts down gracefully (SIGTERM, /readyz fails,
// keeps serving for the shutdown delay, exits). Nothing may fail and the
// informer must not relist. A client whose /readyz interval is shorter
// than the delay sends new requests elsewhere at once; with a longer one
// (S4b, the default against the bed's 2s delay) they move on the server's
// GOAWAY when the delay ends.
func s4Graceful(e *env) {
	w := e.startLoad(workload.Config{})
	e.waitSteady(w)
	s := e.serving(w)
	t0 := e.inject("SIGTERM to "+s.Addr()+" (serving)", s.Terminate)
	e.detect(s.Addr(), t0)
	e.waitResumed(w, t0)
	// New requests move at once; the connections already on the server,
	// the informer's watch among them, are drained: the server keeps
	// serving them until it exits, so they move then.
	if got := e.c.Serving(); e.readyzInterval > 0 && e.readyzInterval < 2*time.Second /* the bed's shutdown delay */ && got == s.Addr() {
		e.t.Errorf("client still served by %q after SIGTERM to %s", got, s.Addr())
	}
	wctx, cancel := context.WithTimeout(e.ctx, observeLimit)
	err := s.Wait(wctx)
	cancel()
	if err != nil {
		e.t.Fatalf("waiting for %s to exit: %v", s.Name(), err)
	}
	e.seconds("apiserver_exit", time.Since(t0))
	e.movedAway(w, s)
	e.sleep(afterResume)
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.resume(r, t0, 0)
	failedGets, failedWrites := r.FailedGets(), r.FailedWrites()
	if e.c.ShutdownRefusalsReachClient {
		rg, rw := shutdownRefusals(r.Gets), shutdownRefusals(r.Writes)
		e.figure("shutdown_refusals", float64(rg+rw), "")
		failedGets -= rg
		failedWrites -= rw
	}
	if failedGets > 0 {
		e.t.Errorf("%d GETs failed during a graceful shutdown, want 0", failedGets)
	}
	if failedWrites > 0 {
		e.t.Errorf("%d creates failed during a graceful shutdown, want 0", failedWrites)
	}
	if n := r.ListsSince(t0); n > 0 {
		e.t.Errorf("the informer relisted %d times during a graceful shutdown, want 0", n)
	}
}

// S5: generateName creates (not idempotent) run through a kill and then a
// blackhole of the serving apiserver. Each logical create (one SeqLabel
// value) must yield at most one object; failures reach the caller.
func s5GenerateName(e *env) {
	w := e.startLoad(workload.Config{GenerateName: true, Prefix: "gen", WriteInterval: 50 * time.Millisecond})
	e.waitSteady(w)
	first := e.serving(w)
	t0 := e.inject("SIGKILL "+first.Addr()+" (serving)", first.Kill)
	e.waitResumed(w, t0)
	e.movedAway(w, first)
	// The creates' apiserver now: after a failover the informer's watch
	// may stay on another one (a retired connection keeps its watch).
	second := e.writesServedBy(w)
	t1 := e.inject("blackhole "+second.Addr()+" (answering the creates)", second.Blackhole)
	e.waitResumed(w, t1)
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	if w, ok := r.FirstWriteOK(t0); ok {
		e.row.FailoverSeconds = e.seconds("write_resume_kill", w.Sub(t0))
	}
	if w, ok := r.FirstWriteOK(t1); ok {
		e.seconds("write_resume_blackhole", w.Sub(t1))
	}

	// Count the objects per logical create on an apiserver that saw no
	// fault, not only through the informer.
	var witness *testbed.APIServer
	for _, s := range others(e.bed, first, second) {
		witness = s
	}
	cs, err := witness.Clientset()
	if err != nil {
		e.t.Fatal(err)
	}
	list, err := cs.CoreV1().ConfigMaps(e.namespace()).List(e.ctx, metav1.ListOptions{LabelSelector: workload.PrefixLabel + "=gen"})
	if err != nil {
		e.t.Fatalf("listing the created objects via %s: %v", witness.Name(), err)
	}
	objects := make(map[int]int)
	for _, cm := range list.Items {
		seq, _ := strconv.Atoi(cm.Labels[workload.SeqLabel])
		objects[seq]++
	}
	dups, ambiguous, missing := 0, 0, 0
	for _, wr := range r.Writes {
		switch n := objects[wr.Seq]; {
		case n > 1:
			dups++
			e.t.Errorf("logical create %d produced %d objects", wr.Seq, n)
		case wr.OK() && n == 0:
			missing++
			e.t.Errorf("create %d succeeded (%s) but no object exists", wr.Seq, wr.Name)
		case !wr.OK() && n == 1:
			ambiguous++ // processed, but the answer was lost: surfaced as an error
		}
	}
	e.row.Duplicates = max(dups, e.row.Duplicates)
	e.figure("objects", float64(len(list.Items)), "")
	e.figure("creates_failed_but_applied", float64(ambiguous), "")
	e.figure("creates_missing", float64(missing), "")
	e.t.Logf("%d logical creates, %d objects, %d failures surfaced to the caller (%d of them had been applied), %d duplicates",
		len(r.Writes), len(list.Items), r.FailedWrites(), ambiguous, dups)
}

// writesServedBy returns the apiserver that answered the last successful
// creates (three in a row), waiting for them.
func (e *env) writesServedBy(w *workload.Workload) *testbed.APIServer {
	e.t.Helper()
	var addr string
	proxied := false // the client does not report endpoints (a proxy)
	err := e.waitFor("creates on one apiserver", observeLimit, func() bool {
		r := w.Snapshot()
		addr = ""
		n := 0
		for i := len(r.Writes) - 1; i >= 0 && n < 3; i-- {
			q := r.Writes[i]
			if !q.OK() {
				continue
			}
			if addr == "" {
				addr = q.Endpoint
			} else if q.Endpoint != addr {
				return false
			}
			n++
		}
		proxied = addr != "" && !e.isAPIServer(addr)
		return proxied || (n == 3 && e.isAPIServer(addr))
	})
	if err != nil || proxied {
		return e.serving(w)
	}
	for _, s := range e.bed.APIServers() {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// S6: every apiserver is killed; while they are down the client's
// connection attempts must stay bounded, and once one is back requests
// must succeed within rise × interval + slack.
func s6AllDown(e *env) {
	w := e.startLoad(workload.Config{})
	e.waitSteady(w)
	servers := e.bed.APIServers()
	t0 := e.inject("SIGKILL every apiserver", func() error {
		for _, s := range servers {
			if err := s.Kill(); err != nil {
				return err
			}
		}
		return nil
	})
	// Skip the first second (failing over, connections breaking), then
	// count attempts over a window with everything down.
	e.sleep(time.Second)
	from, fromAttempts, fromConns := time.Now(), e.c.DialAttempts(), e.clientConns()
	e.sleep(4 * time.Second)
	window, attempts := time.Since(from), sum(e.c.DialAttempts())-sum(fromAttempts)
	connRate := float64(e.clientConns()-fromConns) / window.Seconds()
	snap := w.Snapshot()
	requests := 0
	for _, q := range append(snap.Gets, snap.Writes...) {
		if q.Start.After(from) {
			requests++
		}
	}
	rate := float64(attempts) / window.Seconds()
	e.figure("down_dial_attempts_per_second", rate, "/s")
	e.figure("down_requests_per_second", float64(requests)/window.Seconds(), "/s")
	if e.c.ClientConns != nil {
		e.figure("down_client_conns_per_second", connRate, "/s")
	}
	if limit := maxDownAttemptRate(len(servers)); rate > limit {
		e.t.Errorf("%.1f connection attempts/s with every apiserver down, want at most %.0f", rate, limit)
	}

	s := servers[0]
	restart := time.Now()
	if err := s.Restart(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	t1 := time.Now()
	e.seconds("apiserver_restart", t1.Sub(restart))
	err := e.waitFor("first GET after the restart", observeLimit, func() bool {
		r := w.Snapshot()
		_, ok := r.FirstGetOK(t1)
		return ok
	})
	if err != nil {
		e.t.Error(err)
	}
	e.waitResumed(w, t1)
	e.tolerateKubectl(t0, t1.Add(e.c.RecoveryBudget))
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	if get, ok := r.FirstGetOK(t1); ok {
		recovery := get.Sub(t1)
		e.row.FailoverSeconds = e.seconds("recovery", recovery)
		if recovery > e.c.RecoveryBudget {
			e.t.Errorf("requests recovered %s after the apiserver was ready, budget %s", recovery.Round(time.Millisecond), e.c.RecoveryBudget)
		}
	}
	if get, ok := r.FirstGetOK(restart); ok {
		e.seconds("recovery_from_restart", get.Sub(restart))
	}
	if seen, ok := r.FirstSeenWrite(t1); ok {
		e.seconds("informer_recovery", seen.Sub(t1))
	}
}

// maxDownAttemptRate is the bound on connection attempts per second while
// n apiservers are all down: a few rounds over all of them per second,
// whatever the request rate.
func maxDownAttemptRate(n int) float64 { return float64(8 * n) }

// S7: EndpointSlice churn. A new apiserver enters the client's pool and
// can take its traffic; a removed one leaves the pool, its connections are
// closed and it gets no new ones.
func s7Churn(e *env) {
	w := e.startLoad(workload.Config{})
	e.waitSteady(w)
	originals := e.bed.APIServers()

	began := time.Now()
	added, err := e.bed.AddAPIServer(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	listed := time.Now()
	e.seconds("add_apiserver", listed.Sub(began))
	e.t.Cleanup(func() { e.bed.RemoveAPIServer(context.Background(), added) })
	err = e.waitFor("client pool holds "+added.Addr(), observeLimit, func() bool {
		return e.c.Endpoints()[added.Addr()] == "healthy"
	})
	if err != nil {
		e.t.Fatalf("%v; endpoints %v", err, e.c.Endpoints())
	}
	e.row.FailoverSeconds = e.seconds("discovered_healthy", time.Since(listed))

	// Cut the client off from the original apiservers: traffic must go
	// to the new one.
	t0 := e.inject("blackhole the original apiservers", func() error {
		for _, s := range originals {
			if err := s.Blackhole(); err != nil {
				return err
			}
		}
		return nil
	})
	err = e.waitFor("traffic on "+added.Addr(), observeLimit, func() bool {
		return e.c.Serving() == added.Addr() && e.c.OpenConns()[added.Addr()] > 0
	})
	if err != nil {
		e.t.Fatalf("%v; serving %q, conns %v", err, e.c.Serving(), e.c.OpenConns())
	}
	e.seconds("moved_to_added", time.Since(t0))
	e.waitResumed(w, t0)
	for _, s := range originals {
		if err := s.Restore(); err != nil {
			e.t.Fatal(err)
		}
	}
	err = e.waitFor("originals healthy again", observeLimit, func() bool {
		eps := e.c.Endpoints()
		for _, s := range originals {
			if eps[s.Addr()] != "healthy" {
				return false
			}
		}
		return true
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if n := e.c.OpenConns()[added.Addr()]; n == 0 {
		e.t.Logf("note: the client left %s once the originals were back", added.Addr())
	}

	// Remove it: it leaves the pool, its connections close, no new ones.
	t1 := time.Now()
	var leftPool, connsClosed time.Duration
	done := make(chan error, 1)
	go func() { done <- e.bed.RemoveAPIServer(e.ctx, added) }()
	err = e.waitFor("removed apiserver leaves the client", observeLimit, func() bool {
		_, inPool := e.c.Endpoints()[added.Addr()]
		if !inPool && leftPool == 0 {
			leftPool = time.Since(t1)
		}
		if e.c.OpenConns()[added.Addr()] == 0 && connsClosed == 0 {
			connsClosed = time.Since(t1)
		}
		return leftPool > 0 && connsClosed > 0
	})
	if rerr := <-done; rerr != nil {
		e.t.Fatalf("RemoveAPIServer: %v", rerr)
	}
	removed := time.Since(t1)
	if err != nil {
		e.t.Errorf("%v; endpoints %v, conns %v", err, e.c.Endpoints(), e.c.OpenConns())
	}
	e.seconds("remove_apiserver", removed)
	e.seconds("left_pool", leftPool)
	e.seconds("conns_closed", connsClosed)
	dialsAfter := e.c.DialAttempts()[added.Addr()]
	e.sleep(2 * time.Second)
	if n := e.c.DialAttempts()[added.Addr()] - dialsAfter; n > 0 {
		e.t.Errorf("%d connection attempts to removed %s", n, added.Addr())
	}
	if n := e.c.OpenConns()[added.Addr()]; n > 0 {
		e.t.Errorf("%d connections to removed %s still open", n, added.Addr())
	}
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	via := 0
	for _, g := range r.Gets {
		if g.OK() && g.Endpoint == added.Addr() {
			via++
		}
	}
	e.figure("gets_via_added", float64(via), "")
	if via == 0 && e.isAPIServer(w.WatchEndpoint()) {
		e.t.Errorf("no GET was answered by the added apiserver %s", added.Addr())
	}
	failed := failedSince(r, t1)
	for _, q := range failed {
		e.t.Logf("failed during removal: %s after %s: %v", q.Start.Sub(t1).Round(time.Millisecond), q.End.Sub(q.Start).Round(time.Millisecond), q.Err)
	}
	n := len(failed)
	if e.c.ShutdownRefusalsReachClient {
		rn := shutdownRefusals(failed)
		e.figure("shutdown_refusals", float64(rn), "")
		n -= rn
	}
	e.figure("failed_during_removal", float64(n), "")
	if n > 0 {
		e.t.Errorf("%d requests failed while the apiserver was removed gracefully, want 0", n)
	}
}

// etcdPause is the longest S8 keeps etcd stopped, waiting for the client
// to mark every apiserver down (fall 2 x 1 s probes: about 3 s, more on a
// loaded machine): shorter than the 10 s drain of connections to servers
// that fail /readyz, which the first one marked down starts.
const etcdPause = 7 * time.Second

// S8: etcd stops until the client marks every apiserver down (at most
// etcdPause). Every apiserver fails /readyz at once, or
// answers it late, yet stays up and serves watches from its cache; there is
// nowhere better to go. The client may mark them all down, but must not
// cut its connections: no watch restarted, no relist, no request failed
// (they wait for etcd), nothing lost.
func s8EtcdPause(e *env) {
	w := e.startLoad(workload.Config{})
	e.waitSteady(w)
	t0 := e.inject("SIGSTOP etcd", e.bed.PauseEtcd)
	down, lastDown := 0, t0
	// etcd stays stopped until every apiserver is marked down (the state
	// the scenario is about), at most etcdPause.
	e.waitFor("every apiserver marked down while etcd is paused", etcdPause, func() bool {
		n := 0
		for _, st := range e.c.Endpoints() {
			if st != "healthy" {
				n++
			}
		}
		if n > down {
			down, lastDown = n, time.Now()
		}
		return down == len(e.bed.APIServers())
	})
	t1 := e.inject("SIGCONT etcd", e.bed.ResumeEtcd)
	e.figure("apiservers_marked_down", float64(down), "")
	if n := len(e.bed.APIServers()); down < n {
		// Otherwise neither the drain nor its lifting was exercised.
		e.t.Errorf("%d of %d apiservers marked down while etcd paused, want all: /readyz kept passing?", down, n)
	}
	e.waitResumed(w, t1)
	err := e.waitFor("every apiserver healthy again", observeLimit, func() bool {
		for _, st := range e.c.Endpoints() {
			if st != "healthy" {
				return false
			}
		}
		return true
	})
	if err != nil {
		e.t.Error(err)
	}
	// Past the drain deadline (10 s) of connections drained during the
	// pause, and a reflector's re-watch after it, had the drain not been
	// lifted.
	e.sleep(time.Until(lastDown.Add(13 * time.Second)))
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	watches := 0
	for _, ev := range r.Timeline {
		if ev.Kind == workload.KindWatch && ev.Time.After(t0) {
			watches++
		}
	}
	e.figure("watches_restarted", float64(watches), "")
	if watches > 0 {
		e.t.Errorf("the informer's watch was restarted %d times while etcd paused, want 0: its connection was cut", watches)
	}
	if n := r.ListsSince(t0); n > 0 {
		e.t.Errorf("the informer relisted %d times while etcd paused, want 0", n)
	}
	if n := len(failedSince(r, t0)); n > 0 {
		e.t.Errorf("%d requests failed while etcd paused, want 0 (they wait for etcd)", n)
	}
}

// clientConns is the client's connection count, 0 if it does not say.
func (e *env) clientConns() int {
	if e.c.ClientConns == nil {
		return 0
	}
	return e.c.ClientConns()
}

// failedSince returns the GETs and creates that failed at or after t.
func failedSince(r workload.Results, t time.Time) []workload.Request {
	var out []workload.Request
	for _, q := range append(r.Gets, r.Writes...) {
		if !q.OK() && !q.End.Before(t) {
			out = append(out, q)
		}
	}
	return out
}

// shutdownRefusals counts requests a stopping apiserver refused with 429
// and Retry-After: not processed, and retried by client-go by itself.
func shutdownRefusals(rs []workload.Request) int {
	n := 0
	for _, r := range rs {
		if _, retry := apierrors.SuggestsClientDelay(r.Err); retry && apierrors.IsTooManyRequests(r.Err) {
			n++
		}
	}
	return n
}
