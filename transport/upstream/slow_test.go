package upstream_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

func slowOf(p *upstream.Pool, addr string) bool {
	for _, s := range p.Status() {
		if s.Addr == addr {
			return s.Slow
		}
	}
	return false
}

// Two lost races in a row demote the first candidate for 5s; the demotion
// lifts by itself; one more lost race then demotes it again, for twice as
// long; a won race lifts it at once.
func TestSlowDemotionLiftsAndDoubles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := upstream.New(upstream.Config{IsLocal: func(string) bool { return false }})
		require.NoError(t, err)
		const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
		require.NoError(t, p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: a}, {Addr: b}}))
		first := p.Candidates()[0]
		other := a
		if first == a {
			other = b
		}

		p.ReportDialRace(first, false)
		assert.False(t, slowOf(p, first), "one lost race is noise")
		p.ReportDialRace(first, false)
		require.True(t, slowOf(p, first))
		assert.Equal(t, other, p.Candidates()[0])

		time.Sleep(5*time.Second + time.Millisecond)
		p.Candidates() // the order is read: the demotion ran out
		assert.False(t, slowOf(p, first), "lifted after 5s")

		p.ReportDialRace(first, false) // one more loss: demoted again
		require.True(t, slowOf(p, first))
		time.Sleep(5*time.Second + time.Millisecond)
		p.Candidates()
		assert.True(t, slowOf(p, first), "the second demotion lasts 10s")
		time.Sleep(5 * time.Second)
		p.Candidates()
		assert.False(t, slowOf(p, first))

		p.ReportDialRace(first, false)
		require.True(t, slowOf(p, first))
		p.ReportDialRace(first, true)
		assert.False(t, slowOf(p, first), "a won race lifts it")
		p.ReportDialRace(first, false)
		assert.False(t, slowOf(p, first), "and resets the count")
	})
}
