package upstream_test

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

const (
	addrA = "10.0.0.1:6443"
	addrB = "10.0.0.2:6443"
	addrC = "10.0.0.3:6443"
	addrD = "10.0.0.4:6443"
	addrE = "10.0.0.5:6443"
	addrF = "10.0.0.6:6443"
)

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name string
		cfg  upstream.Config
		want upstream.Config // IsLocal and Prober are not compared
	}{
		{
			name: "zero",
			want: upstream.Config{Interval: time.Second, Timeout: time.Second, Jitter: 0.1, Rise: 2, Fall: 2, QuarantineBackoff: 5 * time.Second, QuarantineBackoffMax: 30 * time.Second, MaxConcurrentProbes: 32},
		},
		{
			name: "short interval bounds the default timeout",
			cfg:  upstream.Config{Interval: 200 * time.Millisecond},
			want: upstream.Config{Interval: 200 * time.Millisecond, Timeout: 200 * time.Millisecond, Jitter: 0.1, Rise: 2, Fall: 2, QuarantineBackoff: 5 * time.Second, QuarantineBackoffMax: 30 * time.Second, MaxConcurrentProbes: 32},
		},
		{
			name: "negative jitter disables it",
			cfg:  upstream.Config{Jitter: -1},
			want: upstream.Config{Interval: time.Second, Timeout: time.Second, Jitter: 0, Rise: 2, Fall: 2, QuarantineBackoff: 5 * time.Second, QuarantineBackoffMax: 30 * time.Second, MaxConcurrentProbes: 32},
		},
		{
			name: "a long quarantine backoff raises the default cap",
			cfg:  upstream.Config{QuarantineBackoff: time.Minute},
			want: upstream.Config{Interval: time.Second, Timeout: time.Second, Jitter: 0.1, Rise: 2, Fall: 2, QuarantineBackoff: time.Minute, QuarantineBackoffMax: time.Minute, MaxConcurrentProbes: 32},
		},
		{
			name: "explicit values kept",
			cfg: upstream.Config{Interval: 5 * time.Second, Timeout: 5 * time.Second, Jitter: 0.5, Rise: 1, Fall: 3, Zone: "z1",
				QuarantineBackoff: time.Second, QuarantineBackoffMax: 2 * time.Second, MaxConcurrentProbes: 4},
			want: upstream.Config{Interval: 5 * time.Second, Timeout: 5 * time.Second, Jitter: 0.5, Rise: 1, Fall: 3, Zone: "z1",
				QuarantineBackoff: time.Second, QuarantineBackoffMax: 2 * time.Second, MaxConcurrentProbes: 4},
		},
		{
			name: "negative MaxConcurrentProbes means no cap",
			cfg:  upstream.Config{MaxConcurrentProbes: -1},
			want: upstream.Config{Interval: time.Second, Timeout: time.Second, Jitter: 0.1, Rise: 2, Fall: 2,
				QuarantineBackoff: 5 * time.Second, QuarantineBackoffMax: 30 * time.Second, MaxConcurrentProbes: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := upstream.New(tt.cfg)
			require.NoError(t, err)
			got := p.Config()
			assert.NotNil(t, got.IsLocal, "a default IsLocal is installed")
			got.IsLocal = nil
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDefaultIsLocal(t *testing.T) {
	p, err := upstream.New(upstream.Config{})
	require.NoError(t, err)
	mustSet(t, p, upstream.SourceStatic, specs("127.0.0.1:6443", "[::1]:6443", "192.0.2.1:6443", "api.example.com:6443"))
	assert.True(t, statusOf(t, p, "127.0.0.1:6443").Local)
	assert.True(t, statusOf(t, p, "[::1]:6443").Local)
	assert.False(t, statusOf(t, p, "192.0.2.1:6443").Local, "TEST-NET-1 is not on this host")
	assert.False(t, statusOf(t, p, "api.example.com:6443").Local, "names are not resolved")
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  upstream.Config
		msg  string // the message must name the value
	}{
		{"negative interval", upstream.Config{Interval: -time.Second}, "interval -1s"},
		{"negative timeout", upstream.Config{Timeout: -time.Millisecond}, "timeout -1ms"},
		{"timeout above default interval", upstream.Config{Timeout: 2 * time.Second}, "timeout 2s"},
		{"timeout above interval", upstream.Config{Interval: 500 * time.Millisecond, Timeout: 600 * time.Millisecond}, "timeout 600ms must be positive and at most the interval 500ms"},
		{"jitter 1", upstream.Config{Jitter: 1}, "jitter 1 "},
		{"jitter 1.5", upstream.Config{Jitter: 1.5}, "jitter 1.5"},
		{"jitter +Inf", upstream.Config{Jitter: math.Inf(1)}, "jitter +Inf"},
		{"negative rise", upstream.Config{Rise: -1}, "rise -1"},
		{"negative fall", upstream.Config{Fall: -2}, "fall -2"},
		{"negative quarantine backoff", upstream.Config{QuarantineBackoff: -time.Second}, "quarantine backoff -1s"},
		{"quarantine backoff max below backoff", upstream.Config{QuarantineBackoff: 10 * time.Second, QuarantineBackoffMax: 5 * time.Second},
			"quarantine backoff max 5s must be at least the quarantine backoff 10s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := upstream.New(tt.cfg)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

// TestConfigJitterNaN: a NaN jitter is refused. It would pass every
// comparison in setDefaults, and nextInterval would convert NaN to a
// Duration, which is implementation-defined (math.MinInt64 on amd64): the
// timer would fire at once and Run probe in a busy loop.
func TestConfigJitterNaN(t *testing.T) {
	_, err := upstream.New(upstream.Config{Jitter: math.NaN()})
	require.Error(t, err, "BUG: a NaN jitter is accepted")
	assert.Contains(t, err.Error(), "jitter NaN")
}

func TestSet(t *testing.T) {
	t.Run("add", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		assert.Equal(t, 0, p.Len())
		mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
		assert.Equal(t, 2, p.Len())
		assert.True(t, p.Has(addrA))
		assert.True(t, p.Has(addrB))
		assert.False(t, p.Has(addrC))
		assert.ElementsMatch(t, []string{addrA, addrB}, p.Candidates())
		for _, s := range p.Status() {
			assert.Equal(t, upstream.SourceStatic, s.Sources)
			assert.Equal(t, upstream.StateUnknown, s.State)
			assert.False(t, s.Since.IsZero())
			assert.True(t, p.Usable(s.Addr), "unknown endpoints are usable")
		}
	})

	t.Run("canonical addresses", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs("[::ffff:10.0.0.1]:6443", "API.Example.com.:443"))
		assert.True(t, p.Has(addrA))
		assert.True(t, p.Has("api.example.com:443"))
		assert.False(t, p.Has("API.Example.com.:443"))
	})

	t.Run("duplicates collapse", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA, "[::ffff:10.0.0.1]:6443", addrA))
		assert.Equal(t, []string{addrA}, p.Candidates())
	})

	t.Run("replace per source", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		mustSet(t, p, upstream.SourceDiscovery, specs(addrB, addrC))
		assert.ElementsMatch(t, []string{addrB, addrC}, p.Candidates())
		mustSet(t, p, upstream.SourceDiscovery, nil)
		assert.Equal(t, 0, p.Len())
		assert.Empty(t, p.Candidates())
	})

	t.Run("kept while another source has it", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB))
		assert.Equal(t, upstream.SourceStatic|upstream.SourceDiscovery, statusOf(t, p, addrA).Sources)
		assert.Equal(t, upstream.SourceDiscovery, statusOf(t, p, addrB).Sources)

		mustSet(t, p, upstream.SourceAltSvc, specs(addrB))
		mustSet(t, p, upstream.SourceDiscovery, nil)
		assert.ElementsMatch(t, []string{addrA, addrB}, p.Candidates())
		assert.Equal(t, upstream.SourceStatic, statusOf(t, p, addrA).Sources)
		assert.Equal(t, upstream.SourceAltSvc, statusOf(t, p, addrB).Sources)

		mustSet(t, p, upstream.SourceAltSvc, nil)
		assert.Equal(t, []string{addrA}, p.Candidates())
	})

	t.Run("state survives a source change", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		p.ReportSuccess(addrA)
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		mustSet(t, p, upstream.SourceStatic, nil)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
	})

	t.Run("removal events", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA, addrB, addrC))
		p.ReportSuccess(addrB)
		r := record(p)

		mustSet(t, p, upstream.SourceDiscovery, specs(addrC))
		got := r.short()
		assert.Contains(t, got, ev{Kind: upstream.EventRemoved, Addr: addrB, State: upstream.StateHealthy})
		for _, e := range got {
			assert.NotEqual(t, addrA, e.Addr, "A is still static, it is not removed")
		}
		assert.ElementsMatch(t, []string{addrA, addrC}, p.Candidates())
	})

	t.Run("re-added endpoint starts over", func(t *testing.T) {
		p := newPool(t, upstream.Config{Fall: 1})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		p.ReportFailure(addrA, upstream.FailureDial, nil)
		p.ConnOpened(addrA)
		mustSet(t, p, upstream.SourceDiscovery, nil)
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		s := statusOf(t, p, addrA)
		assert.Equal(t, upstream.StateUnknown, s.State)
		assert.Equal(t, 0, s.Conns)
		assert.Empty(t, s.LastError)
	})

	t.Run("invalid specs reported while valid ones are applied", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		err := p.Set(upstream.SourceStatic, specs(addrA, "10.0.0.9", addrB, "", "bad_name:1"))
		require.Error(t, err)
		var ae *upstream.AddrError
		require.ErrorAs(t, err, &ae)
		assert.Contains(t, err.Error(), `"10.0.0.9"`)
		assert.Contains(t, err.Error(), `""`)
		assert.Contains(t, err.Error(), `"bad_name:1"`)
		assert.ElementsMatch(t, []string{addrA, addrB}, p.Candidates())
	})

	t.Run("only invalid specs still replace the source", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceDiscovery, specs(addrA))
		require.Error(t, p.Set(upstream.SourceDiscovery, specs("nonsense")))
		assert.Equal(t, 0, p.Len())
	})

	t.Run("zone kept when a source does not know it", func(t *testing.T) {
		p := newPool(t, upstream.Config{Zone: "z1"})
		mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "z1"}})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		assert.Equal(t, "z1", statusOf(t, p, addrA).Zone)
		mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "z2"}})
		assert.Equal(t, "z2", statusOf(t, p, addrA).Zone)
	})

	t.Run("zone change lifts quarantine", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "z1"}})
		p.ReportFailure(addrA, upstream.FailureCertificate, errors.New("x509: unknown authority"))
		require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA))

		mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "z1"}})
		assert.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA), "the same spec again changes nothing")
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		assert.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA), "another source without a zone changes nothing")

		mustSet(t, p, upstream.SourceDiscovery, []upstream.Spec{{Addr: addrA, Zone: "z2"}})
		s := statusOf(t, p, addrA)
		assert.Equal(t, upstream.StateUnknown, s.State)
		assert.Equal(t, "z2", s.Zone)
		p.ReportSuccess(addrA)
		assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
	})
}

