// Command bench compares apifailover's client paths with the load
// balancers clusters put in front of kube-apiserver today, on a real
// control plane (hack/testbed: etcd and three kube-apiservers in a private
// network namespace), in one run:
//
//   - direct: client-go straight to one apiserver, the baseline;
//   - transport: client-go with transport.Wrap, in process;
//   - localproxy: client-go through the localproxy binary;
//   - haproxy, nginx: client-go through HAProxy and nginx configured as
//     kubespray configures its node-local apiserver load balancer (see
//     peers.go).
//
// Overhead: GETs (sequential, concurrent, on new connections) and LISTs
// through every path, interleaved in rounds, reported as p50/p99 latency
// and throughput with ratios against the direct path of the same run.
//
// Failover: for each fault (SIGKILL, SIGSTOP, blackhole, graceful SIGTERM)
// and path, a fresh path instance carries hack/workload's client (informer,
// creates, GETs); the fault hits the apiserver carrying its traffic; the
// run records when the path marked it down, the first GET answered
// elsewhere, failed requests, whether the informer relisted or missed
// events, and the connections still open to the faulted server after 10s.
// The apiserver is restored between runs.
//
// New connections: a client that opens a new TCP+TLS connection for every
// request (GET /version, 20 a second, 3s deadline: a shell loop of kubectl
// calls, a CNI plugin) runs through each L4 contender (localproxy,
// HAProxy, nginx) side by side, fresh instances for each fault; the fault
// hits localproxy's preferred apiserver (HAProxy and nginx spread new
// connections over all three). It records failed requests, the outage
// (first to last failed request) and the connections each contender sent
// to the faulted apiserver; then, with no fault, the same clients for a
// minute while processes burn every CPU, counting failures and the times
// a contender's health view counted an apiserver down or suspect.
// -newconn-only runs just this.
//
// Data path: each L4 contender (localproxy, HAProxy, nginx; fresh
// instances, side by side, configured as in front of the apiservers) in
// front of a synthetic TCP sink in the bed's network namespace that passes
// their health checks: bulk throughput each way (MiB/s, CPU seconds of the
// proxy's processes per GiB; direct to the sink is the limit), short
// connections one at a time (a request, 2 KiB back, the sink's close:
// CPU per connection; -short-conns), then the proxy's RSS and file
// descriptors at rest and holding 1,000 and 10,000 idle connections
// (-idle-conns), one contender at a time.
// -datapath-only runs just this.
//
// Health cost at rest and in use: -cost-clients clients of one kind at a
// time (-cost-contenders: transport.Wrap and localproxy, probing readyz
// and held, held also with one client connection open, idle or with a
// request every -cost-active-gap; HAProxy as kubespray configures it and
// checking every second; direct connections with the same requests and
// no health check) against the three apiservers, for -cost-window; the
// apiservers' CPU time per client per second, their own at rest taken
// off, and above direct's in use, and the clients' own. -cost-only runs
// just this.
//
// No timing is pass or fail: the command fails only when it could not
// measure (a proxy did not start, the bed did not come up). Results go to
// _output/bench/results.json and results.md, charts beside them
// (charts.go): failover-<fault>.svg, overhead-<op>.svg. Run it with `make bench` or
// `go run ./hack/bench` (as root: it installs haproxy and nginx with
// hack/tools/ensure-deps.sh --bench).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
)

