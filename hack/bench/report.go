package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apifailover/apifailover/localproxy"
)

// Results is results.json.
type Results struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	// Versions of the software measured.
	Versions map[string]string `json:"versions"`
	// Paths and Ops describe the rows.
	Paths    map[string]string `json:"paths"`
	Ops      map[string]string `json:"ops"`
	Overhead struct {
		Config overheadConfig `json:"config"`
		Rows   []OverheadRow  `json:"rows"`
		Error  string         `json:"error,omitempty"`
	} `json:"overhead"`
	Failover struct {
		Faults map[string]string `json:"faults"`
		Rows   []FailoverRow     `json:"rows"`
	} `json:"failover"`
	NewConn         *NewConnResults  `json:"new_connection,omitempty"`
	Datapath        *DatapathResults `json:"data_path,omitempty"`
	Cost            *CostResults     `json:"health_cost,omitempty"`
	DurationSeconds float64          `json:"duration_s"`
}

// write stores results.json and results.md in dir.
func (r *Results) write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	md := r.markdown()
	return md, os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644)
}

func fmtRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", v)
}

// fmtPositive formats v, or "-" if it is not above zero (a figure the
// path does not have, as direct's proxy CPU).
func fmtPositive(format string, v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

func fmtSecs(v *float64) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf("%.2fs", *v)
}

// fmtWithin renders a time after the fault, or that it did not happen
// within the observed time.
func fmtWithin(v *float64, observed float64) string {
	if v == nil {
		return fmt.Sprintf("none in %.0fs", observed)
	}
	return fmtSecs(v)
}

// markdown renders the results as tables.
func (r *Results) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("## Peer benchmark, %s", r.Date)
	w("")
	w("%s. %s.", r.Machine, versionLine(r.Versions))
	w("")
	if len(r.Overhead.Rows) > 0 || r.Overhead.Error != "" {
		c := r.Overhead.Config
		w("### Overhead")
		w("")
		w("Per path: %d sequential GETs of a small ConfigMap, %d more each after a pause of %v, %d GETs from %d goroutines, %d LISTs of %d ConfigMaps of %d bytes, %d GETs each on a new connection; in %d interleaved rounds. Ratios against the direct connection in the same run (latency: >1 is slower; req/s: <1 is slower). direct-again is a second direct client: its ratios show the run's noise. Proxy CPU: CPU time of the proxy processes per request, their use at rest (health checks; localproxy also its EndpointSlice watch) taken off; vs haproxy: against HAProxy's for the same op, in brackets the lowest and highest ratio of a single round against HAProxy's in that round (how far one round strays: a ratio within that spread of 1 is not told from HAProxy's on this machine).",
			c.GetSeq, c.GetSparse, c.SparseGap, c.GetConc, c.Concurrency, c.Lists, c.ListObjects, c.ListBytes, c.NewConn, c.Rounds)
		w("")
		if r.Overhead.Error != "" {
			w("Error: %s", r.Overhead.Error)
			w("")
		}
		idle := idleLine(r.Overhead.Rows)
		if idle != "" {
			w("Proxy CPU at rest: %s.", idle)
			w("")
		}
		w("| op | path | p50 | p50 vs direct | p99 | p99 vs direct | req/s | req/s vs direct | proxy CPU/req | vs haproxy |")
		w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, o := range r.Overhead.Rows {
			cpu := "-"
			if o.ProxyCPUMicros > 0 {
				cpu = fmt.Sprintf("%.0fµs", o.ProxyCPUMicros)
			}
			errNote := ""
			if o.Error != "" {
				errNote = " (" + o.Error + ")"
			}
			vsHAProxy := fmtRatio(o.CPUVsHAProxy)
			if lo, hi := o.CPUVsHAProxyRounds[0], o.CPUVsHAProxyRounds[1]; lo > 0 && o.Path != pathHAProxy {
				vsHAProxy += fmt.Sprintf(" (rounds %.2f-%.2f)", lo, hi)
			}
			w("| %s | %s%s | %.2fms | %s | %.2fms | %s | %.0f | %s | %s | %s |", o.Op, o.Path, errNote,
				o.P50ms, fmtRatio(o.P50Ratio), o.P99ms, fmtRatio(o.P99Ratio), o.PerSec, fmtRatio(o.PerSecRatio), cpu, vsHAProxy)
		}
		w("")
	}
	if len(r.Failover.Rows) > 0 {
		w("### Failover")
		w("")
		w("A workload (informer on ConfigMaps, a create every 100ms, a GET every 50ms, 10s timeout, no client-go retries) runs through each path; the fault hits the apiserver carrying its traffic. Times are after the fault. \"marked down\": the path's health view (nginx and direct have none). \"first GET elsewhere\": first GET sent after the fault answered by another apiserver (through a proxy during a graceful shutdown, while the stopping server still answers, judged from the proxy's upstream connections, to about 0.25s). \"blind\": longest time without a successful GET. \"conns @10s\": connections of the path to the faulted apiserver open at the fault and still open 10s later (proxies: their upstream side); in brackets, with those opened after the fault (health checks, new client connections sent there).")
		w("")
		w("| fault | path | marked down | first GET elsewhere | blind | failed GETs | failed creates | informer resumed | relists | events lost | conns @10s |")
		w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, f := range r.Failover.Rows {
			if f.Error != "" {
				w("| %s | %s | error: %s | | | | | | | | |", f.Fault, f.Path, errCell(f.Error))
				continue
			}
			down := fmtWithin(f.MarkedDown, f.Observed)
			if !f.HasHealth {
				down = "n/a"
			}
			gets := fmt.Sprintf("%d/%d", f.GetsFailed, f.Gets)
			if f.GetsSkipped > 0 {
				gets += fmt.Sprintf(" (+%d skipped)", f.GetsSkipped)
			}
			conns := fmt.Sprint(f.ConnsToVictim)
			if f.ConnsToVictimAll != f.ConnsToVictim {
				conns += fmt.Sprintf(" (%d with new)", f.ConnsToVictimAll)
			}
			w("| %s | %s | %s | %s | %.2fs | %s | %d/%d | %s | %d | %d | %s |", f.Fault, f.Path, down,
				fmtWithin(f.FirstGetElsewhere, f.Observed), f.LongestGetGap, gets, f.CreatesFailed, f.Creates,
				fmtWithin(f.InformerResume, f.Observed), f.Relists, f.EventsLost, conns)
		}
		w("")
		w("Each run observes until the client has resumed and the path's health view counts the faulted apiserver down, at least %s, at most %s (direct: %s).", connsSampleAfter+afterResume, windowOf(r.Failover.Rows), directWindow)
		w("")
	}
	if r.NewConn != nil && (len(r.NewConn.Rows) > 0 || len(r.NewConn.Loaded) > 0) {
		r.NewConn.markdown(w)
	}
	if r.Datapath != nil && (len(r.Datapath.Throughput) > 0 || len(r.Datapath.Short) > 0 || len(r.Datapath.Idle) > 0 || r.Datapath.Error != "") {
		r.Datapath.markdown(w)
	}
	if r.Cost != nil {
		r.Cost.markdown(w)
	}
	return b.String()
}

