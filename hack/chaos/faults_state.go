package chaos

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

// faultState is what the soak's faults beyond the bed's single-server
// ones need and leave behind: the clients they watch, the servers that
// joined, and their figures and violations for the summary.
type faultState struct {
	// tr is the transport path's client; lp the localproxy path's
	// instance, whichever serves now. Set before the plan runs.
	tr *transport.Failover
	lp *proxyHandle

	// mu guards the fields below: lifts run in the plan's goroutine, the
	// timeline and the summary read them after it.
	mu         sync.Mutex
	joined     []*testbed.APIServer // every server a join added, in order
	joins      []JoinReport
	certs      []CertReport
	handovers  HandoverReport
	violations []string
}

func (f *faultState) violate(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.violations = append(f.violations, v)
}

// pathView is one path's view of an apiserver address at a moment.
type pathView struct {
	inPool  bool
	healthy bool
	// conns are client connections routed to the address: the
	// transport's tracked connections, localproxy's connections to the
	// upstream (in the pool, or removed and draining; for an instance
	// draining after a hand-over, its sockets to the address, its held
	// probe's among them).
	conns int
}

// view returns what each path (pathTransport, pathLocalProxy) sees of
// addr now: its pool's status and the connections routed to it;
// localproxy's is missing while its /status could not be read lately.
func (f *faultState) view(addr string) map[string]pathView {
	out := map[string]pathView{}
	var tv pathView
	for _, s := range f.tr.Pool().Status() {
		if s.Addr == addr {
			tv.inPool, tv.healthy = true, s.State == upstream.StateHealthy
		}
	}
	tv.conns = f.tr.OpenConns()[addr]
	out[pathTransport] = tv

	// localproxy: the serving instance's last /status, and the sockets
	// to addr of instances still draining after a hand-over (whose
	// /status the health port no longer reaches: new connections to it
	// go to the successor).
	var lv pathView
	st, ok := f.lp.status()
	if !ok {
		return out // no recent /status: nothing seen of localproxy now
	}
	for _, u := range st.Upstreams {
		if u.Addr == addr {
			lv.inPool, lv.healthy = true, u.State == upstream.StateHealthy.String()
			lv.conns += u.Conns
		}
	}
	for _, rm := range st.Removed {
		if rm.Addr == addr {
			lv.conns += rm.Conns
		}
	}
	if others := f.lp.others(); len(others) > 0 {
		tab := readTCPTable()
		for _, pid := range others {
			lv.conns += tab.socketsTo(pid, addr)
		}
	}
	out[pathLocalProxy] = lv
	return out
}

// watchPaths calls look with each path's view of addr every interval
// until stop is closed, then closes the returned channel.
func (f *faultState) watchPaths(addr func() string, interval time.Duration, stop <-chan struct{}, look func(now time.Time, v map[string]pathView)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if a := addr(); a != "" {
				look(time.Now(), f.view(a))
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return done
}

// seconds is d in seconds, rounded to milliseconds.
func seconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// lastJoined is the index (as Step.Server) of the server the last join
// added, -1 if none.
func (f *faultState) lastJoined() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.joined) == 0 {
		return -1
	}
	return f.joined[len(f.joined)-1].Index() - 1
}

// reportFaults puts the figures of joins, certificate faults and
// hand-overs into s and returns their violations; lpLogs are the
// localproxy processes' logs.
func (r *run) reportFaults(s *Summary, results map[string]workload.Results, windows []window, lpLogs string) []string {
	f := &r.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	s.Joins, s.CertFaults, s.Handovers = slices.Clone(f.joins), slices.Clone(f.certs), f.handovers
	if s.Joins == nil {
		s.Joins = []JoinReport{}
	}
	if s.CertFaults == nil {
		s.CertFaults = []CertReport{}
	}
	violations := slices.Clone(f.violations)
	h := &s.Handovers
	h.Failed, h.Refused = handoverFailures(results, windows)
	h.HandedOver = handedOver(lpLogs)
	if h.Refused > 0 {
		violations = append(violations, fmt.Sprintf("%d connections to localproxy refused during its hand-overs", h.Refused))
	}
	if h.HandedOver < h.Count {
		violations = append(violations, fmt.Sprintf("%d of %d replaced localproxy instances logged no hand-over to a ready successor", h.Count-h.HandedOver, h.Count))
	}
	return violations
}
