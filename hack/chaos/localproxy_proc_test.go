package chaos

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/apifailover/apifailover/transport/upstream"
)

// eventOf reads back, from the JSON lines a pool logs through log/slog as
// cmd/localproxy's --log-format=json does, the down, up and preferred
// events the pool delivered to its subscribers, in order. It fails if
// the pool's log lines change so that the soak could no longer read
// localproxy's events.
func TestEventOfReadsThePoolsLogLines(t *testing.T) {
	var buf bytes.Buffer
	log := logr.FromSlogHandler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.Level(-proxyLogLevel)}))
	p, err := upstream.New(upstream.Config{Rise: 1, Fall: 1, Logger: log, IsLocal: func(string) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	var want []upstream.Event
	defer p.Subscribe(func(ev upstream.Event) {
		switch ev.Kind {
		case upstream.EventUp, upstream.EventDown, upstream.EventPreferred:
			ev.Err = nil
			want = append(want, ev)
		}
	})()
	const a, b = "10.0.0.1:6443", "10.0.0.2:6443"
	if err := p.Set(upstream.SourceStatic, []upstream.Spec{{Addr: a}, {Addr: b}}); err != nil {
		t.Fatal(err)
	}
	p.ReportSuccess(a)
	p.ReportSuccess(b)
	p.ReportFailure(a, upstream.FailureDial, errors.New("connection refused"))
	p.ReportSuccess(a)

	var got []upstream.Event
	for l := range strings.SplitSeq(buf.String(), "\n") {
		if ev, ok := eventOf([]byte(l)); ok {
			got = append(got, ev)
		}
	}
	kinds := map[upstream.EventKind]int{}
	for _, ev := range want {
		kinds[ev.Kind]++
	}
	if kinds[upstream.EventUp] < 2 || kinds[upstream.EventDown] != 1 || kinds[upstream.EventPreferred] < 1 {
		t.Fatalf("the pool delivered %v: want ups, a down and a preferred change to compare", want)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events from the log, the pool delivered %d:\nread %+v\ndelivered %+v\nlog:\n%s", len(got), len(want), got, want, buf.String())
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.Kind != w.Kind || g.Addr != w.Addr || (w.Kind == upstream.EventPreferred && g.Prev != w.Prev) || (w.Kind != upstream.EventPreferred && g.State != w.State) {
			t.Errorf("event %d: read %+v, the pool delivered %+v", i, g, w)
		}
	}
	for _, l := range []string{"", "not json", `{"msg":"endpoint down"}`, `{"msg":"endpoint removed","addr":"10.0.0.1:6443"}`, `{"msg":"endpoint down","addr":`} {
		if ev, ok := eventOf([]byte(l)); ok {
			t.Errorf("eventOf(%q) = %+v, want none", l, ev)
		}
	}
}

func TestHandedOver(t *testing.T) {
	logs := `{"time":"2026-11-26T20:00:00Z","level":"INFO","msg":"successor listening; handing over","ready":true,"waited":"42ms"}
{"time":"2026-11-26T20:00:01Z","level":"INFO","msg":"successor listening; handing over","ready":false,"waited":"2s"}
{"time":"2026-11-26T20:00:02Z","level":"INFO","msg":"proxy stopped","ready":true}
`
	if n := handedOver(logs); n != 1 {
		t.Errorf("handedOver = %d, want 1 (the other did not wait for a ready successor)", n)
	}
}

// lineWriter passes on whole lines, however the writes split them, and
// the last one without its newline at flush; everything reaches the file.
func TestLineWriter(t *testing.T) {
	var file bytes.Buffer
	var lines []string
	w := &lineWriter{w: &file, line: func(l []byte) { lines = append(lines, string(l)) }}
	for _, p := range []string{"fir", "st\nsec", "ond\n", "\nthird\nfou", "rth"} {
		w.Write([]byte(p))
	}
	if want := []string{"first", "second", "", "third"}; strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Errorf("lines before flush = %q, want %q", lines, want)
	}
	w.flush()
	if lines[len(lines)-1] != "fourth" {
		t.Errorf("flush passed on %q, want the last line", lines[len(lines)-1])
	}
	if file.String() != "first\nsecond\n\nthird\nfourth" {
		t.Errorf("file = %q", file.String())
	}
}

