package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/testbed/bedtest"
)

// The bench's tests run in a private network namespace: the link test
// adds a veth pair and shapes it. The test binary is the sink's too
// (startLinkedSink runs the binary it is in).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == sinkCommand {
		os.Exit(sinkMain(os.Args[2:]))
	}
	bedtest.Main(m, nil)
}

func TestParseLinkRate(t *testing.T) {
	for in, want := range map[string]uint64{"": 0, "none": 0, "10gbit": 10e9, "2500mbit": 2500e6, "100mbit": 100e6, "400gbit": 400e9, "400000mbit": 400e9} {
		if got, err := parseLinkRate(in); err != nil || got != want {
			t.Errorf("parseLinkRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"10", "10g", "10Gbit", "0gbit", "010gbit", "1.5gbit", "10kbit", "1000000gbit", "-1gbit", "10gbit ", "ten", "99mbit", "1mbit", "401gbit", "999999gbit"} {
		_, err := parseLinkRate(in)
		if err == nil {
			t.Errorf("parseLinkRate(%q): no error", in)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "-datapath-link") || !strings.Contains(msg, in) || !strings.Contains(msg, "from 100mbit to 400gbit") {
			t.Errorf("parseLinkRate(%q): %q does not name the flag, the value and what is allowed", in, msg)
		}
	}
}

func TestTBFArgs(t *testing.T) {
	// A millisecond at the rate; never less than linkMinBurst.
	if got, want := tbfArgs("x", 10e9), []string{"qdisc", "add", "dev", "x", "root", "tbf", "rate", "10000000000bit", "burst", "1250000", "latency", linkLatency}; !slices.Equal(got, want) {
		t.Errorf("tbfArgs(10gbit) = %v, want %v", got, want)
	}
	if got := tbfArgs("x", 1e6); got[9] != "65536" {
		t.Errorf("tbfArgs(1mbit) burst = %s, want %d", got[9], linkMinBurst)
	}
}

// The sink behind a link is reached across it, at the link's rate, and
// the link goes with the sink.
func TestLinkedSink(t *testing.T) {
	bedtest.Netns(t)
	for _, tool := range []string{"ip", "tc", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			if bedtest.Strict() {
				t.Fatalf("%s: %v", tool, err)
			}
			t.Skipf("%s: %v", tool, err)
		}
	}
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	cert := srv.TLS.Certificates[0]
	srv.Close()
	const bits = 50e6
	// reno is always built in and allowed; the sink's namespace would
	// otherwise take the initial namespace's.
	p, reach, err := startLinkedSink(context.Background(), cert, t.TempDir(), []int{7490, 7491}, bits, "reno")
	if err != nil {
		t.Fatal(err)
	}
	defer dropLink()
	defer p.stop()
	if want := []string{linkSinkAddr + ":7490", linkSinkAddr + ":7491"}; !slices.Equal(reach, want) {
		t.Errorf("reach = %v, want %v", reach, want)
	}
	// Both ends shaped.
	for _, cmd := range [][]string{{"tc", "qdisc", "show", "dev", linkHost}, {"nsenter", "--net=/proc/" + strconv.Itoa(p.pid()) + "/ns/net", "tc", "qdisc", "show", "dev", linkSink}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "rate 50Mbit") {
			t.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
	tcp := readLinkTCP(p.pid(), true)
	if tcp.SinkCongestionControl != "reno" || len(strings.Fields(tcp.SinkRmem)) != 3 || len(strings.Fields(tcp.SinkWmem)) != 3 {
		t.Errorf("behind the link: congestion control %q, tcp_rmem %q, tcp_wmem %q; want reno and three sizes each", tcp.SinkCongestionControl, tcp.SinkRmem, tcp.SinkWmem)
	}
	if tcp.CongestionControl != readSysctl(sysctlCC) || tcp.CongestionControl == "" || len(strings.Fields(tcp.Rmem)) != 3 || len(strings.Fields(tcp.Wmem)) != 3 {
		t.Errorf("this side: %+v", tcp)
	}
	buf := make([]byte, sinkBuffer)
	// 2 MiB at 50 Mbit/s take 0.34s; half of that allows for the bucket
	// and the clock. A slow machine only makes it longer.
	const n = 2 << 20
	least := time.Duration(float64(n*8) / bits * float64(time.Second) / 2)
	for _, mode := range []byte{sinkDiscard, sinkSource} {
		took, err := transfer(reach[0], mode, n, buf)
		if err != nil {
			t.Fatalf("%c across the link: %v", mode, err)
		}
		if took < least {
			t.Errorf("%c: 2 MiB across a 50 Mbit/s link in %s, under %s: not shaped", mode, took, least)
		}
	}
	if _, err := transfer(reach[1], sinkSource, 1<<10, buf); err != nil {
		t.Errorf("second port: %v", err)
	}
	// Only across the link: nothing listens on this side.
	if c, err := sinkDial("127.0.0.1:7490", sinkIdle, 0, time.Second); err == nil {
		c.Close()
		t.Error("the sink answered on this side's loopback")
	}
	p.stop()
	dropLink()
	if out, err := exec.Command("ip", "link", "show", linkHost).CombinedOutput(); err == nil {
		t.Errorf("%s still there after the sink stopped: %s", linkHost, out)
	}
}

func TestCheckLinkCC(t *testing.T) {
	for _, cc := range []string{"", "cubic", "bbr"} {
		if err := checkLinkCC(cc, "reno cubic bbr"); err != nil {
			t.Errorf("checkLinkCC(%q): %v", cc, err)
		}
	}
	if err := checkLinkCC("vegas", ""); err != nil {
		t.Errorf("checkLinkCC with the allowed list unreadable: %v; want none (setting it tells)", err)
	}
	for _, cc := range []string{"vegas", "Cubic", "cubic ", "reno cubic"} {
		err := checkLinkCC(cc, "reno cubic bbr")
		if err == nil {
			t.Errorf("checkLinkCC(%q): no error", cc)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "-datapath-link-cc") || !strings.Contains(msg, strconv.Quote(cc)) || !strings.Contains(msg, "reno cubic bbr") {
			t.Errorf("checkLinkCC(%q): %q does not name the flag, the value and what is allowed", cc, msg)
		}
	}
}

// setCC changes the namespace's congestion control, and restore puts
// the one before back.
func TestSetCC(t *testing.T) {
	bedtest.Netns(t)
	prev := readSysctl(sysctlCC)
	if prev == "" {
		t.Fatalf("%s unreadable", sysctlCC)
	}
	want := ""
	for _, cc := range strings.Fields(readSysctl(sysctlAllowed)) {
		if cc != prev {
			want = cc
			break
		}
	}
	if want == "" {
		t.Skipf("no congestion control allowed but %s", prev)
	}
	restore, err := setCC(want)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	if got := readSysctl(sysctlCC); got != want {
		t.Errorf("after setCC(%s): %s", want, got)
	}
	restore()
	if got := readSysctl(sysctlCC); got != prev {
		t.Errorf("after restore: %s, want %s", got, prev)
	}
}
