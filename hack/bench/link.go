package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/apifailover/apifailover/hack/peers"
)

// The data path across a link: the throughput measurement again, with the
// sink in a network namespace of its own behind a veth pair shaped to a
// node NIC's rate each way (tc's token bucket filter; the veth's MTU,
// 1500, as an Ethernet NIC's), and fresh contenders in front of it. The
// client and the proxies are on this side, as kubelet and localproxy are
// on a node, and the sink across the link, as the apiservers are.
//
// On the bed's loopback the direct path is bound by the machine's CPU,
// and a proxy, whose bytes cross the kernel's TCP stack twice, gets about
// half of it however little it spends itself. On a node the link bounds
// the direct path, and the question is whether the proxy keeps up with
// it on the CPU the client leaves.

const (
	// linkHost is the veth end on the bench's side, linkSink the sink's.
	linkHost = "dplink0"
	linkSink = "dplink1"
	// The link's addresses, from a range no bed uses.
	linkHostAddr = "10.251.0.1"
	linkSinkAddr = "10.251.0.2"
	linkPrefix   = "/30"
	// linkLatency bounds the shaper's queue: what waits longer is
	// dropped, as at a NIC's full ring.
	linkLatency = "4ms"
	// linkMinBurst is the token bucket's least size in bytes: at least a
	// few full segments.
	linkMinBurst = 64 << 10
)

// defaultLinkRate is -datapath-link's default: a common NIC of a node.
const defaultLinkRate = "10gbit"

// The TCP settings that decide the link's throughput as much as the
// contenders do: on the bench's 2 cores, with BBR (paced, its rate from
// what the receiver acknowledges) every proxy fell 5-30% short of the
// link where CUBIC let localproxy reach it. Read in the bench's own
// network namespace (it runs in a private one) and the sink's; a new
// namespace takes the initial one's congestion control and buffer
// limits.
const (
	sysctlCC      = "/proc/sys/net/ipv4/tcp_congestion_control"
	sysctlAllowed = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
	sysctlRmem    = "/proc/sys/net/ipv4/tcp_rmem"
	sysctlWmem    = "/proc/sys/net/ipv4/tcp_wmem"
)

// LinkTCP is what the link's TCP connections ran with.
type LinkTCP struct {
	// CongestionControl is the bench's network namespace's (the client's
	// and the contenders' sockets: what sends the uploads across the
	// link), SinkCongestionControl the sink's namespace's (what sends the
	// downloads).
	CongestionControl     string `json:"congestion_control"`
	SinkCongestionControl string `json:"sink_congestion_control"`
	// Set: -datapath-link-cc chose them, for the measurement only; else
	// they are the machine's.
	Set bool `json:"set,omitempty"`
	// Rmem and Wmem are net.ipv4.tcp_rmem and tcp_wmem on this side,
	// SinkRmem and SinkWmem behind the link: min, default and max buffer
	// sizes, autotuning's bounds.
	Rmem     string `json:"tcp_rmem"`
	Wmem     string `json:"tcp_wmem"`
	SinkRmem string `json:"sink_tcp_rmem"`
	SinkWmem string `json:"sink_tcp_wmem"`
}

// readSysctl is the value in the /proc/sys file path, "" if unreadable.
func readSysctl(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return sysctlValue(string(b))
}

// sysctlValue is a /proc/sys file's text as sysctl prints it: its fields
// (tcp_rmem's are tab-separated) one space apart, no newline.
func sysctlValue(s string) string { return strings.Join(strings.Fields(s), " ") }

// readLinkTCP reads the TCP settings of this namespace, and of the
// namespace of process sink.
func readLinkTCP(sink int, set bool) LinkTCP {
	t := LinkTCP{CongestionControl: readSysctl(sysctlCC), Set: set, Rmem: readSysctl(sysctlRmem), Wmem: readSysctl(sysctlWmem)}
	out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(sink)+"/ns/net", "cat", sysctlCC, sysctlRmem, sysctlWmem).Output()
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); err == nil && len(lines) == 3 {
		t.SinkCongestionControl = sysctlValue(lines[0])
		t.SinkRmem = sysctlValue(lines[1])
		t.SinkWmem = sysctlValue(lines[2])
	}
	return t
}