// options are the command's flags.
type options struct {
	paths, faults  string
	costContenders string
	skipOverhead   bool
	skipFailover   bool
	skipNewConn    bool
	newConnOnly    bool
	skipDatapath   bool
	datapathOnly   bool
	idleConns      string
	skipCost       bool
	costOnly       bool
	cost           costConfig
	overhead       overheadConfig
	newConn        newConnConfig
	datapath       datapathConfig
	window         time.Duration
	out            string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == sinkCommand {
		os.Exit(sinkMain(os.Args[2:]))
	}
	var o options
	flag.StringVar(&o.paths, "paths", strings.Join(allPaths, ","), "comma-separated paths to measure (direct is the baseline of the overhead ratios)")
	flag.StringVar(&o.faults, "faults", "kill,hang,blackhole,graceful", "comma-separated faults for the failover runs")
	flag.BoolVar(&o.skipOverhead, "skip-overhead", false, "skip the overhead measurement")
	flag.BoolVar(&o.skipFailover, "skip-failover", false, "skip the failover runs")
	flag.IntVar(&o.overhead.Rounds, "rounds", 5, "interleaved rounds of the overhead measurement")
	flag.IntVar(&o.overhead.GetSeq, "get-seq", 1000, "sequential GETs per path")
	flag.IntVar(&o.overhead.GetSparse, "get-sparse", 100, "sparse GETs per path: sequential, each after -sparse-gap")
	flag.DurationVar(&o.overhead.SparseGap, "sparse-gap", 50*time.Millisecond, "pause before each sparse GET (a node agent's pace)")
	flag.IntVar(&o.overhead.GetConc, "get-concurrent", 2000, "concurrent GETs per path")
	flag.IntVar(&o.overhead.Concurrency, "concurrency", 16, "goroutines of the concurrent GETs")
	flag.IntVar(&o.overhead.Lists, "lists", 1000, "LISTs per path (their CPU ratios need a thousand on a shared machine: with 300, one run's ratio strayed by 0.1)")
	flag.IntVar(&o.overhead.ListObjects, "list-objects", 300, "ConfigMaps the LIST returns")
	flag.IntVar(&o.overhead.ListBytes, "list-object-bytes", 1024, "payload bytes per listed ConfigMap")
	flag.IntVar(&o.overhead.NewConn, "new-conn", 500, "GETs on new connections per path")
	flag.DurationVar(&o.window, "window", 90*time.Second, "how long to observe each fault at most")
	flag.BoolVar(&o.skipNewConn, "skip-newconn", false, "skip the new-connection-per-request runs")
	flag.BoolVar(&o.newConnOnly, "newconn-only", false, "run only the new-connection-per-request runs (the -faults, then the loaded run)")
	flag.IntVar(&o.newConn.Rate, "newconn-rate", 20, "new-connection requests per second per contender")
	flag.DurationVar(&o.newConn.Timeout, "newconn-timeout", 3*time.Second, "deadline of each new-connection request")
	flag.DurationVar(&o.newConn.Window, "newconn-window", 60*time.Second, "how long each fault of the new-connection runs is observed")
	flag.DurationVar(&o.newConn.Loaded, "newconn-loaded", 60*time.Second, "length of the loaded new-connection run without a fault (0: none)")
	flag.IntVar(&o.newConn.Burners, "newconn-burners", runtime.NumCPU(), "CPU-burning processes during the loaded new-connection run")
	flag.BoolVar(&o.skipDatapath, "skip-datapath", false, "skip the data-path measurement (throughput, idle connections)")
	flag.BoolVar(&o.datapathOnly, "datapath-only", false, "run only the data-path measurement")
	flag.IntVar(&o.datapath.MiB, "datapath-mib", 1024, "MiB each way through each contender in the throughput measurement")
	flag.IntVar(&o.datapath.Rounds, "datapath-rounds", 4, "interleaved rounds of the throughput measurement")
	flag.StringVar(&o.datapath.Link, "datapath-link", defaultLinkRate, "rate of the link (veth, shaped with tc tbf each way) the throughput is measured across again, with the sink behind it as an apiserver is behind a node's NIC: a whole number of mbit or gbit, or none")
	flag.StringVar(&o.datapath.LinkCC, "datapath-link-cc", "", "TCP congestion control (net.ipv4.tcp_congestion_control) of the measurement across the link, set in the bench's network namespace (a private one) and behind the link for its length only, such as cubic or bbr; empty: the machine's")
	flag.IntVar(&o.datapath.ShortConns, "short-conns", 4000, "short connections (a request, 2 KiB back, the sink's close) through each contender, one at a time, split over -datapath-rounds (0: none)")
	flag.StringVar(&o.idleConns, "idle-conns", "1000,10000", "comma-separated counts of idle connections held through each contender (empty: none)")
	flag.BoolVar(&o.skipCost, "skip-cost", false, "skip the health cost at rest and in use")
	flag.BoolVar(&o.costOnly, "cost-only", false, "run only the health cost at rest and in use")
	flag.IntVar(&o.cost.Clients, "cost-clients", 20, "clients of each contender of the health cost")
	flag.DurationVar(&o.cost.Window, "cost-window", 30*time.Second, "how long the health cost of each contender is measured")
	flag.DurationVar(&o.cost.ActiveGap, "cost-active-gap", costDefaultActiveGap, "pause between two requests of each client of the -active cost contenders (10ms to 1m)")
	flag.StringVar(&o.costContenders, "cost-contenders", strings.Join(costContenders, ","), "comma-separated contenders of the health cost")
	flag.StringVar(&o.out, "out", "", "output directory (default: _output/bench at the repository root)")
	flag.Parse()

	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("bench [%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if !testbed.InNetns() {
		// Outside the network namespace: the network is still there for
		// apt-get and the Go module proxy.
		if err := prepare(say); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		say("entering a private network namespace")
	}
	if err := testbed.ReexecInNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, say, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (o *options) validate() error {
	for _, p := range splitList(o.paths) {
		if _, ok := pathDescriptions[p]; !ok {
			return fmt.Errorf("-paths: unknown path %q (allowed: %s)", p, strings.Join(allPaths, ", "))
		}
	}
	for _, f := range splitList(o.faults) {
		if faultByName(f) == nil {
			return fmt.Errorf("-faults: unknown fault %q (allowed: kill, hang, blackhole, graceful)", f)
		}
	}
	c := o.overhead
	if c.Rounds < 1 || c.GetSeq < c.Rounds || c.GetSparse < c.Rounds || c.GetConc < c.Rounds || c.Lists < c.Rounds || c.NewConn < c.Rounds || c.Concurrency < 1 {
		return fmt.Errorf("overhead counts must be at least -rounds (%d), -concurrency at least 1", c.Rounds)
	}
	if c.SparseGap <= 0 || c.SparseGap > time.Minute {
		return fmt.Errorf("-sparse-gap %v: must be more than 0 and at most 1m", c.SparseGap)
	}
	if o.newConnOnly && o.datapathOnly {
		return errors.New("-newconn-only and -datapath-only: choose one")
	}
	if o.newConnOnly {
		o.skipOverhead, o.skipFailover, o.skipNewConn, o.skipDatapath, o.skipCost = true, true, false, true, true
	}
	if o.datapathOnly {
		o.skipOverhead, o.skipFailover, o.skipNewConn, o.skipDatapath, o.skipCost = true, true, true, false, true
	}
	d := &o.datapath
	if d.MiB < 1 || d.Rounds < 1 || d.MiB < d.Rounds {
		return fmt.Errorf("-datapath-mib at least -datapath-rounds (%d), which is at least 1", d.Rounds)
	}
	if d.ShortConns < 0 || (d.ShortConns > 0 && d.ShortConns < d.Rounds) {
		return fmt.Errorf("-short-conns: %d; 0 (none) or at least -datapath-rounds (%d)", d.ShortConns, d.Rounds)
	}
	bits, err := parseLinkRate(d.Link)
	if err != nil {
		return err
	}
	d.LinkBits = bits
	if bits == 0 {
		d.Link = ""
	}
	if d.LinkCC != "" && bits == 0 {
		return fmt.Errorf("-datapath-link-cc %q: for the measurement across the link, which -datapath-link none skips", d.LinkCC)
	}
	if err := checkLinkCC(d.LinkCC, readSysctl(sysctlAllowed)); err != nil {
		return err
	}
	d.IdleConns = nil
	for _, f := range splitList(o.idleConns) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("-idle-conns: %q is not a positive count", f)
		}
		d.IdleConns = append(d.IdleConns, n)
	}
	slices.Sort(d.IdleConns)
	d.IdleConns = slices.Compact(d.IdleConns)
	if o.costOnly {
		if o.newConnOnly || o.datapathOnly || o.skipCost {
			return errors.New("-cost-only: not with -newconn-only, -datapath-only or -skip-cost")
		}
		o.skipOverhead, o.skipFailover, o.skipNewConn, o.skipDatapath = true, true, true, true
	}
	if o.cost.Clients < 1 || o.cost.Clients > costMaxClients || o.cost.Window < time.Second {
		return fmt.Errorf("-cost-clients from 1 to %d, -cost-window at least 1s", costMaxClients)
	}
	if g := o.cost.ActiveGap; g < 10*time.Millisecond || g > time.Minute {
		return fmt.Errorf("-cost-active-gap %s: from 10ms to 1m", g)
	}
	o.cost.Contenders = nil
	for _, c := range splitList(o.costContenders) {
		if !slices.Contains(costContenders, c) {
			return fmt.Errorf("-cost-contenders: unknown contender %q (allowed: %s)", c, strings.Join(costContenders, ", "))
		}
		o.cost.Contenders = append(o.cost.Contenders, c)
	}
	if len(o.cost.Contenders) == 0 {
		return errors.New("-cost-contenders: want at least one")
	}
	n := o.newConn
	if n.Rate < 1 || n.Timeout <= 0 || n.Window < newConnTail || n.Loaded < 0 || n.Burners < 0 {
		return fmt.Errorf("-newconn-rate at least 1, -newconn-timeout positive, -newconn-window at least %s, -newconn-loaded and -newconn-burners not negative", newConnTail)
	}
	if o.window < connsSampleAfter+afterResume {
		return fmt.Errorf("-window %s: at least %s", o.window, connsSampleAfter+afterResume)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func faultByName(name string) *fault {
	for i := range allFaults {
		if allFaults[i].name == name {
			return &allFaults[i]
		}
	}
	return nil
}

// prefixWriter prefixes every line written to it.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if !p.mid {
			if _, err := io.WriteString(p.w, p.prefix); err != nil {
				return 0, err
			}
		}
		if _, err := io.WriteString(p.w, line); err != nil {
			return 0, err
		}
		p.mid = !strings.HasSuffix(line, "\n")
	}
	return len(b), nil
}
