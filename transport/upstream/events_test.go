package upstream_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

func TestEventOrder(t *testing.T) {
	p := newPool(t, upstream.Config{Rise: 1, Fall: 1})
	r := record(p)
	dialErr := errors.New("connection refused")

	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportSuccess(addrA)
	mustSet(t, p, upstream.SourceDiscovery, specs(addrB))
	p.ReportFailure(addrA, upstream.FailureDial, dialErr)
	mustSet(t, p, upstream.SourceStatic, nil)
	mustSet(t, p, upstream.SourceDiscovery, nil)

	evs := r.take()
	got := make([]ev, len(evs))
	for i, e := range evs {
		got[i] = ev{e.Kind, e.Addr, e.Prev, e.State}
	}
	assert.Equal(t, []ev{
		{Kind: upstream.EventAdded, Addr: addrA, State: upstream.StateUnknown},
		{Kind: upstream.EventPreferred, Addr: addrA, State: upstream.StateUnknown},
		{Kind: upstream.EventUp, Addr: addrA, State: upstream.StateHealthy},
		{Kind: upstream.EventAdded, Addr: addrB, State: upstream.StateUnknown},
		{Kind: upstream.EventDown, Addr: addrA, State: upstream.StateUnhealthy},
		{Kind: upstream.EventPreferred, Addr: addrB, Prev: addrA, State: upstream.StateUnknown},
		{Kind: upstream.EventRemoved, Addr: addrA, State: upstream.StateUnhealthy},
		{Kind: upstream.EventRemoved, Addr: addrB, State: upstream.StateUnknown},
	}, got)
	for _, e := range evs {
		if e.Kind == upstream.EventDown {
			assert.ErrorIs(t, e.Err, dialErr)
		} else {
			assert.NoError(t, e.Err, "%v", e.Kind)
		}
	}
}

func TestEventsNoSubscriber(t *testing.T) {
	// Events before the first subscription are not queued for it.
	p := newPool(t, upstream.Config{})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportSuccess(addrA)
	r := record(p)
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
	assert.Equal(t, []ev{{Kind: upstream.EventAdded, Addr: addrB}}, r.short())
}

func TestSubscriberReadsPool(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 1})
	var seen []string
	p.Subscribe(func(e upstream.Event) {
		// Everything a subscriber needs to react, from inside the callback.
		st := p.Status()
		c := p.Candidates()
		_, _ = p.Pick()
		_ = p.Healthy()
		_ = p.Len()
		_ = p.Has(e.Addr)
		_ = p.Usable(e.Addr)
		_ = p.Config()
		p.ConnClosed(e.Addr)
		p.Kick()
		if e.Kind == upstream.EventPreferred {
			require.NotEmpty(t, c)
			assert.Equal(t, e.Addr, c[0], "the pool is already updated when the event arrives")
			require.NotEmpty(t, st)
			assert.True(t, st[0].Preferred)
		}
		seen = append(seen, fmt.Sprintf("%v %s", e.Kind, e.Addr))
	})
	noDeadlock(t, "pool methods from a subscriber", func() {
		mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
		p.ReportSuccess(addrA)
		p.ReportFailure(addrA, upstream.FailureDial, nil)
		p.ReportFailure(addrB, upstream.FailureCertificate, nil)
		p.ResetQuarantine()
		mustSet(t, p, upstream.SourceStatic, nil)
	})
	assert.NotEmpty(t, seen)
}

// TestSubscriberChangesPool: a subscriber may change the pool, as
// Subscribe says ("It may call the pool's methods"). Every method that
// changes the pool (Set, Report*, ResetQuarantine) ends in flush; a flush
// called from a subscriber leaves its events to the delivery under way
// instead of waiting for it, which would deadlock.
// A realistic subscriber: on EventDown close the endpoint's connections,
// which reports them lost, or on EventRemoved drop it from a state file
// source with Set.
func TestSubscriberChangesPool(t *testing.T) {
	tests := []struct {
		name  string
		react func(p *upstream.Pool, e upstream.Event)
	}{
		{"ReportFailure", func(p *upstream.Pool, e upstream.Event) {
			p.ReportFailure(e.Addr, upstream.FailureConnLost, nil)
		}},
		{"ReportSuccess", func(p *upstream.Pool, e upstream.Event) {
			p.ReportSuccess(addrB)
		}},
		{"Set", func(p *upstream.Pool, e upstream.Event) {
			_ = p.Set(upstream.SourceStateFile, nil)
		}},
		{"ResetQuarantine", func(p *upstream.Pool, e upstream.Event) {
			p.ResetQuarantine()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each failure waits for noDeadlock's limit
			p := newPool(t, upstream.Config{Fall: 1})
			mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
			p.ReportSuccess(addrA)
			var once sync.Once
			p.Subscribe(func(e upstream.Event) {
				if e.Kind == upstream.EventDown {
					once.Do(func() { tt.react(p, e) })
				}
			})
			noDeadlock(t, "BUG: "+tt.name+" from a subscriber", func() {
				p.ReportFailure(addrA, upstream.FailureDial, nil)
			})
		})
	}
}

func TestUnsubscribe(t *testing.T) {
	p := newPool(t, upstream.Config{})
	var n1, n2 atomic.Int32
	cancel1 := p.Subscribe(func(upstream.Event) { n1.Add(1) })
	p.Subscribe(func(upstream.Event) { n2.Add(1) })

	mustSet(t, p, upstream.SourceStatic, specs(addrA)) // added, preferred
	assert.Equal(t, int32(2), n1.Load())
	assert.Equal(t, int32(2), n2.Load())

	cancel1()
	cancel1()              // idempotent
	p.ReportSuccess(addrA) // up
	assert.Equal(t, int32(2), n1.Load(), "no events after cancel")
	assert.Equal(t, int32(3), n2.Load(), "the other subscriber still gets them")
}