// passive is a step of a passive-signal script.
type passive struct {
	ok bool
	f  upstream.Failure
}

var (
	ok       = passive{ok: true}
	dialErr  = passive{f: upstream.FailureDial}
	tlsErr   = passive{f: upstream.FailureTLS}
	lostErr  = passive{f: upstream.FailureConnLost}
	goAway   = passive{f: upstream.FailureGoAway}
	certErr  = passive{f: upstream.FailureCertificate}
	otherErr = passive{f: upstream.Failure(0)}
)

func TestStateMachinePassive(t *testing.T) {
	type want struct {
		state    upstream.State
		suspect  bool
		draining bool
	}
	var (
		healthy     = want{state: upstream.StateHealthy}
		suspect     = want{state: upstream.StateHealthy, suspect: true}
		draining    = want{state: upstream.StateHealthy, draining: true}
		unhealthy   = want{state: upstream.StateUnhealthy}
		quarantined = want{state: upstream.StateQuarantined}
	)
	tests := []struct {
		name       string
		rise, fall int
		steps      []passive
		want       []want // after each step
	}{
		{"unknown to healthy on first success", 3, 3,
			[]passive{ok}, []want{healthy}},
		{"unknown to unhealthy on first failure", 3, 3,
			[]passive{dialErr}, []want{unhealthy}},
		{"healthy to unhealthy after fall failures", 2, 3,
			[]passive{ok, dialErr, tlsErr, lostErr}, []want{healthy, suspect, suspect, unhealthy}},
		{"unclassified failure counts", 2, 2,
			[]passive{ok, otherErr, otherErr}, []want{healthy, suspect, unhealthy}},
		{"fall 1", 2, 1,
			[]passive{ok, dialErr}, []want{healthy, unhealthy}},
		{"a success resets the failure count", 2, 3,
			[]passive{ok, dialErr, dialErr, ok, dialErr, dialErr, dialErr},
			[]want{healthy, suspect, suspect, healthy, suspect, suspect, unhealthy}},
		{"unhealthy to healthy after rise successes", 3, 2,
			[]passive{dialErr, ok, ok, ok}, []want{unhealthy, unhealthy, unhealthy, healthy}},
		{"a failure resets the success count", 2, 2,
			[]passive{dialErr, ok, dialErr, ok, ok}, []want{unhealthy, unhealthy, unhealthy, unhealthy, healthy}},
		{"rise 1", 1, 2,
			[]passive{dialErr, ok}, []want{unhealthy, healthy}},
		{"fall counts from the healthy transition", 2, 2,
			[]passive{dialErr, ok, ok, dialErr, dialErr}, []want{unhealthy, unhealthy, healthy, suspect, unhealthy}},
		{"certificate failure quarantines a healthy endpoint", 2, 2,
			[]passive{ok, certErr, ok, ok, dialErr}, []want{healthy, quarantined, quarantined, quarantined, quarantined}},
		{"certificate failure quarantines an unknown endpoint", 2, 2,
			[]passive{certErr}, []want{quarantined}},
		{"certificate failure quarantines an unhealthy endpoint", 2, 2,
			[]passive{dialErr, certErr, goAway}, []want{unhealthy, quarantined, quarantined}},
		{"goaway drains without counting towards fall", 2, 2,
			[]passive{ok, goAway, goAway, goAway, goAway}, []want{healthy, draining, draining, draining, draining}},
		{"goaway cleared by a success", 2, 2,
			[]passive{ok, goAway, ok}, []want{healthy, draining, healthy}},
		{"goaway on unknown", 2, 2,
			[]passive{goAway, ok}, []want{{state: upstream.StateUnknown, draining: true}, healthy}},
		{"goaway then failures", 2, 2,
			[]passive{ok, goAway, dialErr, dialErr}, []want{healthy, draining, {state: upstream.StateHealthy, suspect: true, draining: true}, {state: upstream.StateUnhealthy, draining: true}}},
		{"goaway does not reset the failure count", 2, 2,
			[]passive{ok, dialErr, goAway, dialErr}, []want{healthy, suspect, {state: upstream.StateHealthy, suspect: true, draining: true}, {state: upstream.StateUnhealthy, draining: true}}},
		{"no steps", 2, 2, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Len(t, tt.want, len(tt.steps))
			p := newPool(t, upstream.Config{Rise: tt.rise, Fall: tt.fall})
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
			assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrA))
			for i, st := range tt.steps {
				if st.ok {
					p.ReportSuccess(addrA)
				} else {
					p.ReportFailure(addrA, st.f, fmt.Errorf("step %d", i))
				}
				s := statusOf(t, p, addrA)
				got := want{state: s.State, suspect: s.Suspect, draining: s.Draining}
				if s.State == upstream.StateUnhealthy {
					// Suspect on unhealthy endpoints: see TestSuspectOnlyBeforeFall.
					got.suspect = false
				}
				require.Equal(t, tt.want[i], got, "after step %d", i)
				if st.ok && s.State != upstream.StateQuarantined {
					assert.Empty(t, s.LastError, "after step %d", i)
				} else {
					assert.Contains(t, s.LastError, "step ", "after step %d", i)
				}
			}
		})
	}
}

