package e2e_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	clienttransport "k8s.io/client-go/transport"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport/upstream"
)

// Gray faults: the apiserver stays up but is slow, lossy, or presents a
// certificate that does not verify; or the client's own certificate
// rotates. S9-S12.
const (
	// grayDeadline is the workload's per-request timeout in S9-S12: no
	// request may take longer (plus deadlineSlack).
	grayDeadline  = 5 * time.Second
	deadlineSlack = 500 * time.Millisecond
	// slowDemoteBudget: a slow serving apiserver must stop being the
	// client's healthy first choice within this time.
	slowDemoteBudget = 5 * time.Second
	// slowWindow is how long S9 keeps the server slow after the demotion.
	slowWindow = 5 * time.Second
	// maxSlowDialRate bounds the client's connection attempts per second
	// while a server is slow (probes excluded): a dial that loses the
	// staggered race must not be repeated in a loop.
	maxSlowDialRate = 2.0
	// lossyWindow is how long S10 drops packets.
	lossyWindow = 15 * time.Second
	lossyRate   = 0.2
	// notYetValidIn is how far in the future S11's certificate becomes
	// valid (the restart takes ~5 s of it).
	notYetValidIn = 25 * time.Second
	// certRecoveryBudget: once a certificate verifies (NotBefore passed,
	// or the good one is back) the client must count the server healthy
	// again within this time, without a restart.
	certRecoveryBudget = 30 * time.Second
	// misnamedWindow is how long S11 watches the misnamed server.
	misnamedWindow = 5 * time.Second
	// clientCertLife is how long S12's first client certificate is valid
	// from the client's start; it is replaced rotateBeforeExpiry before it
	// expires, and the load goes on afterExpiry beyond.
	clientCertLife     = 40 * time.Second
	rotateBeforeExpiry = 20 * time.Second
	afterExpiry        = 8 * time.Second
)

// client-go closes the connections of a client with certificate files
// when it sees the files change, but checks only every
// CertCallbackRefreshDuration (5 min): a client whose certificate rotates
// more often than that (kubelet's rotation closes its connections itself)
// keeps presenting the old one on its open connections. S12 runs
// client-go's own rotation at a pace fit for a 40 s certificate; it
// affects only clients with certificate files (S12's).
func init() { clienttransport.CertCallbackRefreshDuration = time.Second }

// grayLoad starts a workload with the gray-fault deadline and
// generateName creates (a create sent twice shows as a duplicate).
func (e *env) grayLoad() *workload.Workload {
	return e.startLoad(workload.Config{RequestTimeout: grayDeadline, GenerateName: true, Prefix: "gray"})
}

// checkGray asserts what every gray scenario must hold: no request took
// longer than its deadline, no logical create produced two objects. It
// records the longest request and the failures.
func (e *env) checkGray(r workload.Results) {
	e.t.Helper()
	var longest workload.Request
	for _, q := range append(slices.Clone(r.Gets), r.Writes...) {
		if q.End.Sub(q.Start) > longest.End.Sub(longest.Start) {
			longest = q
		}
	}
	took := longest.End.Sub(longest.Start)
	e.seconds("max_latency", took)
	if took > grayDeadline+deadlineSlack {
		e.t.Errorf("a request took %s, its deadline was %s: %s", took.Round(time.Millisecond), grayDeadline, describeRequest(longest, e.faultAt))
	}
	if dups := r.Duplicates(); len(dups) > 0 {
		e.t.Errorf("%d logical creates produced more than one object: sequence numbers %v", len(dups), firstN(dups, 10))
	}
}

// describeRequest says what q was, when it started (from the fault at
// t0), where it went and how it ended, on one line.
func describeRequest(q workload.Request, t0 time.Time) string {
	kind := "GET"
	if q.Seq > 0 {
		kind = fmt.Sprintf("create #%d", q.Seq)
	}
	s := fmt.Sprintf("%s started %+.3fs after the fault, via %q", kind, q.Start.Sub(t0).Seconds(), q.Endpoint)
	if q.Attempts > 0 {
		s += fmt.Sprintf(", attempts: %d", q.Attempts)
	}
	if q.Err != nil {
		s += ", " + oneLine(q.Err.Error(), 200)
	}
	return s
}

