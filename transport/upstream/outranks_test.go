package upstream_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/apifailover/apifailover/transport/upstream"
)

// Outranks compares the candidate order's lasting keys only: zone and
// the static last resort, never stickiness or the tie hash, and only for
// a healthy first endpoint.
func TestOutranks(t *testing.T) {
	p := newPool(t, upstream.Config{Zone: "a"})
	mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "a"}, {Addr: addrB, Zone: "b"}, {Addr: addrC}})
	mustSet(t, p, upstream.SourceStatic, specs(addrD))
	assert.False(t, p.Outranks(addrA, addrB), "A is not healthy yet")
	for _, a := range []string{addrA, addrB, addrC, addrD} {
		p.ReportSuccess(a)
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{addrA, addrB, true},  // same zone over another zone
		{addrA, addrC, true},  // same zone over none
		{addrB, addrA, false}, // the other way
		{addrB, addrC, false}, // equals either way,
		{addrC, addrB, false}, // whichever is preferred
		{addrA, addrA, false},
		{addrB, addrD, true}, // discovered over static only
		{addrD, addrB, false},
		{addrA, "10.9.9.9:6443", false}, // not in the pool
	} {
		assert.Equal(t, tc.want, p.Outranks(tc.a, tc.b), "Outranks(%s, %s)", tc.a, tc.b)
	}
	p.ReportFailure(addrA, upstream.FailureConnLost, nil) // suspect, still healthy
	assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
	assert.False(t, p.Outranks(addrA, addrB), "suspect A")
	p.ReportSuccess(addrA)
	assert.True(t, p.Outranks(addrA, addrB), "A answered again")
	p.ReportFailure(addrB, upstream.FailureConnLost, nil)
	p.ReportFailure(addrB, upstream.FailureConnLost, nil)
	assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrB))
	assert.True(t, p.Outranks(addrA, addrB), "A outranks B anyway")
	assert.False(t, p.Outranks(addrB, addrC), "B is down")
	// An endpoint that is down is outranked by a healthy one whatever
	// their keys: its connections were made while it was down, the
	// drain having come before them.
	p.ReportFailure(addrC, upstream.FailureConnLost, nil)
	p.ReportFailure(addrC, upstream.FailureConnLost, nil)
	assert.Equal(t, upstream.StateUnhealthy, stateOf(t, p, addrC))
	assert.True(t, p.Outranks(addrD, addrC), "static-only D over C, down")
	assert.False(t, p.Outranks(addrC, addrD), "C is down")
	assert.False(t, p.Outranks(addrB, addrC), "both down")
}
