package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// Bounds of a join's invariants: the pools of both paths must list the
// joined server within joinSeenLimit of its first /readyz 200, and, once
// it has left the kubernetes EndpointSlice, drop it and route no
// connection to it within leaveLimit. Generous: discovery learns of the
// slice's change by a watch (at once), or by a relist after a watch
// error; a pool drops a removed endpoint at once and closes, or drains
// for up to localproxy.GracefulDrainTimeout (10s), its connections.
const (
	joinSeenLimit = 30 * time.Second
	leaveLimit    = 30 * time.Second
	// joinPoll is how often the paths' views are read during a join.
	joinPoll = 50 * time.Millisecond
)

// JoinReport is one join of an apiserver as the soak saw it.
type JoinReport struct {
	Server string `json:"server"`
	Addr   string `json:"addr"`
	// Ready is the seconds from the join's start until the server's
	// /readyz first answered 200 (asked every 100ms); 0 if it never did.
	Ready float64 `json:"ready_s"`
	// Seen and Healthy are, by path, the seconds from Ready until the
	// path's pool status listed the address and counted it healthy
	// (negative: before /readyz answered, as the server lists itself in
	// the EndpointSlice while it starts); absent: never while it was
	// there (a violation for Seen).
	Seen    map[string]float64 `json:"seen_after_ready_s"`
	Healthy map[string]float64 `json:"healthy_after_ready_s"`
	// MaxConns is, by path, the most client connections routed to it at
	// once before the leave (read every 50ms): 0 means the leave had no
	// client connection to move, only the pools' probes (SocketsLeft).
	MaxConns map[string]int `json:"max_conns"`
	// Left is the seconds from the leave (SIGTERM, the server's graceful
	// shutdown) until its address had left the EndpointSlice
	// (RemoveAPIServer returned).
	Left float64 `json:"left_slice_s"`
	// Dropped is, by path, the seconds from the leave until the pool no
	// longer listed the address and no client connection was routed to
	// it; absent: not within leaveLimit after Left (a violation, with
	// ConnsLeft the connections still routed to it then).
	Dropped   map[string]float64 `json:"dropped_s"`
	ConnsLeft map[string]int     `json:"conns_left,omitempty"`
	// SocketsLeft counts the TCP sockets of the soak's clients and
	// localproxy (both paths, their probes, the bed's clients) still
	// connected to the address (ESTABLISHED or CLOSE_WAIT in the network
	// namespace's /proc/net/tcp, where only they are clients) once the paths
	// had let it go, or leaveLimit after it left the slice: the server
	// has exited, so each is a connection nobody closed (a violation).
	// It does not rely on the clients' own counts.
	SocketsLeft int `json:"sockets_left"`
}

// joinWatch follows one join: the new server's /readyz and both paths'
// views of its address.
type joinWatch struct {
	f     *faultState
	bed   *testbed.Bed
	began time.Time
	known map[string]bool // the members when the join began

	mu        sync.Mutex // guards the fields below
	srv       *testbed.APIServer
	readyAt   time.Time
	seenAt    map[string]time.Time
	healthyAt map[string]time.Time
	leaveAt   time.Time // the leave began; zero before
	leftAt    time.Time // the address left the EndpointSlice
	droppedAt map[string]time.Time
	maxConns  map[string]int
	last      map[string]pathView

	stop chan struct{}
	done []<-chan struct{}
}

// join adds an apiserver to the bed and returns what makes it leave. The
// server joins the kubernetes EndpointSlice by itself (its endpoint
// reconciler), and both paths discover it there; before the leave the
// lift waits until both pools list it (at most joinSeenLimit after its
// /readyz), then stops the server gracefully (it takes its address out of
// the slice) and waits until both paths let it go (at most leaveLimit
// after it left the slice). What was not seen in time is a violation.
func (r *run) join(ctx context.Context) (func() error, error) {
	f := &r.faults
	w := &joinWatch{f: f, bed: r.bed, began: time.Now(), known: map[string]bool{}, seenAt: map[string]time.Time{},
		healthyAt: map[string]time.Time{}, droppedAt: map[string]time.Time{}, maxConns: map[string]int{}, stop: make(chan struct{})}
	for _, s := range r.bed.APIServers() {
		w.known[s.Addr()] = true
	}
	w.done = append(w.done, w.watchReadyz(ctx), f.watchPaths(w.addr, joinPoll, w.stop, w.look))
	s, err := r.bed.AddAPIServer(ctx)
	if err != nil {
		close(w.stop)
		w.wait()
		return nil, err
	}
	w.mu.Lock()
	w.srv = s // the one AddAPIServer started, whatever watchReadyz found
	w.mu.Unlock()
	f.mu.Lock()
	f.joined = append(f.joined, s)
	f.mu.Unlock()
	r.say("%s joined at %s", s.Name(), s.Addr())
	return func() error {
		// Until both pools list it: the check does not depend on the
		// window's length.
		_ = waitFor(ctx, w.seenWait(), func() bool { return w.seenBy() == 2 })
		w.mu.Lock()
		w.leaveAt = time.Now()
		w.mu.Unlock()
		err := r.bed.RemoveAPIServer(ctx, s)
		w.mu.Lock()
		w.leftAt = time.Now()
		w.mu.Unlock()
		_ = waitFor(ctx, leaveLimit, func() bool { return w.droppedBy() == 2 && connectedSockets(s.Addr()) == 0 })
		sockets := connectedSockets(s.Addr())
		close(w.stop)
		w.wait()
		rep, violations := w.report()
		if rep.SocketsLeft = sockets; sockets > 0 {
			violations = append(violations, fmt.Sprintf("leave of %s: %d sockets still connected to %s %s after it left the EndpointSlice", rep.Server, sockets, rep.Addr, leaveLimit))
		}
		r.say("%s left: %+v", s.Name(), rep)
		f.mu.Lock()
		f.joins = append(f.joins, rep)
		f.violations = append(f.violations, violations...)
		f.mu.Unlock()
		return err
	}, nil
}