// slowRequests counts requests started in [from, to) that took longer
// than d, and returns the longest.
func slowRequests(r workload.Results, from, to time.Time, d time.Duration) (int, time.Duration) {
	n, longest := 0, time.Duration(0)
	for _, q := range append(slices.Clone(r.Gets), r.Writes...) {
		if q.Start.Before(from) || !q.Start.Before(to) {
			continue
		}
		took := q.End.Sub(q.Start)
		longest = max(longest, took)
		if took > d {
			n++
		}
	}
	return n, longest
}

// eventLog records the changes of the client's pool.
type eventLog struct {
	mu     sync.Mutex // guards events
	events []timedEvent
}

type timedEvent struct {
	at time.Time
	upstream.Event
}

// recordEvents subscribes to the client's pool until the test ends.
func (e *env) recordEvents() *eventLog {
	l := &eventLog{}
	cancel := e.c.Subscribe(func(ev upstream.Event) {
		l.mu.Lock()
		l.events = append(l.events, timedEvent{time.Now(), ev})
		l.mu.Unlock()
	})
	e.t.Cleanup(cancel)
	return l
}

// matching returns the events of kind for addr in [from, to].
func (l *eventLog) matching(kind upstream.EventKind, addr string, from, to time.Time) []timedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []timedEvent
	for _, ev := range l.events {
		if ev.Kind == kind && ev.Addr == addr && !ev.at.Before(from) && !ev.at.After(to) {
			out = append(out, ev)
		}
	}
	return out
}

// count returns the number of events of kind for addr in [from, to].
func (l *eventLog) count(kind upstream.EventKind, addr string, from, to time.Time) int {
	return len(l.matching(kind, addr, from, to))
}

// reasons lists, on one line, when the events of kind for addr in
// [from, to] came (from from) and why.
func (l *eventLog) reasons(kind upstream.EventKind, addr string, from, to time.Time) string {
	var out []string
	for _, ev := range l.matching(kind, addr, from, to) {
		out = append(out, fmt.Sprintf("%+.3fs %s", ev.at.Sub(from).Seconds(), ev.why()))
	}
	return strings.Join(out, "; ")
}

func (l *eventLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ""
	for _, ev := range l.events {
		s += fmt.Sprintf("\n  %s %s %s %s", ev.at.Format("15:04:05.000"), ev.Kind, ev.Addr, ev.why())
	}
	return s
}

// why is the endpoint's state after the event, and the failure that
// caused it, if any, on one line.
func (ev timedEvent) why() string {
	if ev.Err == nil {
		return ev.State.String()
	}
	return ev.State.String() + " " + oneLine(ev.Err.Error(), 200)
}

