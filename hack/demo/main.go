// Command demo starts a local control plane (etcd and three real
// kube-apiservers in a private network namespace) and runs the same
// controller-like client three ways side by side: through apifailover's
// transport (in process), through localproxy, and through HAProxy
// configured as kubespray configures it. It then kills, hangs, blackholes
// and gracefully stops the apiserver the clients use, one fault after
// another, with a live table of each client (requests answered and failed
// in the last second, the apiserver it is on, how long it has gone
// without a successful GET) and a closing summary. It needs no flags:
// `make demo`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
)

func main() {
	steady := flag.Duration("steady", 3*time.Second, "how long the clients run before each fault")
	observe := flag.Duration("observe", 15*time.Second, "how long to watch each fault (HAProxy's GETs time out after 10s)")
	flag.Parse()
	if !testbed.InNetns() {
		// Install and build while the network is reachable.
		if err := testbed.Prepare(context.Background(), testbed.Options{InstallDeps: os.Geteuid() == 0, Log: os.Stderr}); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
	if err := testbed.ReexecInNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	// client-go's own warnings (a watch ending when its server dies)
	// would tear the live table; the board shows what the workloads see.
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	_ = kfs.Set("logtostderr", "false")
	_ = kfs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *steady, *observe); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// fault is one failure the demo injects into the apiserver the clients
// use.
type fault struct {
	name    string
	what    string
	inject  func(*testbed.APIServer) error
	restore func(context.Context, *testbed.APIServer) error
}

var faults = []fault{
	{"kill", "SIGKILL: the process dies, its connections are reset",
		func(s *testbed.APIServer) error { return s.Kill() },
		func(ctx context.Context, s *testbed.APIServer) error { return s.Restart(ctx) }},
	{"hang", "SIGSTOP: the process freezes, its connections stay open and silent",
		func(s *testbed.APIServer) error { return s.Hang() },
		func(_ context.Context, s *testbed.APIServer) error { return s.Resume() }},
	{"blackhole", "iptables DROP both ways: packets vanish, nothing is reset",
		func(s *testbed.APIServer) error { return s.Blackhole() },
		func(_ context.Context, s *testbed.APIServer) error { return s.Restore() }},
	{"graceful", "SIGTERM: /readyz fails, it serves 2s more, then exits",
		func(s *testbed.APIServer) error { return s.Terminate() },
		func(ctx context.Context, s *testbed.APIServer) error { return s.Restart(ctx) }},
}

// outcome is what one fault did to one client.
type outcome struct {
	fault, lane string
	victim      string
	to          string        // the first apiserver that answered a GET after the fault
	failover    time.Duration // when
	down        time.Duration // when the client counted the victim down; negative: never
	blind       time.Duration // longest time without a successful GET
	gets, gbad  int
	skipped     int // GETs not sent: 64 were stuck
	writes      int
	wbad        int
	relists     int
	unseen      int // created objects the informer had not seen when the round ended
	missed      string
}

func run(ctx context.Context, out *os.File, steady, observe time.Duration) error {
	b := newBoard(out)
	b.log("starting etcd and 3 kube-apiservers %s in a private network namespace", testbed.DefaultVersion)
	bed, err := testbed.Start(ctx, testbed.Options{APIServers: 3, InstallDeps: os.Geteuid() == 0, Log: b.writer("")})
	if err != nil {
		return err
	}
	defer bed.Close()
	byAddr := map[string]*testbed.APIServer{}
	for _, s := range bed.APIServers() {
		byAddr[s.Addr()] = s
		b.log("  %s at https://%s", s.Name(), s.Addr())
	}
	dir, err := os.MkdirTemp("", "apifailover-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b.log("three clients side by side, each the same workload (an informer on ConfigMaps, a create every 100ms, a GET every 50ms; 10s timeout, no client-go retries):")
	for _, n := range laneNames {
		b.log("  %-10s %s", n, laneWhat[n])
	}
	b.log("before each fault every client starts afresh on the same apiserver, the one the transport picks (localproxy counts it as this node's own; HAProxy's first connection goes there while the others drain, then all three are in rotation); the fault hits that apiserver")

	var outcomes []outcome
	longest := map[string]time.Duration{}
	for i, fl := range faults {
		outs, err := runFault(ctx, b, bed, byAddr, fmt.Sprintf("fault %d of %d", i+1, len(faults)), fl, steady, observe, filepath.Join(dir, fl.name), longest)
		outcomes = append(outcomes, outs...)
		if err != nil {
			b.freeze()
			if ctx.Err() != nil {
				return errors.New("interrupted")
			}
			return err
		}
	}
	b.freeze()
	printSummary(out, outcomes)
	return nil
}

// runFault starts the three clients, injects fl into the apiserver they
// use, watches for observe, stops them and restores the apiserver.
func runFault(ctx context.Context, b *board, bed *testbed.Bed, byAddr map[string]*testbed.APIServer, title string, fl fault, steady, observe time.Duration, dir string, longest map[string]time.Duration) ([]outcome, error) {
	b.begin(fmt.Sprintf("%s: %s; starting the clients", title, fl.name))
	rctx, stopBoard := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); b.run(rctx) }()
	defer func() { stopBoard(); wg.Wait() }()

	var lanes []*lane
	workloads := map[string]*workload.Workload{}
	defer func() {
		stopWorkloads(ctx, workloads)
		for _, l := range lanes {
			l.close()
		}
	}()
	start := func(l *lane) error {
		lanes = append(lanes, l)
		w, err := workload.Start(ctx, workload.Config{
			RESTConfig: l.config, HTTPClient: l.client,
			Namespace: fmt.Sprintf("demo-%s-%s-%d", fl.name, l.name, time.Now().Unix()),
			Serving:   l.serving,
			OnEvent:   b.onEvent(l.name),
		})
		if err != nil {
			return fmt.Errorf("%s workload: %w", l.name, err)
		}
		workloads[l.name] = w
		b.addLane(l, longest[l.name])
		return nil
	}
	// The transport first: the apiserver it settles on is the victim.
	tr, err := startTransport(ctx, bed)
	if err != nil {
		return nil, err
	}
	if err := start(tr); err != nil {
		return nil, err
	}
	victimAddr := ""
	if !waitFor(ctx, 15*time.Second, func() bool { victimAddr = workloads[laneTransport].Serving(); return byAddr[victimAddr] != nil }) {
		return nil, fmt.Errorf("the transport client uses no apiserver after 15s")
	}
	victim := byAddr[victimAddr]
	lp, err := startLocalProxy(ctx, bed, victimAddr)
	if err != nil {
		return nil, err
	}
	if err := start(lp); err != nil {
		return nil, err
	}
	hp, err := startHAProxy(ctx, bed, dir, victimAddr)
	if err != nil {
		return nil, err
	}
	if err := start(hp); err != nil {
		return nil, err
	}
	waitFor(ctx, 10*time.Second, func() bool { return workloads[laneHAProxy].Serving() == victimAddr })
	if err := hp.placed(); err != nil {
		return nil, err
	}
	b.setHeader(fmt.Sprintf("%s: %s %s (%s) next; the clients run", title, fl.name, victim.Name(), victimAddr))
	// Steady: every client on the victim for a second, after steady.
	began := time.Now()
	var since time.Time
	waitFor(ctx, steady+10*time.Second, func() bool {
		all := true
		for _, w := range workloads {
			all = all && w.Serving() == victimAddr
		}
		if !all {
			since = time.Time{}
		} else if since.IsZero() {
			since = time.Now()
		}
		return time.Since(began) >= steady && !since.IsZero() && time.Since(since) >= time.Second
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	missed := map[string]string{}
	for _, n := range laneNames {
		if s := workloads[n].Serving(); s != victimAddr {
			missed[n] = orDash(s)
			b.log("%-10s is on %s, not %s: this fault does not hit it", n, orDash(s), victimAddr)
		}
	}

	header := fmt.Sprintf("%s: %s %s (%s), %s", title, strings.ToUpper(fl.name), victim.Name(), victimAddr, fl.what)
	b.log("FAULT %s %s (%s): %s", fl.name, victim.Name(), victimAddr, fl.what)
	if err := fl.inject(victim); err != nil {
		return nil, err
	}
	t0 := time.Now()
	b.faulted(header, victimAddr)
	if !sleep(ctx, observe) {
		return nil, ctx.Err()
	}
	end := time.Now()
	b.setHeader(fmt.Sprintf("%s: %s over; stopping the clients, restoring %s", title, fl.name, victim.Name()))
	results := stopWorkloads(ctx, workloads)
	var outcomes []outcome
	for _, n := range laneNames {
		longest[n] = b.longest(n)
		o := summarize(fl.name, n, victimAddr, t0, end, results[n])
		o.down, o.missed = b.downAfter(n), missed[n]
		outcomes = append(outcomes, o)
		b.log("%-10s %s", n, o.line())
	}
	b.endRound()
	for _, l := range lanes {
		l.close()
	}
	lanes = nil
	if err := fl.restore(ctx, victim); err != nil {
		return outcomes, fmt.Errorf("restoring %s: %w", victim.Name(), err)
	}
	return outcomes, nil
}

// stopWorkloads stops every workload at once (each waits at most 5s for
// its informer) and forgets them.
func stopWorkloads(ctx context.Context, ws map[string]*workload.Workload) map[string]workload.Results {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]workload.Results{}
	for n, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := w.Stop(sctx)
			mu.Lock()
			out[n] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	clear(ws)
	return out
}

// summarize measures one fault on one client from the fault to end.
func summarize(fault, lane, victim string, t0, end time.Time, res workload.Results) outcome {
	o := outcome{fault: fault, lane: lane, victim: victim, blind: res.LongestGetGap(t0, end), relists: res.ListsSince(t0), unseen: len(res.Lost()), skipped: res.SkippedGets}
	for _, r := range res.Gets {
		if r.End.After(t0) {
			o.gets++
			if !r.OK() {
				o.gbad++
			} else if o.to == "" && r.Start.After(t0) && r.Serving != "" && r.Serving != victim {
				o.to, o.failover = r.Serving, r.End.Sub(t0)
			}
		}
	}
	for _, r := range res.Writes {
		if r.End.After(t0) {
			o.writes++
			if !r.OK() {
				o.wbad++
			}
		}
	}
	return o
}

func (o outcome) line() string {
	to := "no GET answered elsewhere"
	if o.to != "" {
		to = fmt.Sprintf("answered by %s after %s", o.to, seconds(o.failover))
	}
	down := "never marked down"
	if o.down >= 0 {
		down = fmt.Sprintf("marked down after %.2fs", o.down.Seconds())
	}
	return fmt.Sprintf("%s, %s; blind %.2fs; failed: %s GETs, %d/%d creates; relists %d", to, down, o.blind.Seconds(), o.failedGets(), o.wbad, o.writes, o.relists)
}

// failedGets is "failed/sent", and the GETs not sent while 64 were stuck.
func (o outcome) failedGets() string {
	s := fmt.Sprintf("%d/%d", o.gbad, o.gets)
	if o.skipped > 0 {
		s += fmt.Sprintf(" (+%d not sent)", o.skipped)
	}
	return s
}

func printSummary(out io.Writer, outcomes []outcome) {
	fmt.Fprintln(out)
	fmt.Fprintln(out, "summary (from each fault to the end of its watch; blind: longest time without a successful GET)")
	fmt.Fprintf(out, "  %-10s %-11s %-16s %-16s %9s %12s %8s %24s %15s %8s\n", "fault", "client", "victim", "failover to", "after", "marked down", "blind", "failed GETs", "failed creates", "relists")
	type total struct{ gets, gbad, skipped, writes, wbad, relists, unseen int }
	totals := map[string]*total{}
	for _, o := range outcomes {
		after, down := "-", "never"
		if o.to != "" {
			after = seconds(o.failover)
		}
		if o.down >= 0 {
			down = fmt.Sprintf("%.2fs", o.down.Seconds())
		}
		victim := o.victim
		if o.missed != "" {
			victim = "(on " + o.missed + ")"
		}
		fmt.Fprintf(out, "  %-10s %-11s %-16s %-16s %9s %12s %7.2fs %24s %15s %8d\n", o.fault, o.lane, victim, orDash(o.to), after, down, o.blind.Seconds(),
			o.failedGets(), fmt.Sprintf("%d/%d", o.wbad, o.writes), o.relists)
		t := totals[o.lane]
		if t == nil {
			t = &total{}
			totals[o.lane] = t
		}
		t.gets, t.gbad, t.skipped, t.writes, t.wbad = t.gets+o.gets, t.gbad+o.gbad, t.skipped+o.skipped, t.writes+o.writes, t.wbad+o.wbad
		t.relists, t.unseen = t.relists+o.relists, t.unseen+o.unseen
	}
	fmt.Fprintln(out, "  during the faults:")
	for _, n := range laneNames {
		if t := totals[n]; t != nil {
			notSent := ""
			if t.skipped > 0 {
				notSent = fmt.Sprintf(" (%d not sent while 64 were stuck)", t.skipped)
			}
			fmt.Fprintf(out, "    %-10s %d/%d GETs failed%s, %d/%d creates failed, %d relists, %d created objects not yet seen by the informer when the clients stopped\n",
				n, t.gbad, t.gets, notSent, t.wbad, t.writes, t.relists, t.unseen)
		}
	}
}

// seconds formats a time after the fault: milliseconds below a second.
func seconds(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || !sleep(ctx, 100*time.Millisecond) {
			return false
		}
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
