//go:build linux

package endpoint_test

import (
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/internal/testnet"
	"github.com/apifailover/apifailover/transport/endpoint"
	"github.com/apifailover/apifailover/transport/upstream"
)

// refusedAddr returns an address on 127.0.0.1 nothing listens on: a
// connect to it is refused at once.
func refusedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// acceptingAddr returns the address of a listener on 127.0.0.1 that
// accepts connections and holds them until the test ends.
func acceptingAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return ln.Addr().String()
}

// dialRecorded dials cands with DialAny (a 20ms stagger, attempts of
// attempt), closes the connection, and returns its endpoint and the
// attempts' endpoints in the order they ended by then.
func dialRecorded(t *testing.T, p *upstream.Pool, cands []string, attempt time.Duration) (string, []string) {
	var mu sync.Mutex
	var ends []string
	d := &endpoint.Dialer{Pool: p, StaggerDelay: 20 * time.Millisecond, AttemptTimeout: attempt, Timeout: time.Minute,
		OnDial: func(addr string, _ time.Duration, err error) {
			mu.Lock()
			defer mu.Unlock()
			ends = append(ends, addr)
		}}
	conn, addr, err := d.DialAny(t.Context(), cands)
	require.NoError(t, err)
	conn.Close()
	mu.Lock()
	defer mu.Unlock()
	return addr, slices.Clone(ends)
}

// A healthy first candidate that fails at once is marked unhealthy
// (Fall 1), but that does not let a less healthy endpoint hedge the
// healthy attempt still in flight: the unhealthy but quick one starts
// only once the slow healthy one (its SYNs dropped) has timed out, in
// whichever order the pool's tie puts the two healthy ones.
func TestDialAnyHedgeBarOutlivesAFailure(t *testing.T) {
	refused, hung := refusedAddr(t), testnet.HungListener(t)
	notReady := acceptingAddr(t)

	p, err := upstream.New(upstream.Config{IsLocal: func(string) bool { return false }, Rise: 1, Fall: 1})
	require.NoError(t, err)
	require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: refused}, {Addr: hung}, {Addr: notReady}}))
	p.ReportSuccess(refused)
	p.ReportSuccess(hung)
	p.ReportFailure(notReady, upstream.FailureDial, errors.New("GET /readyz: 500"))
	cands := p.Candidates()
	require.Equal(t, notReady, cands[2], "the unhealthy one last: %v", cands)

	addr, ends := dialRecorded(t, p, cands, 500*time.Millisecond)
	assert.Equal(t, notReady, addr, "the only one that answers")
	require.Len(t, ends, 3, "%v", ends)
	assert.Less(t, slices.Index(ends, hung), slices.Index(ends, notReady),
		"the endpoint that is not ready started beside the healthy attempt, and won the race: %v", ends)
}

// Once the healthier attempts failed, the race goes on among the less
// healthy candidates with their own bar: an unhealthy candidate starts
// beside an unhealthy attempt in flight (here one whose SYNs are
// dropped) at the stagger, instead of waiting for its timeout.
func TestDialAnyHedgeBarFollowsTheAttemptsInFlight(t *testing.T) {
	refused, hung := refusedAddr(t), testnet.HungListener(t)
	reachable := acceptingAddr(t)

	// The unhealthy two in this order: the hung one in this proxy's
	// zone.
	p, err := upstream.New(upstream.Config{Zone: "a", IsLocal: func(string) bool { return false }, Rise: 1, Fall: 1})
	require.NoError(t, err)
	require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: refused, Zone: "a"}, {Addr: hung, Zone: "a"}, {Addr: reachable, Zone: "b"}}))
	p.ReportSuccess(refused)
	p.ReportFailure(hung, upstream.FailureDial, errors.New("i/o timeout"))
	p.ReportFailure(reachable, upstream.FailureDial, errors.New("GET /readyz: 500"))
	cands := p.Candidates()
	require.Equal(t, []string{refused, hung, reachable}, cands)

	addr, ends := dialRecorded(t, p, cands, 10*time.Second)
	assert.Equal(t, reachable, addr)
	if i := slices.Index(ends, hung); i >= 0 {
		assert.Greater(t, i, slices.Index(ends, reachable), "the reachable one waited for the hung attempt's timeout: %v", ends)
	}
}