// checkLinkCC checks -datapath-link-cc: "" (the machine's), or a
// congestion control allowed (the kernel lets a namespace other than the
// initial one make only those its default); allowed "" (unreadable):
// setting it will tell.
func checkLinkCC(cc, allowed string) error {
	if cc == "" || allowed == "" {
		return nil
	}
	have := strings.Fields(allowed)
	if !slices.Contains(have, cc) {
		return fmt.Errorf("-datapath-link-cc %q: not one the kernel allows (%s: %s); empty keeps the machine's", cc, sysctlAllowed, strings.Join(have, " "))
	}
	return nil
}

// setCC makes cc the congestion control of the TCP sockets created in
// this network namespace from now on, and returns what restores the one
// before.
func setCC(cc string) (restore func(), err error) {
	prev := readSysctl(sysctlCC)
	if err := os.WriteFile(sysctlCC, []byte(cc), 0o644); err != nil {
		return nil, fmt.Errorf("set %s to %s: %w", sysctlCC, cc, err)
	}
	return func() { _ = os.WriteFile(sysctlCC, []byte(prev), 0o644) }, nil
}

var linkRateRE = regexp.MustCompile(`^([1-9][0-9]{0,5})(mbit|gbit)$`)

// The link's rates: from one at which -datapath-mib's default takes
// minutes per contender to the fastest NICs.
const (
	linkMinBits = 100e6
	linkMaxBits = 400e9
)