func TestReportFailure(t *testing.T) {
	t.Run("nil error is named after the failure", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		p.ReportFailure(addrA, upstream.FailureConnLost, nil)
		assert.Equal(t, "conn_lost", statusOf(t, p, addrA).LastError)
	})

	t.Run("error wrapping ErrCertificate quarantines", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		r := record(p)
		err := fmt.Errorf("tls: %w", upstream.ErrCertificate)
		p.ReportFailure(addrA, upstream.FailureTLS, err)
		assert.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA))
		evs := r.take()
		require.NotEmpty(t, evs)
		assert.Equal(t, upstream.EventDown, evs[0].Kind)
		assert.Equal(t, upstream.StateQuarantined, evs[0].State)
		assert.ErrorIs(t, evs[0].Err, upstream.ErrCertificate)
		assert.False(t, p.Usable(addrA))
	})

	t.Run("unknown address ignored", func(t *testing.T) {
		p := newPool(t, upstream.Config{})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		p.ReportFailure(addrB, upstream.FailureDial, nil)
		p.ReportSuccess(addrB)
		p.ReportFailure("10.0.0.1", upstream.FailureCertificate, nil) // not canonical
		assert.False(t, p.Has(addrB))
		assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrA))
	})

	t.Run("since changes with the state only", func(t *testing.T) {
		p := newPool(t, upstream.Config{Fall: 3})
		mustSet(t, p, upstream.SourceStatic, specs(addrA))
		added := statusOf(t, p, addrA).Since
		p.ReportSuccess(addrA)
		up := statusOf(t, p, addrA).Since
		assert.False(t, up.Before(added))
		p.ReportFailure(addrA, upstream.FailureDial, nil) // suspect, still healthy
		assert.Equal(t, up, statusOf(t, p, addrA).Since)
	})
}