// watchReadyz finds the server the join adds (a member the bed did not
// have) and asks its /readyz every 100ms until it answers 200.
func (w *joinWatch) watchReadyz(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			w.mu.Lock()
			s := w.srv
			w.mu.Unlock()
			if s == nil {
				if s = w.newMember(); s == nil {
					continue
				}
				w.mu.Lock()
				w.srv = s
				w.mu.Unlock()
			}
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			err := s.Readyz(rctx)
			cancel()
			if err == nil {
				w.mu.Lock()
				w.readyAt = time.Now()
				w.mu.Unlock()
				return
			}
		}
	}()
	return done
}

// newMember returns the bed's member that was not there when the join
// began, nil before AddAPIServer has made it one.
func (w *joinWatch) newMember() *testbed.APIServer {
	for _, s := range w.bed.APIServers() {
		if !w.known[s.Addr()] {
			return s
		}
	}
	return nil
}

// addr is the joined server's address once known, "" before.
func (w *joinWatch) addr() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.srv == nil {
		return ""
	}
	return w.srv.Addr()
}

// look records what the paths show of the address at now.
func (w *joinWatch) look(now time.Time, views map[string]pathView) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = views
	for path, v := range views {
		if w.leaveAt.IsZero() {
			w.maxConns[path] = max(w.maxConns[path], v.conns)
			if _, ok := w.seenAt[path]; !ok && v.inPool {
				w.seenAt[path] = now
			}
			if _, ok := w.healthyAt[path]; !ok && v.healthy {
				w.healthyAt[path] = now
			}
			continue
		}
		if _, ok := w.droppedAt[path]; !ok && !v.inPool && v.conns == 0 {
			w.droppedAt[path] = now
		}
	}
}

// seenWait is how long the lift may still wait for both pools to list
// the server: until joinSeenLimit after its /readyz (after now if it has
// not answered).
func (w *joinWatch) seenWait() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.readyAt.IsZero() {
		return joinSeenLimit
	}
	return max(time.Until(w.readyAt.Add(joinSeenLimit)), 0)
}

func (w *joinWatch) seenBy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seenAt)
}

func (w *joinWatch) droppedBy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.droppedAt)
}

func (w *joinWatch) wait() {
	for _, d := range w.done {
		<-d
	}
}

// report returns the join's figures and its violations.
func (w *joinWatch) report() (JoinReport, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rep := JoinReport{Server: w.srv.Name(), Addr: w.srv.Addr(), Seen: map[string]float64{}, Healthy: map[string]float64{},
		MaxConns: maps.Clone(w.maxConns), Dropped: map[string]float64{}, Left: seconds(w.leftAt.Sub(w.leaveAt))}
	var violations []string
	if w.readyAt.IsZero() {
		violations = append(violations, fmt.Sprintf("join of %s: its /readyz never answered 200", rep.Server))
	} else {
		rep.Ready = seconds(w.readyAt.Sub(w.began))
	}
	for _, path := range []string{pathTransport, pathLocalProxy} {
		ref := w.readyAt
		if ref.IsZero() {
			ref = w.began
		}
		if at, ok := w.seenAt[path]; ok && at.Sub(ref) <= joinSeenLimit {
			rep.Seen[path] = seconds(at.Sub(ref))
		} else {
			violations = append(violations, fmt.Sprintf("join of %s: the %s pool did not list %s within %s of its /readyz", rep.Server, path, rep.Addr, joinSeenLimit))
		}
		if at, ok := w.healthyAt[path]; ok {
			rep.Healthy[path] = seconds(at.Sub(ref))
		}
		if at, ok := w.droppedAt[path]; ok && at.Sub(w.leftAt) <= leaveLimit {
			rep.Dropped[path] = seconds(at.Sub(w.leaveAt))
			continue
		}
		if rep.ConnsLeft == nil {
			rep.ConnsLeft = map[string]int{}
		}
		v := w.last[path]
		rep.ConnsLeft[path] = v.conns
		violations = append(violations, fmt.Sprintf("leave of %s: %s had not let %s go %s after it left the EndpointSlice (in its pool: %v, connections routed to it: %d)",
			rep.Server, path, rep.Addr, leaveLimit, v.inPool, v.conns))
	}
	slices.Sort(violations)
	return rep, violations
}