// parseLinkRate checks -datapath-link: a rate as tc writes it, from
// 100mbit to 400gbit; "" or "none": no measurement across a link. It
// returns the rate in bits per second (0: none).
func parseLinkRate(s string) (uint64, error) {
	if s == "" || s == "none" {
		return 0, nil
	}
	bad := fmt.Errorf("-datapath-link %q: a rate from 100mbit to 400gbit such as 10gbit or 2500mbit (a whole number of mbit or gbit), or none", s)
	m := linkRateRE.FindStringSubmatch(s)
	if m == nil {
		return 0, bad
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	unit := uint64(1e6)
	if m[2] == "gbit" {
		unit = 1e9
	}
	if bits := n * unit; bits >= linkMinBits && bits <= linkMaxBits {
		return bits, nil
	}
	return 0, bad
}

// tbfArgs are tc's arguments that shape dev's egress to bits per second:
// a bucket of a millisecond at that rate (at least linkMinBurst), a
// queue of linkLatency.
func tbfArgs(dev string, bits uint64) []string {
	burst := max(bits/8/1000, linkMinBurst)
	return []string{"qdisc", "add", "dev", dev, "root", "tbf",
		"rate", strconv.FormatUint(bits, 10) + "bit", "burst", strconv.FormatUint(burst, 10), "latency", linkLatency}
}

// linkSteps are the commands that connect the network namespace of
// process pid to this one by a veth pair shaped to bits per second each
// way: linkHostAddr here, linkSinkAddr there.
func linkSteps(pid int, bits uint64, cc string) [][]string {
	ns := "--net=/proc/" + strconv.Itoa(pid) + "/ns/net"
	in := func(args ...string) []string { return append([]string{"nsenter", ns}, args...) }
	steps := [][]string{
		{"ip", "link", "add", linkHost, "type", "veth", "peer", "name", linkSink, "netns", strconv.Itoa(pid)},
		{"ip", "addr", "add", linkHostAddr + linkPrefix, "dev", linkHost},
		{"ip", "link", "set", linkHost, "up"},
		append([]string{"tc"}, tbfArgs(linkHost, bits)...),
		in("ip", "link", "set", "lo", "up"),
		in("ip", "addr", "add", linkSinkAddr+linkPrefix, "dev", linkSink),
		in("ip", "link", "set", linkSink, "up"),
		in(append([]string{"tc"}, tbfArgs(linkSink, bits)...)...),
	}
	if cc != "" {
		steps = append(steps, in("sysctl", "-qw", "net.ipv4.tcp_congestion_control="+cc))
	}
	return steps
}

// runSteps runs each command, stopping at the first that fails.
func runSteps(steps [][]string) error {
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// dropLink removes the bench's end of the link, and with it the pair
// (the sink's namespace also drops it when the sink exits).
func dropLink() { _ = exec.Command("ip", "link", "del", linkHost).Run() }

// startLinkedSink starts the sink, with cert and its files in dir, in a
// network namespace of its own, listening on ports on every address
// there, and connects it by a link shaped to bits per second; it returns
// the process and the addresses to reach the ports at.
func startLinkedSink(ctx context.Context, cert tls.Certificate, dir string, ports []int, bits uint64, cc string) (*proc, []string, error) {
	dropLink() // a previous run's, in this namespace
	var listen, reach []string
	for _, port := range ports {
		listen = append(listen, "0.0.0.0:"+strconv.Itoa(port))
		reach = append(reach, linkSinkAddr+":"+strconv.Itoa(port))
	}
	// The wait is for the last port the sink listens on (sinkMain takes
	// them last first), across the link: it proves the link carries and
	// every port listens.
	opts := peers.ProcOptions{NewNetns: true, Started: func(pid int) error { return runSteps(linkSteps(pid, bits, cc)) }}
	p, err := startSink(ctx, dir, cert, listen, reach[0], opts)
	if err != nil {
		dropLink()
		return nil, nil, err
	}
	return p, reach, nil
}

// runLink measures the throughput of the contenders names across a link
// of cfg.LinkBits per second.
func runLink(ctx context.Context, e *env, names []string, cfg datapathConfig, say func(string, ...any)) *DatapathLinkResults {
	r := &DatapathLinkResults{Rate: cfg.Link}
	fail := func(err error) *DatapathLinkResults {
		r.Error = err.Error()
		say("data path across a link: could not measure: %v", err)
		return r
	}
	var ports []int
	for i := range names {
		ports = append(ports, sinkBasePort+i)
	}
	dir := filepath.Join(e.dir, "datapath-link")
	sinkProc, reach, err := startLinkedSink(ctx, e.bed.ServingCertificate(), filepath.Join(dir, "sink"), ports, cfg.LinkBits, cfg.LinkCC)
	if err != nil {
		return fail(fmt.Errorf("start the sink behind a %s link (it needs veth links and tc's tbf, and sysctl for -datapath-link-cc; -datapath-link none skips it): %w", cfg.Link, err))
	}
	defer dropLink()
	defer sinkProc.stop()
	if cfg.LinkCC != "" {
		restore, err := setCC(cfg.LinkCC)
		if err != nil {
			return fail(err)
		}
		defer restore()
	}
	r.TCP = readLinkTCP(sinkProc.pid(), cfg.LinkCC != "")
	var cs []*dpContender
	defer func() {
		for _, c := range cs {
			c.stop()
		}
	}()
	say("data path across a %s link (veth, MTU 1500, tc tbf each way; TCP congestion control %s here, %s behind it): %s, fresh instances in front of the sink behind it", cfg.Link, r.TCP.CongestionControl, r.TCP.SinkCongestionControl, strings.Join(names, ", "))
	for i, name := range names {
		c, err := startDatapathContender(ctx, e, name, filepath.Join(dir, name), reach[i], cfg)
		if err != nil {
			return fail(fmt.Errorf("start %s: %w", name, err))
		}
		cs = append(cs, c)
	}
	rows, err := measureThroughput(ctx, cs, cfg, say)
	if err != nil {
		return fail(fmt.Errorf("throughput: %w", err))
	}
	r.Throughput = rows
	for _, row := range rows {
		say("    %s/%s: %.0f MiB/s (%s of direct), proxy CPU %.3fs/GiB, machine %.3fs/GiB (%.0f%% busy)", row.Direction, row.Path, row.MiBPerSec, fmtRatio(row.VsDirect), row.ProxyCPUPerGiB, row.MachineCPUPerGiB, 100*row.MachineBusy)
	}
	return r
}