func TestResetQuarantine(t *testing.T) {
	p := newPool(t, upstream.Config{})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB, addrC))
	p.ReportSuccess(addrC)
	p.ReportFailure(addrA, upstream.FailureCertificate, nil)
	p.ReportFailure(addrB, upstream.FailureTLS, upstream.ErrCertificate)
	require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrA))
	require.Equal(t, upstream.StateQuarantined, stateOf(t, p, addrB))

	p.ResetQuarantine()
	assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrA))
	assert.Equal(t, upstream.StateUnknown, stateOf(t, p, addrB))
	assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrC), "other endpoints untouched")
	p.ReportSuccess(addrA)
	assert.Equal(t, upstream.StateHealthy, stateOf(t, p, addrA))
}

// TestSuspectOnlyBeforeFall: Status.Suspect means "the most recent
// observation failed, but not yet Fall in a row" (state.go). It is cleared
// on the way down, and later failures of an unhealthy endpoint do not set
// it again, so /status does not show unhealthy endpoints as suspect.
func TestSuspectOnlyBeforeFall(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 1})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportFailure(addrA, upstream.FailureDial, nil)
	s := statusOf(t, p, addrA)
	require.Equal(t, upstream.StateUnhealthy, s.State)
	require.False(t, s.Suspect, "cleared on the way down")

	p.ReportFailure(addrA, upstream.FailureDial, nil)
	s = statusOf(t, p, addrA)
	assert.Equal(t, upstream.StateUnhealthy, s.State)
	assert.False(t, s.Suspect, "BUG: an unhealthy endpoint is reported suspect after its next failure")
}

