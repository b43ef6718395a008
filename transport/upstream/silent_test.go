package upstream_test

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/apifailover/apifailover/transport/upstream"
)

// A silent endpoint is suspect at once, so new connections go elsewhere,
// but however often it is reported it is not marked down: the probes
// decide.
func TestSilentMakesSuspectWithoutCountingTowardsFall(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 2})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrB)
	first := p.Candidates()[0]
	other := addrB
	if first == addrB {
		other = addrA
	}
	for range 5 {
		p.ReportFailure(first, upstream.FailureSilent, nil)
	}
	s := statusOf(t, p, first)
	assert.Equal(t, upstream.StateHealthy, s.State, "silence marked it down")
	assert.True(t, s.Suspect)
	assert.Equal(t, []string{other, first}, p.Candidates(), "new connections still go to the silent endpoint")

	// One real failure still counts as one towards Fall.
	p.ReportFailure(first, upstream.FailureDial, nil)
	assert.Equal(t, upstream.StateHealthy, statusOf(t, p, first).State)
}

// An answer lifts the suspicion and nothing else: a server that answers
// TLS may still fail /readyz, so it is no successful probe.
func TestReportAnsweredLiftsSuspicionOnly(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 2, Rise: 2})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrB)
	first := p.Candidates()[0]
	p.ReportFailure(first, upstream.FailureSilent, nil)
	require.NotEqual(t, first, p.Candidates()[0])
	second := p.Candidates()[0]
	p.ReportAnswered(first)
	assert.False(t, statusOf(t, p, first).Suspect)
	// Trusted again at once (the new preferred endpoint stays first: no
	// churn back), so it is first as soon as the other goes silent.
	p.ReportFailure(second, upstream.FailureSilent, nil)
	assert.Equal(t, first, p.Candidates()[0], "not trusted again")

	// Unhealthy stays unhealthy: answers do not count towards Rise.
	p.ReportFailure(first, upstream.FailureDial, nil)
	p.ReportFailure(first, upstream.FailureDial, nil)
	require.Equal(t, upstream.StateUnhealthy, statusOf(t, p, first).State)
	for range 3 {
		p.ReportAnswered(first)
	}
	assert.Equal(t, upstream.StateUnhealthy, statusOf(t, p, first).State)
}

// Among endpoints ranked alike, one with a connection waiting for its
// first byte goes after one with none, stickiness notwithstanding; a
// better-ranked endpoint keeps its place whatever waits on it. The
// preference does not move with the waiting: no EventPreferred, and the
// order is back to the preferred endpoint once nothing waits.
func TestWaitingBreaksTiesOnly(t *testing.T) {
	p := newPool(t, upstream.Config{})
	mustSet(t, p, upstream.SourceStatic, specs(addrA, addrB))
	p.ReportSuccess(addrA)
	p.ReportSuccess(addrB)
	first := p.Candidates()[0]
	other := addrB
	if first == addrB {
		other = addrA
	}
	var moved []string
	p.Subscribe(func(e upstream.Event) {
		if e.Kind == upstream.EventPreferred {
			moved = append(moved, e.Addr)
		}
	})
	p.AddWaiting(first, 1)
	assert.Equal(t, []string{other, first}, p.Candidates())
	assert.Equal(t, 1, statusOf(t, p, first).Waiting)
	assert.True(t, statusOf(t, p, first).Preferred, "still the preferred one")
	p.AddWaiting(other, 1)
	p.AddWaiting(other, 1)
	assert.Equal(t, first, p.Candidates()[0], "fewer waiting")
	p.AddWaiting(other, -1)
	p.AddWaiting(other, -1)
	p.AddWaiting(first, -1)
	assert.Equal(t, first, p.Candidates()[0], "back to the preferred once even")
	assert.Empty(t, moved, "waiting moved the preference")

	// Health ranks before waiting.
	p.ReportFailure(first, upstream.FailureSilent, nil)
	for range 3 {
		p.AddWaiting(other, 1)
	}
	assert.Equal(t, other, p.Candidates()[0], "a suspect endpoint went first for having fewer waiting")
	p.AddWaiting(addrA, -10)
	assert.Zero(t, statusOf(t, p, addrA).Waiting, "negative")
}

// This host running out of file descriptors (or buffers, or memory) says
// nothing about the endpoint: a probe or a dial failing that way must not
// mark it down, or a proxy at its descriptor limit would cut every
// connection to a healthy server.
func TestLocalExhaustionIsNotTheEndpoints(t *testing.T) {
	p := newPool(t, upstream.Config{Fall: 2})
	mustSet(t, p, upstream.SourceStatic, specs(addrA))
	p.ReportSuccess(addrA)
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		err := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", errno)}
		for range 3 {
			p.ReportFailure(addrA, upstream.FailureDial, err)
		}
		s := statusOf(t, p, addrA)
		assert.Equal(t, upstream.StateHealthy, s.State, "%v", errno)
		assert.False(t, s.Suspect, "%v", errno)
	}
	assert.True(t, upstream.IsLocalError(fmt.Errorf("probe: %w", &net.OpError{Err: os.NewSyscallError("socket", syscall.EMFILE)})))
	assert.False(t, upstream.IsLocalError(syscall.ECONNREFUSED))
}
