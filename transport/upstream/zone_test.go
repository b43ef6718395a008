package upstream_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// A zone set while the pool runs re-ranks the endpoints at once, with
// EventPreferred for the new first one; clearing it ignores zones again.
func TestSetZone(t *testing.T) {
	p := newPool(t, upstream.Config{})
	mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "a"}, {Addr: addrB, Zone: "b"}})
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrB)
	assert.Empty(t, p.Zone())
	first, err := p.Pick()
	require.NoError(t, err)
	other := addrA
	if first == addrA {
		other = addrB
	}
	otherZone := map[string]string{addrA: "a", addrB: "b"}[other]

	var mu sync.Mutex
	var evs []upstream.Event
	defer p.Subscribe(func(ev upstream.Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})()
	p.SetZone(otherZone)
	assert.Equal(t, otherZone, p.Zone())
	assert.Equal(t, otherZone, p.Config().Zone)
	assert.Equal(t, []string{other, first}, p.Candidates(), "the endpoint in the pool's new zone goes first")
	assert.True(t, p.Outranks(other, first), "same zone outranks another zone")
	mu.Lock()
	assert.Equal(t, []upstream.Event{{Kind: upstream.EventPreferred, Addr: other, Prev: first, State: upstream.StateHealthy}}, evs)
	evs = nil
	mu.Unlock()

	p.SetZone(otherZone) // no change, no event
	p.SetZone("")
	assert.False(t, p.Outranks(other, first), "zones ignored again")
	assert.Equal(t, other, p.Candidates()[0], "stickiness keeps the preferred endpoint among equals")
	mu.Lock()
	assert.Empty(t, evs)
	mu.Unlock()
}
