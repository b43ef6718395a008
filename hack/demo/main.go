// Command demo starts a local control plane (etcd and three real
// kube-apiservers in a private network namespace), runs a controller-like
// client through apifailover's transport, and then kills, hangs and
// blackholes the apiserver serving it, one after another, printing a live
// timeline and a closing summary. It needs no flags: `make demo`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/apifailover/apifailover/hack/testbed"
	"github.com/apifailover/apifailover/hack/workload"
	"github.com/apifailover/apifailover/transport"
	"github.com/apifailover/apifailover/transport/upstream"
)

func main() {
	steady := flag.Duration("steady", 4*time.Second, "how long to run between faults")
	observe := flag.Duration("observe", 6*time.Second, "how long to watch each fault")
	flag.Parse()
	if err := testbed.ReexecInNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *steady, *observe); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// fault is one failure the demo injects into the serving apiserver.
type fault struct {
	name    string
	what    string
	inject  func(*testbed.APIServer) error
	restore func(context.Context, *testbed.APIServer) error
}

var faults = []fault{
	{"kill", "SIGKILL: the process dies, connections are reset",
		func(s *testbed.APIServer) error { return s.Kill() },
		func(ctx context.Context, s *testbed.APIServer) error { return s.Restart(ctx) }},
	{"hang", "SIGSTOP: the process freezes, connections stay open and silent",
		func(s *testbed.APIServer) error { return s.Hang() },
		func(_ context.Context, s *testbed.APIServer) error { return s.Resume() }},
	{"blackhole", "iptables DROP both ways: packets vanish, nothing is reset",
		func(s *testbed.APIServer) error { return s.Blackhole() },
		func(_ context.Context, s *testbed.APIServer) error { return s.Restore() }},
}

// outcome is what one fault did to the client.
type outcome struct {
	fault      string
	victim     string
	to         string
	failover   time.Duration
	gets, gbad int
	writes     int
	wbad       int
}

func run(ctx context.Context, out io.Writer, steady, observe time.Duration) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "%7.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	say("starting etcd and 3 kube-apiservers %s in a private network namespace", testbed.DefaultVersion)
	bed, err := testbed.Start(ctx, testbed.Options{APIServers: 3, InstallDeps: true, Log: prefixed(out, "          testbed: ")})
	if err != nil {
		return err
	}
	defer bed.Close()
	byAddr := map[string]*testbed.APIServer{}
	for _, s := range bed.APIServers() {
		byAddr[s.Addr()] = s
		say("  %s at https://%s", s.Name(), s.Addr())
	}

	cfg := bed.RESTConfig(testbed.Origin)
	say("client: transport.Wrap(%s, tls-server-name %s); the other apiservers come from the kubernetes EndpointSlice", cfg.Host, bed.OriginName())
	f, err := transport.Wrap(ctx, cfg, transport.Options{})
	if err != nil {
		return err
	}
	defer f.Close()
	if err := waitHealthy(ctx, f, len(byAddr)); err != nil {
		return err
	}
	say("pool: %s", poolLine(f))

	w, err := workload.Start(ctx, workload.Config{
		RESTConfig: f.Config(),
		HTTPClient: f.HTTPClient(),
		Namespace:  fmt.Sprintf("demo-%d", time.Now().Unix()),
		Serving:    workload.FailoverServing(f),
		OnEvent:    liveEvents(say),
	})
	if err != nil {
		return err
	}
	say("workload: an informer on ConfigMaps, a writer creating cm-1, cm-2, ... every 100ms, a GET every 50ms")

	var outcomes []outcome
	for _, fl := range faults {
		if !sleep(ctx, steady) {
			break
		}
		victim := byAddr[w.Serving()]
		if victim == nil {
			return fmt.Errorf("cannot tell which apiserver serves the client (pool: %s)", poolLine(f))
		}
		say("FAULT %-9s %s (%s), which serves the client: %s", fl.name, victim.Name(), victim.Addr(), fl.what)
		t0 := time.Now()
		if err := fl.inject(victim); err != nil {
			return err
		}
		if !sleep(ctx, observe) {
			break
		}
		o := summarize(fl.name, victim.Addr(), t0, w.Snapshot())
		outcomes = append(outcomes, o)
		if o.to != "" {
			say("  -> failover to %s after %s; during the fault: %d/%d GETs and %d/%d creates failed", o.to, o.failover.Round(time.Millisecond), o.gbad, o.gets, o.wbad, o.writes)
		} else {
			say("  -> no failover seen")
		}
		say("  restoring %s", victim.Name())
		if err := fl.restore(ctx, victim); err != nil {
			return err
		}
		if err := waitHealthy(ctx, f, len(byAddr)); err != nil {
			return err
		}
		say("pool: %s", poolLine(f))
	}

	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	res := w.Stop(stopCtx)
	fmt.Fprintln(out)
	fmt.Fprintln(out, "summary")
	fmt.Fprintf(out, "  %-10s %-17s %-17s %10s %14s %16s\n", "fault", "victim", "failover to", "after", "failed GETs", "failed creates")
	for _, o := range outcomes {
		fmt.Fprintf(out, "  %-10s %-17s %-17s %10s %14s %16s\n", o.fault, o.victim, orDash(o.to), o.failover.Round(time.Millisecond),
			fmt.Sprintf("%d/%d", o.gbad, o.gets), fmt.Sprintf("%d/%d", o.wbad, o.writes))
	}
	fmt.Fprintf(out, "  whole run: %d/%d GETs failed, %d/%d creates failed, informer saw %d of %d created ConfigMaps (lost: %d), relists: %d\n",
		res.FailedGets(), len(res.Gets), res.FailedWrites(), len(res.Writes), len(res.Seen), len(res.Created()), len(res.Lost()), res.Relists())
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	return nil
}