// markdown renders the new-connection tables.
func (n *NewConnResults) markdown(w func(string, ...any)) {
	c := n.Config
	w("### New connection per request")
	w("")
	w("A client opens a new TCP+TLS connection for every request (GET %s, %d a second, %.0fs deadline: a shell loop of kubectl calls, a CNI plugin) through each L4 contender, side by side, fresh instances for each fault. After %s, the fault hits localproxy's preferred apiserver (HAProxy and nginx spread new connections over all three apiservers); observed for %.0fs, then the apiserver is restored. \"failed\": requests that ended after the fault and failed (error, deadline, non-200). \"outage\": from the first failed request sent to the last one (\"≥\": requests sent in the last %s still failed). \"sent to faulted\": connections the contender sent or tried to send to the faulted apiserver after the fault (localproxy: its dials, HAProxy: its sessions assigned to that server, stot; nginx: sessions in its session log, every server tried). Ratios against HAProxy in the same run (\"-\": either is 0).",
		newConnURLPath, c.Rate, c.TimeoutS, newConnLeadIn, c.WindowS, newConnTail)
	w("")
	if len(n.Rows) > 0 {
		w("| fault | path | failed | vs haproxy | outage | vs haproxy | sent to faulted | slowest OK |")
		w("|---|---|---:|---:|---:|---:|---:|---:|")
		for _, r := range n.Rows {
			if r.Error != "" {
				w("| %s | %s | error: %s | | | | | |", r.Fault, r.Path, errCell(r.Error))
				continue
			}
			failed := fmt.Sprintf("%d/%d", r.Failed, r.Requests)
			if r.FailedBefore > 0 {
				failed += fmt.Sprintf(" (+%d before the fault)", r.FailedBefore)
			}
			outage := fmt.Sprintf("%.2fs", r.Outage)
			if r.StillFailing {
				outage = "≥" + outage
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %.0fms |", r.Fault, r.Path, failed, fmtRatio(r.FailedRatio),
				outage, fmtRatio(r.OutageRatio), fmtCount(r.SentToVictim), r.SlowestOKms)
		}
		w("")
	}
	if len(n.Loaded) > 0 || n.Error != "" {
		w("No fault, %.0fs, while %d processes burn the CPUs: the same clients, and a transport.Wrap client with default options sending the same GETs over its own connections. \"downs\", \"suspects\": times the contender's health view counted an apiserver down, or suspect (transport: its pool's Status state not healthy, suspect; localproxy: /status state not healthy, suspect; HAProxy: not UP, \"UP 1/2\"), read every %s; nginx has no health view.", c.LoadedS, c.Burners, viewPoll)
		w("")
		if n.Error != "" {
			w("Error: %s", n.Error)
			w("")
		}
		w("| path | failed | vs haproxy | p50 | p99 | p99 vs haproxy | downs | suspects |")
		w("|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, r := range n.Loaded {
			w("| %s | %d/%d | %s | %.1fms | %.1fms | %s | %s | %s |", r.Path, r.Failed, r.Requests, fmtRatio(r.FailedRatio),
				r.P50ms, r.P99ms, fmtRatio(r.P99Ratio), fmtCount(r.Downs), fmtCount(r.Suspects))
		}
		w("")
	}
}

