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
