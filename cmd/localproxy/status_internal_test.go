package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/apifailover/apifailover/localproxy"
	"github.com/apifailover/apifailover/transport/upstream"
)

func TestPrintStatusShowsRemovedEndpoints(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	st := localproxy.Status{
		Origin: "api.example", PID: 4242, Ready: true, Listeners: []string{"127.0.0.1:7445"}, ActiveConnections: 3,
		Upstreams: []localproxy.UpstreamStatus{{
			Status: upstream.Status{Addr: "10.0.0.1:6443", Preferred: true, Conns: 1, RTT: time.Millisecond, Since: now.Add(-time.Minute)},
			State:  "healthy", Sources: "static",
		}},
		Removed: []localproxy.RemovedUpstream{{Addr: "10.0.0.9:6443", Conns: 2, CloseBy: now.Add(7 * time.Second)}},
	}
	var b strings.Builder
	printStatus(&b, st, now)
	out := b.String()
	assert.Contains(t, out, "pid: 4242", "which process answered: both do during a hand-over")
	assert.Contains(t, out, "10.0.0.1:6443  healthy *")
	var removed string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "10.0.0.9:6443") {
			removed = l
		}
	}
	assert.Contains(t, removed, "removed (draining)")
	assert.Contains(t, removed, " 2 ")
	assert.Contains(t, removed, "closed in 7s at the latest")
}

// The table says the proxy's zone and where it came from, or why there is
// none, and each endpoint's zone and locality.
func TestPrintStatusShowsZones(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	ups := []localproxy.UpstreamStatus{
		{Status: upstream.Status{Addr: "10.0.0.2:6443", Zone: "zone-a", Preferred: true}, State: "healthy", Sources: "static"},
		{Status: upstream.Status{Addr: "10.0.0.1:6443", Zone: "zone-b", Local: true}, State: "unhealthy", Sources: "static"},
		{Status: upstream.Status{Addr: "10.0.0.3:6443"}, State: "healthy", Sources: "discovery"},
	}
	for _, tc := range []struct {
		name string
		st   localproxy.Status
		zone string
		rows []string
	}{
		{"from the node", localproxy.Status{Zone: "zone-a", ZoneSource: "node", Node: "n1"}, "zone: zone-a (label topology.kubernetes.io/zone of node n1)",
			[]string{"10.0.0.2:6443  healthy *  static     same-zone  zone-a", "10.0.0.1:6443  unhealthy  static     local      zone-b", "10.0.0.3:6443  healthy    discovery  -          -"}},
		{"from the flag", localproxy.Status{Zone: "zone-b", ZoneSource: "config"}, "zone: zone-b (--zone)",
			[]string{"10.0.0.2:6443  healthy *  static     -         zone-a"}},
		{"not learned", localproxy.Status{ZoneSource: "none", Node: "n1", ZoneProblem: "node n1 has no topology.kubernetes.io/zone label"}, "zone: none (node n1 has no topology.kubernetes.io/zone label)", nil},
		{"not yet", localproxy.Status{ZoneSource: "none", Node: "n1"}, "zone: none yet (reading node n1)", nil},
		{"none", localproxy.Status{ZoneSource: "none"}, "zone: none", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Upstreams = ups
			var b strings.Builder
			printStatus(&b, tc.st, now)
			lines := strings.Split(b.String(), "\n")
			assert.Equal(t, tc.zone, lines[1], b.String())
			assert.Regexp(t, `^ENDPOINT +STATE +SOURCES +LOCALITY +ZONE +RTT`, lines[3])
			for _, r := range tc.rows {
				assert.Contains(t, b.String(), r)
			}
		})
	}
}