// TestHealthy checks Healthy against its documentation: "whether at least
// one endpoint is healthy".
func TestHealthy(t *testing.T) {
	tests := []struct {
		name  string
		setup func(p *upstream.Pool)
		want  bool
	}{
		{"empty", func(p *upstream.Pool) {}, false},
		{"unknown only", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
		}, false},
		{"one healthy", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
			p.ReportSuccess(addrB)
		}, true},
		{"all unhealthy", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
			p.ReportFailure(addrA, upstream.FailureDial, nil)
			p.ReportFailure(addrB, upstream.FailureDial, nil)
		}, false},
		{"healthy but draining, alone", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA))
			p.ReportSuccess(addrA)
			p.ReportFailure(addrA, upstream.FailureGoAway, nil)
		}, true},
		// A healthy endpoint that is draining or suspect ranks below an
		// unknown one: Healthy looks at every endpoint, not the first
		// candidate.
		{"healthy but draining, behind an unknown one", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
			p.ReportSuccess(addrA)
			p.ReportFailure(addrA, upstream.FailureGoAway, nil)
		}, true},
		{"healthy but suspect, behind an unknown one", func(p *upstream.Pool) {
			mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
			p.ReportSuccess(addrA)
			p.ReportFailure(addrA, upstream.FailureDial, nil)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, upstream.Config{Fall: 3})
			tt.setup(p)
			anyHealthy := false
			for _, s := range p.Status() {
				anyHealthy = anyHealthy || s.State == upstream.StateHealthy
			}
			require.Equal(t, tt.want, anyHealthy, "test setup")
			assert.Equal(t, tt.want, p.Healthy())
		})
	}
}

func TestUsable(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 1})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB, addrC, addrD))
	p.ReportSuccess(addrA)
	p.ReportFailure(addrC, upstream.FailureDial, nil)
	p.ReportFailure(addrD, upstream.FailureCertificate, nil)
	assert.True(t, p.Usable(addrA), "healthy")
	assert.True(t, p.Usable(addrB), "unknown")
	assert.False(t, p.Usable(addrC), "unhealthy")
	assert.False(t, p.Usable(addrD), "quarantined")
	assert.False(t, p.Usable(addrE), "not in the pool")
}

func TestConns(t *testing.T) {
	p := newPool(t, upstream.Config{})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))

	for range 3 {
		p.ConnOpened(addrA)
	}
	p.ConnClosed(addrA)
	assert.Equal(t, 2, statusOf(t, p, addrA).Conns)
	assert.Equal(t, 0, statusOf(t, p, addrB).Conns)

	for range 5 {
		p.ConnClosed(addrA)
	}
	assert.Equal(t, 0, statusOf(t, p, addrA).Conns, "never negative")
	p.ConnOpened(addrA)
	assert.Equal(t, 1, statusOf(t, p, addrA).Conns, "counts up again from zero")

	p.ConnOpened(addrC)
	p.ConnClosed(addrC)
	assert.False(t, p.Has(addrC), "unknown addresses are ignored")
	assert.Equal(t, 2, p.Len())

	p.ReportFailure(addrA, upstream.FailureCertificate, nil)
	assert.Equal(t, 1, statusOf(t, p, addrA).Conns, "state changes keep the count")
}