func windowOf(rows []FailoverRow) string {
	best := 0.0
	for _, r := range rows {
		best = max(best, r.Window)
	}
	return fmt.Sprintf("%.0fs", best)
}

func versionLine(v map[string]string) string {
	var parts []string
	for _, k := range []string{"kube-apiserver", "etcd", "localproxy", "haproxy", "nginx"} {
		if s, ok := v[k]; ok {
			parts = append(parts, k+" "+s)
		}
	}
	return strings.Join(parts, ", ")
}

// errCell renders an error in a table cell: one line, at most 200
// characters, no column separators.
func errCell(err string) string {
	return strings.ReplaceAll(oneLine(err, 200), "|", "/")
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// idleLine lists the proxies' CPU use at rest.
func idleLine(rows []OverheadRow) string {
	var parts []string
	seen := make(map[string]bool)
	for _, r := range rows {
		if (r.IdleCPUms > 0 || r.ProxyCPUMicros > 0) && !seen[r.Path] {
			seen[r.Path] = true
			parts = append(parts, fmt.Sprintf("%s %.1fms/s", r.Path, r.IdleCPUms))
		}
	}
	return strings.Join(parts, ", ")
}

// markdown renders the data-path tables.
func (d *DatapathResults) markdown(w func(string, ...any)) {
	c := d.Config
	w("### Data path")
	w("")
	w("Each L4 contender, a fresh instance configured as in front of the apiservers (localproxy: the same flags without discovery; HAProxy and nginx: kubespray's configuration), forwards to its own listener of a TCP sink (a process of its own), which passes their health checks as an apiserver would (TLS with the apiserver certificate, 200). direct: the client to the sink itself, the limit. Client, sink and proxies share the machine's cores.")
	w("")
	if d.Error != "" {
		w("Error: %s", d.Error)
		w("")
	}
	if len(d.Throughput) > 0 {
		w("Throughput: %d MiB each way per contender, one TCP connection at a time, %d interleaved rounds, 256 KiB reads and writes. upload: client to sink; download: sink to client.%s Proxy CPU: CPU time of the proxy's processes (their threads' schedstat; nginx: master and workers) per GiB carried, health checks included. Machine CPU: busy time of all cores (/proc/stat) per GiB, the kernel's TCP work for every connection included; busy: its share of the cores while the bytes moved. CPU bound: direct's machine CPU per GiB over the path's, the most of direct's throughput the path can reach when direct keeps every core busy.", c.MiB, c.Rounds, loopbackCCNote(c.LocalProxyLoopbackCC))
		w("")
		throughputTable(w, d.Throughput)
	}
	if l := d.Link; l != nil {
		w("Throughput across a %s link: the same measurement with the sink in a network namespace of its own, behind a veth pair (MTU 1500) shaped to %s each way with tc's token bucket filter, as an apiserver is behind a node's NIC; the client and the proxies on this side, fresh instances. There the link, not the machine's CPU, bounds the direct path: a proxy that keeps up with it reaches 1.00× of direct.", l.Rate, l.Rate)
		w("")
		if t := l.TCP; t.CongestionControl != "" {
			how := "the machine's"
			if t.Set {
				how = "set for this measurement (-datapath-link-cc)"
			}
			loop := "both ways on loopback"
			if lp := c.LocalProxyLoopbackCC; lp != "" && lp != localproxy.SystemCongestionControl && lp != t.CongestionControl {
				loop += ", but for localproxy's client sockets there, which use " + lp + " (its --loopback-congestion-control)"
			}
			w("TCP congestion control, %s: %s on this side (what sends the uploads across the link, and %s), %s behind the link (what sends the downloads). net.ipv4.tcp_rmem and tcp_wmem: %s and %s here, %s and %s behind the link.", how, t.CongestionControl, loop, cmp.Or(t.SinkCongestionControl, "unknown"), t.Rmem, t.Wmem, cmp.Or(t.SinkRmem, "unknown"), cmp.Or(t.SinkWmem, "unknown"))
			w("")
		}
		if l.Error != "" {
			w("Error: %s", l.Error)
			w("")
		}
		if len(l.Throughput) > 0 {
			throughputTable(w, l.Throughput)
		}
	}
	if len(d.Short) > 0 {
		w("Short connections: %d per contender, one at a time, in %d interleaved rounds; each sends the sink's request (9 bytes), reads its answer and %d bytes, and the sink closes: what a connection's setup and teardown cost. Proxy CPU: as above, per connection, health checks included. Machine CPU: busy time of all cores per connection, the client's, the sink's and the kernel's work included.", c.ShortConns, c.Rounds, shortBytes)
		w("")
		w("| path | conns | µs a connection | proxy CPU µs/conn | vs haproxy | machine CPU µs/conn | vs haproxy | vs direct |")
		w("|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, r := range d.Short {
			w("| %s | %d | %.0f | %s | %s | %.1f | %s | %s |", r.Path, r.Conns, r.WallUS, fmtPositive("%.1f", r.ProxyCPUUS), fmtRatio(r.CPUVsHAProxy), r.MachineCPUUS, fmtRatio(r.MachineVsHAProxy), fmtRatio(r.MachineVsDirect))
		}
		w("")
	}
	if len(d.Idle) > 0 {
		w("Idle connections: one contender at a time, plain TCP clients open connections through it to the sink (each answered by the sink), then leave them idle; %s later the proxy's RSS (VmRSS) and open file descriptors (/proc/PID/fd) are read, summed over its processes (nginx: master and 2 workers, shared pages counted in each). Per connection: above the contender at rest. HAProxy's connection limits are raised to %d for this (kubespray: 4000, 1000 per server). File descriptor limit of every process: %d.", idleSettle, c.HAProxyMaxconn, c.NofileLimit)
		w("")
		if len(c.Requested) > 0 {
			w("Asked for %s idle connections; with at most %d files per process here (the hard limit, which the benchmark may not raise), a single-process proxy, two descriptors per connection, holds fewer: measured at %s.", intList(c.Requested), c.NofileLimit, intList(c.IdleConns))
			w("")
		}
		w("| path | idle conns | held | processes | RSS | fds | RSS/conn | vs haproxy | fds/conn |")
		w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, r := range d.Idle {
			if r.Error != "" {
				w("| %s | %d | error: %s | | | | | | |", r.Path, r.Conns, errCell(r.Error))
				continue
			}
			perConn, fdsPer := "-", "-"
			if r.Conns > 0 {
				perConn, fdsPer = fmt.Sprintf("%.1f KiB", r.KiBPerConn), fmt.Sprintf("%.2f", r.FDsPerConn)
			}
			path := r.Path
			if r.Note != "" {
				path += " (" + r.Note + ")"
			}
			w("| %s | %d | %d | %d | %.1f MiB | %d | %s | %s | %s |", path, r.Conns, r.Held, r.Processes,
				float64(r.RSSKiB)/1024, r.FDs, perConn, fmtRatio(r.KiBVsHAProxy), fdsPer)
		}
		w("")
	}
}

// intList renders counts as "1000, 10000".
func intList(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ", ")
}

// throughputTable writes the data path's throughput rows as a table.
func throughputTable(w func(string, ...any), rows []DatapathThroughputRow) {
	w("| direction | path | MiB/s | vs haproxy | vs direct | proxy CPU s/GiB | vs haproxy | machine CPU s/GiB | busy | CPU bound vs direct |")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		w("| %s | %s | %.0f | %s | %s | %s | %s | %.3f | %.0f%% | %s |", r.Direction, r.Path, r.MiBPerSec, fmtRatio(r.VsHAProxy), fmtRatio(r.VsDirect), fmtPositive("%.3f", r.ProxyCPUPerGiB), fmtRatio(r.CPUVsHAProxy),
			r.MachineCPUPerGiB, 100*r.MachineBusy, fmtRatio(r.CPUBoundVsDirect))
	}
	w("")
}

// loopbackCCNote says, for the data path's report, what localproxy's
// client sockets on loopback use (cc, its --loopback-congestion-control);
// "" when it keeps the namespace's.
func loopbackCCNote(cc string) string {
	if cc == "" || cc == localproxy.SystemCongestionControl {
		return ""
	}
	return " localproxy sets the congestion control of its client sockets on loopback (--loopback-congestion-control=" + cc + "); every other socket has the network namespace's."
}
