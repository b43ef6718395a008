package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/workload"
)

// TestBoard feeds a lane's events to the board as its workload would and
// reads the table's figures: requests in the last second, the apiserver,
// blind times, the down mark and the log lines.
func TestBoard(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := newBoard(f)
	if b.tty {
		t.Fatal("a file taken for a terminal")
	}
	b.begin("fault 1 of 1: hang")
	down := false
	b.addLane(&lane{name: laneHAProxy, down: func(string) bool { return down }}, 2*time.Second)
	ev := b.onEvent(laneHAProxy)
	now := time.Now()
	ev(workload.Event{Kind: workload.KindServing, Serving: "10.250.0.1:6443", Time: now})
	ev(workload.Event{Kind: workload.KindGet, Time: now.Add(-3 * time.Second)}) // out of the last second
	ev(workload.Event{Kind: workload.KindGet, Time: now})
	ev(workload.Event{Kind: workload.KindWrite, Time: now})
	b.faulted("HANG apiserver-1", "10.250.0.1:6443")
	ev(workload.Event{Kind: workload.KindGet, Time: now, Err: errors.New("context deadline exceeded"), Latency: 10 * time.Second})
	ev(workload.Event{Kind: workload.KindGet, Time: now, Err: errors.New("context deadline exceeded")})
	ev(workload.Event{Kind: workload.KindServing, Serving: "10.250.0.2:6443", Time: now})
	ev(workload.Event{Kind: workload.KindList, Time: now})
	ev(workload.Event{Kind: workload.KindList, Time: now})
	b.pollDown()
	if d := b.downAfter(laneHAProxy); d >= 0 {
		t.Fatalf("marked down at %s while the lane's view says up", d)
	}
	down = true
	b.pollDown()
	if d := b.downAfter(laneHAProxy); d < 0 {
		t.Fatal("not marked down once the lane's view says down")
	}
	_, _, rows := b.rows()
	if len(rows) != 1 {
		t.Fatalf("rows = %+v, want one", rows)
	}
	r := rows[0]
	if r.ok != 2 || r.failed != 2 || r.serving != "10.250.0.2:6443" {
		t.Errorf("row = %+v, want 2 ok, 2 failed, on 10.250.0.2:6443", r)
	}
	if r.longest < 3*time.Second {
		t.Errorf("longest blind %s, want the 3s between the two successful GETs", r.longest)
	}
	if line := b.plain(); !strings.Contains(line, "haproxy 2 ok 2 failed on 10.250.0.2:6443") {
		t.Errorf("plain line %q", line)
	}
	table := strings.Join(b.table(), "\n")
	for _, want := range []string{"HANG apiserver-1", "marked down", "haproxy"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"first failed request: get after 10s: context deadline exceeded", "now on 10.250.0.2:6443", "informer relisted", "marked 10.250.0.1:6443 down"} {
		if n := strings.Count(string(out), want); n != 1 {
			t.Errorf("log has %q %d times, want once:\n%s", want, n, out)
		}
	}
}

func TestSummarize(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	victim, other := "10.250.0.1:6443", "10.250.0.2:6443"
	res := workload.Results{
		Gets: []workload.Request{
			{Start: at(-time.Second), End: at(-900 * time.Millisecond), Serving: victim},
			{Start: at(-100 * time.Millisecond), End: at(10 * time.Second), Serving: other, Err: errors.New("timeout")},
			{Start: at(100 * time.Millisecond), End: at(400 * time.Millisecond), Serving: other},
			{Start: at(time.Second), End: at(1100 * time.Millisecond), Serving: other},
		},
		Writes: []workload.Request{{Start: at(50 * time.Millisecond), End: at(60 * time.Millisecond), Err: errors.New("EOF")}},
	}
	o := summarize("hang", laneTransport, victim, t0, at(2*time.Second), res)
	if o.to != other || o.failover != 400*time.Millisecond || o.gets != 3 || o.gbad != 1 || o.writes != 1 || o.wbad != 1 {
		t.Fatalf("outcome %+v: want failover to %s after 400ms, 1/3 GETs and 1/1 creates failed", o, other)
	}
	if o.blind != 900*time.Millisecond {
		t.Errorf("blind %s, want 900ms (1.1s to the end at 2s)", o.blind)
	}
}