// summarize measures one fault from the timeline: the failover is the
// first successful request served by another apiserver after the fault.
func summarize(name, victim string, t0 time.Time, res workload.Results) outcome {
	o := outcome{fault: name, victim: victim}
	for _, r := range res.Gets {
		if r.End.After(t0) {
			o.gets++
			if !r.OK() {
				o.gbad++
			} else if o.to == "" && r.Serving != "" && r.Serving != victim {
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

// liveEvents prints what matters as it happens: serving changes, failed
// requests, watch errors and relists; plus one line per second of counts.
func liveEvents(say func(string, ...any)) func(workload.Event) {
	var last time.Time
	var ok, bad, writes, seen, lists int
	return func(ev workload.Event) {
		switch ev.Kind {
		case workload.KindServing:
			say("  serving now: %s", orDash(ev.Serving))
		case workload.KindGet, workload.KindWrite:
			if ev.Err != nil {
				bad++
				say("  %s failed after %s: %s", ev.Kind, ev.Latency.Round(time.Millisecond), short(ev.Err))
			} else if ev.Kind == workload.KindGet {
				ok++
			} else {
				writes++
			}
		case workload.KindSeen:
			seen++
		case workload.KindList:
			lists++
			if lists > 1 {
				say("  informer relisted")
			}
		case workload.KindWatchError:
			say("  informer watch ended: %s", short(ev.Err))
		}
		if ev.Time.Sub(last) >= time.Second {
			if !last.IsZero() {
				say("  ok: %d GETs, %d creates, %d seen by the informer; failed: %d", ok, writes, seen, bad)
			}
			last = ev.Time
			ok, bad, writes, seen = 0, 0, 0, 0
		}
	}
}

func waitHealthy(ctx context.Context, f *transport.Failover, n int) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		healthy := 0
		for _, s := range f.Pool().Status() {
			if s.State == upstream.StateHealthy {
				healthy++
			}
		}
		if healthy >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d endpoints healthy after 90s: %s", healthy, n, poolLine(f))
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func poolLine(f *transport.Failover) string {
	var parts []string
	for _, s := range f.Pool().Status() {
		p := s.Addr + " " + s.State.String() + " (" + s.Sources.String() + ")"
		if s.Preferred {
			p += " preferred"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
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

func short(err error) string {
	s := err.Error()
	if len(s) > 140 {
		s = s[:140] + "..."
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// prefixed writes each line to w with a prefix.
func prefixed(w io.Writer, prefix string) io.Writer {
	return &prefixWriter{w: w, prefix: prefix}
}

type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			io.WriteString(p.w, p.prefix+line)
		}
	}
	return len(b), nil
}