// S9: the serving apiserver turns slow for new connections: 300 ms more
// per handshake, 2 s more per response (testbed Slow; the connections
// open before keep their speed, so the client meets the slowness in its
// probes and new connections). The client must stop preferring it within
// slowDemoteBudget, without a storm of connection attempts; no request may
// outlive its deadline; once fast again the server must be healthy in the
// client's view.
func s9Slow(e *env) {
	w := e.grayLoad()
	e.waitSteady(w)
	s := e.serving(w)
	events := e.recordEvents()
	dials0, conns0 := e.c.DialAttempts(), e.clientConns()
	t0 := e.inject("slow "+s.Addr()+" (serving)", func() error {
		return s.Slow(testbed.Slowness{Handshake: 300 * time.Millisecond, Response: 2 * time.Second})
	})
	err := e.waitFor("slow server demoted", observeLimit, func() bool {
		return e.c.Endpoints()[s.Addr()] != "healthy" || e.c.Preferred() != s.Addr()
	})
	demoted := time.Now()
	if err != nil {
		e.t.Errorf("%v; endpoints %v, preferred %q", err, e.c.Endpoints(), e.c.Preferred())
	} else {
		e.row.FailoverSeconds = e.seconds("demoted", demoted.Sub(t0))
		if demoted.Sub(t0) > slowDemoteBudget {
			e.t.Errorf("the slow server was demoted %s after the fault, budget %s", demoted.Sub(t0).Round(time.Millisecond), slowDemoteBudget)
		}
	}
	e.waitResumed(w, t0)
	e.sleep(time.Until(demoted.Add(slowWindow)))
	// A proxy dials once per client connection (kubectl's among them):
	// count the attempts beyond those.
	attempts := sum(e.c.DialAttempts()) - sum(dials0)
	conns := e.clientConns() - conns0
	window := time.Since(t0)
	e.figure("dial_attempts_while_slow", float64(attempts), "")
	if e.c.ClientConns != nil {
		e.figure("client_conns_while_slow", float64(conns), "")
	}
	if rate := float64(attempts-conns) / window.Seconds(); rate > maxSlowDialRate {
		e.t.Errorf("%d connection attempts (%d client connections) in the %s the server was slow: %.1f/s beyond one per client connection, want at most %.0f/s",
			attempts, conns, window.Round(time.Millisecond), rate, maxSlowDialRate)
	}
	e.figure("slow_server_state_changes", float64(events.count(upstream.EventDown, s.Addr(), t0, time.Now())+events.count(upstream.EventUp, s.Addr(), t0, time.Now())), "")

	fastAt := time.Now()
	t1 := e.inject("fast "+s.Addr(), s.Fast)
	err = e.waitFor(s.Addr()+" healthy again", observeLimit, func() bool { return e.c.Endpoints()[s.Addr()] == "healthy" })
	if err != nil {
		e.t.Errorf("%v; endpoints %v", err, e.c.Endpoints())
	} else {
		e.seconds("healthy_again", time.Since(fastAt))
	}
	e.sleep(afterResume)
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.t.Logf("pool events:%s", events)
	e.checkGray(r)
	n, longest := slowRequests(r, demoted.Add(time.Second), t1, time.Second)
	e.figure("slow_requests_after_demotion", float64(n), "")
	e.seconds("max_latency_after_demotion", longest)
	e.figure("failed_while_slow", float64(len(failedSince(r, t0))), "")
}

// S10: 20% of the packets to and from the serving apiserver are dropped
// for lossyWindow. TCP retransmits; the faulted server may look bad, the
// others must not: no EventDown for them. No request outlives its
// deadline, no create is duplicated.
func s10Lossy(e *env) {
	w := e.grayLoad()
	e.waitSteady(w)
	s := e.serving(w)
	events := e.recordEvents()
	t0 := e.inject(fmt.Sprintf("drop %.0f%% of packets of %s (serving)", lossyRate*100, s.Addr()), func() error { return s.Lossy(lossyRate) })
	e.sleep(lossyWindow)
	t1 := e.inject("restore "+s.Addr(), s.Restore)
	err := e.waitFor(s.Addr()+" healthy again", observeLimit, func() bool { return e.c.Endpoints()[s.Addr()] == "healthy" })
	if err != nil {
		e.t.Errorf("%v; endpoints %v", err, e.c.Endpoints())
	} else {
		e.seconds("healthy_again", time.Since(t1))
	}
	end := time.Now()
	flaps := 0
	for _, o := range others(e.bed, s) {
		n := events.count(upstream.EventDown, o.Addr(), t0, end)
		flaps += n
		if n > 0 {
			e.t.Errorf("healthy %s marked down %d times while %s was lossy: %s", o.Addr(), n, s.Addr(), events.reasons(upstream.EventDown, o.Addr(), t0, end))
		}
	}
	e.figure("others_down_events", float64(flaps), "")
	e.figure("lossy_down_events", float64(events.count(upstream.EventDown, s.Addr(), t0, end)), "")
	e.figure("lossy_up_events", float64(events.count(upstream.EventUp, s.Addr(), t0, end)), "")
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.t.Logf("pool events:%s", events)
	e.checkGray(r)
	n, longest := slowRequests(r, t0, t1, time.Second)
	e.figure("requests_over_1s", float64(n), "")
	e.seconds("max_latency_lossy", longest)
	e.figure("failed_while_lossy", float64(len(failedSince(r, t0))), "")
}

