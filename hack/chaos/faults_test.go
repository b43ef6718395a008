package chaos

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/workload"
)

// connectedSockets finds a client socket connected to a listener, and
// none once it is closed.
func TestConnectedSockets(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	if n := connectedSockets(addr); n != 0 {
		t.Fatalf("%d sockets connected to %s before any dial", n, addr)
	}
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := connectedSockets(addr); n != 1 {
		t.Errorf("%d sockets connected to %s, want the client's", n, addr)
	}
	c.Close()
	if n := connectedSockets(addr); n != 0 {
		t.Errorf("%d sockets connected to %s after the client closed", n, addr)
	}
	if n := connectedSockets("[::1]:80"); n != -1 {
		t.Errorf("an IPv6 address gave %d, want -1", n)
	}
}

// Failures through localproxy in a hand-over's window are counted, the
// refused ones apart; other paths and other windows are not.
func TestHandoverFailures(t *testing.T) {
	t0 := time.Now()
	windows := []window{
		{kind: Hang, server: 0, start: t0, end: t0.Add(time.Second)},
		{kind: Handover, server: -1, start: t0.Add(10 * time.Second), end: t0.Add(20 * time.Second)},
	}
	rq := func(at time.Duration, err error) workload.Request {
		return workload.Request{Start: t0.Add(at), End: t0.Add(at + 100*time.Millisecond), Err: err}
	}
	refused := errors.New("dial tcp 127.0.0.1:7445: connect: connection refused")
	eof := errors.New(`Get "https://127.0.0.1:7445/api": unexpected EOF`)
	results := map[string]workload.Results{
		"localproxy-1-x": {Gets: []workload.Request{rq(500*time.Millisecond, eof), rq(12*time.Second, eof), rq(13*time.Second, nil)},
			Writes: []workload.Request{rq(15*time.Second, refused)}},
		"kubectl-1-x":   {Gets: []workload.Request{rq(19*time.Second, errors.New("kubectl: exit status 1: The connection to the server 127.0.0.1:7445 was refused"))}},
		"transport-1-x": {Gets: []workload.Request{rq(12*time.Second, eof)}},
	}
	failed, nrefused := handoverFailures(results, windows)
	if failed != 3 || nrefused != 2 {
		t.Errorf("handoverFailures = %d failed, %d refused; want 3 and 2", failed, nrefused)
	}
}

// errorKind tells the errors client-go sends a GET again after from those
// it does not.
func TestErrorKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New(`Get "https://127.0.0.1:7445/api": http2: client connection force closed via ClientConn.Close`), "force closed"},
		{errors.New(`Get "https://127.0.0.1:7445/api": http2: client connection lost`), "lost"},
		{errors.New(`read tcp 127.0.0.1:1->127.0.0.1:7445: read: connection reset by peer`), "reset"},
		{errors.New(`Post "https://127.0.0.1:7445/api": unexpected EOF`), "EOF"},
		{errors.New(`the server has received too many requests and has asked us to try again later (post configmaps)`), "429"},
		{errors.New(`context deadline exceeded`), "timeout"},
		{errors.New(`something else`), "other"},
		{nil, "none"},
	} {
		if got := errorKind(tc.err); got != tc.want {
			t.Errorf("errorKind(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// maxFailover is, per fault kind and path, the longest stretch inside a
// window of that kind (and failoverGrace after it) in which a client of
// the path got no answer, whatever the path's other clients got; the
// CRUD workers, bursty by design, are not among them.
func TestMaxFailover(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 21, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ok := func(start, end float64) workload.Request { return workload.Request{Start: at(start), End: at(end)} }
	failed := workload.Request{Start: at(11), End: at(11.5), Err: errors.New("cut")}
	results := map[string]workload.Results{
		// Answers every 0.1s but from 10.2s to 11.9s (a failed one
		// between); 1.8s is the gap, from 10.1s to 11.9s.
		"localproxy-1-x": {Gets: append(append(series(ok, 0, 10.1), failed), series(ok, 11.9, 30)...)},
		// Never stops answering.
		"localproxy-2-x": {Gets: series(ok, 0, 30)},
		// The CRUD workers, left out: a cycle every 2s.
		"localproxy-workers-x": {Gets: []workload.Request{ok(0, 0.1), ok(14, 14.1)}},
		"transport-1-x":        {Gets: series(ok, 0, 30)},
	}
	windows := []window{
		{kind: Hang, server: 1, start: at(10), end: at(12)},
		{kind: Hang, server: 2, start: at(20), end: at(21)},
		{kind: Kill, server: 1, start: at(25), end: at(26)},
	}
	got := maxFailover(results, windows)
	want := map[string]float64{"hang/localproxy": 1.8, "hang/transport": 0.1, "kill/localproxy": 0.1, "kill/transport": 0.1}
	if len(got) != len(want) {
		t.Fatalf("maxFailover = %v, want %v", got, want)
	}
	for k, v := range want {
		if d := got[k] - v; d > 0.001 || d < -0.001 {
			t.Errorf("maxFailover[%s] = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// series is a request ending every 0.1s from from to to, each 0.05s long.
func series(ok func(start, end float64) workload.Request, from, to float64) []workload.Request {
	var out []workload.Request
	for s := from; s <= to+1e-9; s += 0.1 {
		out = append(out, ok(s-0.05, s))
	}
	return out
}