func TestUnsubscribeFromCallback(t *testing.T) {
	p := newPool(t, upstream.Config{})
	var n atomic.Int32
	var cancel func()
	cancel = p.Subscribe(func(upstream.Event) {
		n.Add(1)
		cancel()
	})
	noDeadlock(t, "cancel from a subscriber", func() {
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		p.ReportSuccess(addrA)
	})
	// Added and Preferred were queued together before the cancel took effect.
	assert.LessOrEqual(t, n.Load(), int32(2))
	before := n.Load()
	p.ReportFailure(addrA, upstream.FailureCertificate, nil)
	assert.Equal(t, before, n.Load())
}

// eventChecker replays events and checks that they form a valid history.
type eventChecker struct {
	mu        sync.Mutex
	state     map[string]upstream.State // present endpoints
	preferred string
	errs      []string
}

func (c *eventChecker) check(e upstream.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fail := func(format string, args ...any) {
		if len(c.errs) < 10 {
			c.errs = append(c.errs, fmt.Sprintf("%v %s: ", e.Kind, e.Addr)+fmt.Sprintf(format, args...))
		}
	}
	prev, present := c.state[e.Addr]
	switch e.Kind {
	case upstream.EventAdded:
		if present {
			fail("added twice")
		}
		c.state[e.Addr] = upstream.StateUnknown
	case upstream.EventRemoved:
		if !present {
			fail("removed but not present")
		}
		delete(c.state, e.Addr)
	case upstream.EventUp:
		if !present || prev == upstream.StateHealthy {
			fail("up from %v (present %v)", prev, present)
		}
		c.state[e.Addr] = e.State
	case upstream.EventDown:
		if !present || prev == e.State {
			fail("down to %v from %v (present %v)", e.State, prev, present)
		}
		c.state[e.Addr] = e.State
	case upstream.EventPreferred:
		if !present {
			fail("preferred but not present")
		}
		if e.Prev != c.preferred {
			fail("prev %q, want %q", e.Prev, c.preferred)
		}
		c.preferred = e.Addr
	default:
		fail("unknown kind")
	}
}

// TestConcurrent hammers the pool from many goroutines; run it with -race.
// Every subscriber must see a consistent history, in order.
func TestConcurrent(t *testing.T) {
	p := newPool(t, upstream.Config{Rise: 1, Fall: 2})
	const anchor = "10.0.9.9:6443" // static, never removed: the pool never empties
	mustSet(t, p, upstream.SourceStatic, specs(anchor))
	checkers := []*eventChecker{{state: map[string]upstream.State{anchor: upstream.StateUnknown}}}
	checkers[0].preferred = anchor
	checkers = append(checkers, &eventChecker{state: map[string]upstream.State{anchor: upstream.StateUnknown}, preferred: anchor})
	for _, c := range checkers {
		p.Subscribe(c.check)
	}
	var events atomic.Int64
	p.Subscribe(func(upstream.Event) {
		events.Add(1)
		_ = p.Status()
	})

	addrs := []string{addrA, addrB, addrC, addrD, addrE, anchor}
	sources := []upstream.Source{upstream.SourceDiscovery, upstream.SourceAltSvc, upstream.SourceStateFile}
	const workers, ops = 16, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				a := addrs[rnd.IntN(len(addrs))]
				switch rnd.IntN(10) {
				case 0:
					var s []string
					for _, x := range addrs[:5] {
						if rnd.IntN(2) == 0 {
							s = append(s, x)
						}
					}
					_ = p.Set(sources[rnd.IntN(len(sources))], specs(s...))
				case 1, 2:
					p.ReportSuccess(a)
				case 3, 4:
					p.ReportFailure(a, upstream.FailureDial, nil)
				case 5:
					p.ReportFailure(a, upstream.FailureGoAway, nil)
				case 6:
					p.ConnOpened(a)
					p.ConnClosed(a)
				case 7:
					if c := p.Candidates(); len(c) == 0 {
						t.Error("empty candidates")
						return
					}
				case 8:
					if _, err := p.Pick(); err != nil {
						t.Errorf("pick: %v", err)
						return
					}
				case 9:
					_ = p.Status()
					_ = p.Healthy()
					p.Kick()
				}
			}
		})
	}
	wg.Wait()

	assert.Positive(t, events.Load())
	for i, c := range checkers {
		assert.Empty(t, c.errs, "subscriber %d", i)
	}
	// The final state agrees with what the subscribers were told.
	st := p.Status()
	cand := p.Candidates()
	require.Len(t, cand, p.Len())
	seen := make(map[string]bool)
	for i, s := range st {
		assert.False(t, seen[s.Addr], "%s listed twice", s.Addr)
		seen[s.Addr] = true
		assert.Equal(t, cand[i], s.Addr)
		assert.GreaterOrEqual(t, s.Conns, 0)
		for _, c := range checkers {
			want, ok := c.state[s.Addr]
			assert.True(t, ok, "%s present", s.Addr)
			if s.State != upstream.StateUnknown { // no event for a lifted quarantine
				assert.Equal(t, want, s.State, "%s", s.Addr)
			}
		}
	}
	for _, c := range checkers {
		assert.Len(t, c.state, len(st))
		assert.Equal(t, cand[0], c.preferred)
	}
}
