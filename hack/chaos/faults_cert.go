package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

const (
	// certSettle is how long after the restart into a bad certificate the
	// paths may still count the server healthy: the restart (a graceful
	// stop, then a start) takes seconds in which both pools see it fail,
	// and a restarted server is a new connection, verified again; two
	// probe intervals of margin.
	certSettle = 2 * time.Second
	// certPoll is how often the paths' views are read during a
	// certificate fault, for at least certWatchMin: a fault that began
	// late (after a heal that overran) or whose restart was slow keeps
	// its bad certificate that long past the plan's end.
	certPoll     = 100 * time.Millisecond
	certWatchMin = 3 * time.Second
	// notYetValidAfter is how long after the fault's end its certificate
	// becomes valid: never within the window, whose lift restarts the
	// server with the good one.
	notYetValidAfter = time.Minute
)

// CertReport is one certificate fault as the soak saw it.
type CertReport struct {
	Kind   Kind   `json:"kind"`
	Server string `json:"server"`
	// Restart is the seconds the restart into the bad certificate took.
	Restart float64 `json:"restart_s"`
	// Watched is the seconds during which the paths' views were read
	// (every 100ms): from certSettle after that restart until the lift,
	// at least certWatchMin.
	Watched float64 `json:"watched_s"`
	// Healthy counts, by path, the reads that found the server counted
	// healthy while its certificate did not verify: a violation.
	Healthy map[string]int `json:"healthy_reads"`
}

// certFault restarts s with a misnamed or a not-yet-valid serving
// certificate (st.Kind) and returns what restarts it with the good one.
// Until then neither path may count it healthy.
func (r *run) certFault(ctx context.Context, st Step, s *testbed.APIServer) (func() error, error) {
	began := time.Now()
	var err error
	switch st.Kind {
	case MisnamedCert:
		err = s.RestartMisnamed(ctx)
	case NotYetValidCert:
		_, err = s.RestartNotYetValid(ctx, st.For+notYetValidAfter)
	}
	if err != nil {
		return nil, err
	}
	rep := CertReport{Kind: st.Kind, Server: s.Name(), Restart: seconds(time.Since(began)), Healthy: map[string]int{}}
	var mu sync.Mutex // guards rep.Healthy
	from := time.Now().Add(certSettle)
	stop := make(chan struct{})
	done := r.faults.watchPaths(s.Addr, certPoll, stop, func(now time.Time, views map[string]pathView) {
		if now.Before(from) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for path, v := range views {
			if v.healthy {
				rep.Healthy[path]++
			}
		}
	})
	return func() error {
		if t := time.Until(from.Add(certWatchMin)); t > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(t):
			}
		}
		close(stop)
		<-done
		rep.Watched = seconds(max(time.Since(from), 0))
		f := &r.faults
		f.mu.Lock()
		f.certs = append(f.certs, rep)
		for path, n := range rep.Healthy {
			if n > 0 {
				f.violations = append(f.violations, fmt.Sprintf("%s on %s: %s counted it healthy in %d reads of %.1fs", rep.Kind, rep.Server, path, n, rep.Watched))
			}
		}
		f.mu.Unlock()
		return s.RestartGoodCert(ctx)
	}, nil
}