// S11: apiserver-1 (a static endpoint on both paths, so it stays in the
// client's pool through its restarts) restarts with a serving certificate
// that becomes valid notYetValidIn later: the client must not use it
// before, and must count it healthy within certRecoveryBudget after, with
// no restart of the client. Then it restarts with a certificate for the
// wrong name (never healthy meanwhile), then with the good one (healthy
// again within certRecoveryBudget). No request may fail (a stopping
// apiserver's refusals on an L4 path aside, see S4), none outlive its
// deadline.
func s11Cert(e *env) {
	w := e.grayLoad()
	e.waitSteady(w)
	s := e.bed.APIServers()[0]
	events := e.recordEvents()
	var nb time.Time // the certificate's NotBefore
	t0 := e.inject("restart "+s.Addr()+" with a not-yet-valid certificate", func() error {
		var err error
		nb, err = s.RestartNotYetValid(e.ctx, notYetValidIn)
		return err
	})
	e.t.Logf("certificate valid from %s", nb.Format("15:04:05"))
	e.figure("valid_after_restart", time.Until(nb).Seconds(), "s")
	// Until NotBefore the client must not count it healthy.
	e.waitFor("certificate valid", time.Until(nb), func() bool {
		if e.c.Endpoints()[s.Addr()] == "healthy" {
			e.t.Errorf("the client counts %s healthy at %s, before its certificate is valid (%s)", s.Addr(), time.Now().Format("15:04:05.000"), nb.Format("15:04:05"))
			return true
		}
		return false
	})
	e.sleep(time.Until(nb))
	e.t.Logf("%s before NotBefore: %s", s.Addr(), e.c.Endpoints()[s.Addr()])
	err := e.waitFor(s.Addr()+" healthy after NotBefore", certRecoveryBudget, func() bool { return e.c.Endpoints()[s.Addr()] == "healthy" })
	if err != nil {
		e.t.Errorf("%v (no client restart): endpoints %v", err, e.c.Endpoints())
	} else {
		e.row.FailoverSeconds = e.seconds("healthy_after_notbefore", time.Since(nb))
	}

	e.inject("restart "+s.Addr()+" with a misnamed certificate", func() error { return s.RestartMisnamed(e.ctx) })
	e.waitFor("misnamed window", misnamedWindow, func() bool {
		if e.c.Endpoints()[s.Addr()] == "healthy" {
			e.t.Errorf("the client counts misnamed %s healthy", s.Addr())
			return true
		}
		return false
	})
	e.t.Logf("%s with the misnamed certificate: %s", s.Addr(), e.c.Endpoints()[s.Addr()])
	t2 := e.inject("restart "+s.Addr()+" with the good certificate", func() error { return s.RestartGoodCert(e.ctx) })
	err = e.waitFor(s.Addr()+" healthy with the good certificate", certRecoveryBudget, func() bool { return e.c.Endpoints()[s.Addr()] == "healthy" })
	if err != nil {
		e.t.Errorf("%v (no client restart): endpoints %v", err, e.c.Endpoints())
	} else {
		e.seconds("healthy_after_good_cert", time.Since(t2))
	}
	e.sleep(afterResume)
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.t.Logf("pool events:%s", events)
	e.checkGray(r)
	failed := failedSince(r, t0)
	n := len(failed)
	if e.c.ShutdownRefusalsReachClient {
		rn := shutdownRefusals(failed)
		e.figure("shutdown_refusals", float64(rn), "")
		n -= rn
	}
	e.figure("failed", float64(n), "")
	if n > 0 {
		e.t.Errorf("%d requests failed while %s restarted with bad certificates, want 0", n, s.Addr())
	}
}

// clientCertFile is the client certificate of a scenario with clientCert.
type clientCertFile struct {
	path     string
	notAfter time.Time
}