// A process's sockets are told apart by inode: the accepted one has the
// listen port as its local port, the client one is connected to the
// listener's address; both are gone from the count once closed.
func TestTCPTableCountsAProcesssSockets(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	accepted := func(s tcpSocket) bool { return s.localPort == port && s.connected() }
	tab := readTCPTable()
	if n := tab.count(pid, accepted); n != 1 {
		t.Errorf("accepted sockets on port %d = %d, want 1", port, n)
	}
	if n := tab.socketsTo(pid, ln.Addr().String()); n != 1 {
		t.Errorf("sockets connected to %s = %d, want 1", ln.Addr(), n)
	}
	if n := tab.count(1<<30, accepted); n != 0 {
		t.Errorf("a process that does not exist has %d sockets", n)
	}
	all, sockets, _ := countFDKinds(pid)
	if sockets < 3 || all < sockets {
		t.Errorf("countFDKinds = %d descriptors, %d sockets; want at least the listener and both ends", all, sockets)
	}
	c.Close()
	s.Close()
	tab = readTCPTable()
	if n := tab.count(pid, accepted) + tab.socketsTo(pid, ln.Addr().String()); n != 0 {
		t.Errorf("%d sockets counted after both ends closed", n)
	}
}

// The RSS bound is the memory limit of the DaemonSet we ship.
func TestDaemonSetMemoryLimit(t *testing.T) {
	limit, err := daemonSetMemoryLimit()
	if err != nil {
		t.Fatal(err)
	}
	if limit != 256<<20 {
		t.Errorf("daemonSetMemoryLimit = %d bytes, want the manifest's 256Mi", limit)
	}
}

// The attack's connections come from attackSource: its sockets are told
// apart from the load's by address.
func TestAttackSourceTellsSocketsApart(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attackSource)}}
	c, err := d.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatalf("cannot connect from %s, which the soak's attack does: %v", attackSource, err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	from := procIP(attackSource)
	tab := readTCPTable()
	port := ln.Addr().(*net.TCPAddr).Port
	if n := tab.count(os.Getpid(), func(s tcpSocket) bool { return s.localIP == from }); n != 1 {
		t.Errorf("sockets from %s = %d, want the attacker's 1", attackSource, n)
	}
	if n := tab.count(os.Getpid(), func(s tcpSocket) bool { return s.localPort == port && s.remoteIP == from }); n != 1 {
		t.Errorf("accepted sockets from %s = %d, want 1", attackSource, n)
	}
	if n := tab.count(os.Getpid(), func(s tcpSocket) bool { return s.remotePort == port && s.localIP != from }); n != 1 {
		t.Errorf("other sockets to the listener = %d, want the one from 127.0.0.1", n)
	}
}

// The prober's lines are counted as the soak's /readyz figures: 200, 503,
// and an error or any other status as a miss, with when it happened.
func TestOnProbe(t *testing.T) {
	began := time.Date(2026, 11, 26, 20, 0, 0, 0, time.UTC)
	b := &badInput{began: began}
	for _, l := range []string{
		`{"start":"2026-11-26T20:00:01Z","seconds":0.01,"status":200}`,
		`{"start":"2026-11-26T20:00:02Z","seconds":0.4,"status":503}`,
		`{"start":"2026-11-26T20:00:03.5Z","seconds":1.0,"error":"context deadline exceeded"}`,
		`{"start":"2026-11-26T20:00:04Z","seconds":0.02,"status":500}`,
		`not json`,
	} {
		b.onProbe([]byte(l))
	}
	r := b.rep
	if r.Readyz != 4 || r.ReadyzOK != 1 || r.Readyz503 != 1 || r.ReadyzMissed != 2 {
		t.Errorf("probes %d, 200 %d, 503 %d, missed %d; want 4, 1, 1, 2", r.Readyz, r.ReadyzOK, r.Readyz503, r.ReadyzMissed)
	}
	if len(r.ReadyzMissedAt) != 1 || r.ReadyzMissedAt[0] != "3.5s: context deadline exceeded" {
		t.Errorf("missed at %q", r.ReadyzMissedAt)
	}
	if r.ReadyzSlowest != 0.4 {
		t.Errorf("slowest %v, want 0.4 (the answered probes')", r.ReadyzSlowest)
	}
}
