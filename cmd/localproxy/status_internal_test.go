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
		Origin: "api.example", Ready: true, Listeners: []string{"127.0.0.1:7445"}, ActiveConnections: 3,
		Upstreams: []localproxy.UpstreamStatus{{
			Status: upstream.Status{Addr: "10.0.0.1:6443", Preferred: true, Conns: 1, RTT: time.Millisecond, Since: now.Add(-time.Minute)},
			State:  "healthy", Sources: "static",
		}},
		Removed: []localproxy.RemovedUpstream{{Addr: "10.0.0.9:6443", Conns: 2, CloseBy: now.Add(7 * time.Second)}},
	}
	var b strings.Builder
	printStatus(&b, st, now)
	out := b.String()
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