// withClientCert issues a client certificate (group system:masters) that
// expires clientCertLife from now, writes it to a file, and returns it
// with an auth function that makes a client use that file (and no token).
func withClientCert(t *testing.T, bed *testbed.Bed) (*clientCertFile, func(*rest.Config)) {
	t.Helper()
	cert, err := bed.IssueClientCert("cert-admin", []string{"system:masters"}, time.Now().Add(clientCertLife))
	if err != nil {
		t.Fatal(err)
	}
	// In the bed's directory, not the test's: client-go's certificate
	// reloader (of its transport cache) outlives the client and would log
	// a missing file every CertCallbackRefreshDuration for the rest of the
	// suite.
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + "-client.pem"
	cc := &clientCertFile{path: filepath.Join(bed.Dir(), name), notAfter: cert.NotAfter}
	if err := cert.WriteFile(cc.path); err != nil {
		t.Fatal(err)
	}
	return cc, func(cfg *rest.Config) {
		cfg.BearerToken = ""
		cfg.CertFile, cfg.KeyFile = cc.path, cc.path
	}
}

// S12: the client authenticates with a certificate file. Before the
// certificate expires, the file is replaced (atomically) by a fresh one;
// the load goes on until past the old one's expiry, when a connection
// still presenting it gets 401. No request may fail.
func s12ClientCertRotation(e *env) {
	cc := e.clientCert
	w := e.grayLoad()
	e.waitSteady(w)
	fresh, err := e.bed.IssueClientCert("cert-admin", []string{"system:masters"}, time.Now().Add(time.Hour))
	if err != nil {
		e.t.Fatal(err)
	}
	e.sleep(time.Until(cc.notAfter.Add(-rotateBeforeExpiry)))
	t0 := e.inject("replace the client certificate", func() error { return fresh.WriteFile(cc.path) })
	e.seconds("rotated_before_expiry", cc.notAfter.Sub(t0))
	e.sleep(time.Until(cc.notAfter.Add(afterExpiry)))
	r := e.stopLoad(w)
	e.logTimeline(r, t0)
	e.checkGray(r)
	failed := failedSince(r, t0)
	unauthorized := 0
	for _, q := range failed {
		if apierrors.IsUnauthorized(q.Err) {
			unauthorized++
		}
	}
	e.figure("unauthorized", float64(unauthorized), "")
	if first, ok := firstFailure(failed); ok {
		e.seconds("first_failure_after_expiry", first.Sub(cc.notAfter))
	}
	if len(failed) > 0 {
		e.t.Errorf("%d requests failed after the certificate rotated (%d of them 401: the expired certificate still in use), want 0", len(failed), unauthorized)
	}
}

func firstFailure(rs []workload.Request) (time.Time, bool) {
	var first time.Time
	for _, q := range rs {
		if first.IsZero() || q.End.Before(first) {
			first = q.End
		}
	}
	return first, !first.IsZero()
}

// TestGrayFailureLines: the lines a failed gray check prints say which
// request, or which events and why, on one line each (hack/testlog
// repeats a failed test's own lines, not what is indented under them).
func TestGrayFailureLines(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 20, 0, 0, 0, time.UTC)
	l := &eventLog{events: []timedEvent{
		{t0.Add(-time.Second), upstream.Event{Kind: upstream.EventDown, Addr: "a:6443", State: upstream.StateUnhealthy, Err: errors.New("before")}},
		{t0.Add(1500 * time.Millisecond), upstream.Event{Kind: upstream.EventDown, Addr: "a:6443", State: upstream.StateUnhealthy, Err: errors.New("PING unanswered\nwithin 300ms")}},
		{t0.Add(2 * time.Second), upstream.Event{Kind: upstream.EventUp, Addr: "a:6443", State: upstream.StateHealthy}},
		{t0.Add(3 * time.Second), upstream.Event{Kind: upstream.EventDown, Addr: "b:6443", State: upstream.StateUnhealthy}},
	}}
	if got, want := l.reasons(upstream.EventDown, "a:6443", t0, t0.Add(time.Minute)), "+1.500s unhealthy PING unanswered | within 300ms"; got != want {
		t.Errorf("reasons = %q, want %q", got, want)
	}
	q := workload.Request{Seq: 7, Start: t0.Add(2 * time.Second), End: t0.Add(8 * time.Second), Endpoint: "127.0.0.1:7445", Attempts: 1, Err: errors.New("context deadline exceeded")}
	if got, want := describeRequest(q, t0), `create #7 started +2.000s after the fault, via "127.0.0.1:7445", attempts: 1, context deadline exceeded`; got != want {
		t.Errorf("describeRequest = %q, want %q", got, want)
	}
}
