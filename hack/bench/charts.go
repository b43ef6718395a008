package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/apifailover/apifailover/hack/plots"
	"github.com/apifailover/apifailover/hack/workload"
)

// Charts: for each failover fault a timeline of every path's requests
// (failover-<fault>.svg), and for each overhead op the latency CDF of
// every path (overhead-<op>.svg), in the output directory.

// failoverBin is the width of a failover timeline's count bins: the
// workload sends 30 requests a second, 15 a bin.
const failoverBin = 0.5

// requestSamples are r's GETs and creates, at their end in seconds after
// t0: what a failover chart draws. One per request the run made, so as
// bounded as the run (its window).
func requestSamples(r workload.Results, t0 time.Time) []plots.Sample {
	out := make([]plots.Sample, 0, len(r.Gets)+len(r.Writes))
	for _, q := range slices.Concat(r.Gets, r.Writes) {
		out = append(out, plots.Sample{At: q.End.Sub(t0).Seconds(), OK: q.OK()})
	}
	return out
}

// latencyQuantiles keeps at most plots.MaxPoints quantiles of lat, in
// milliseconds: enough for a CDF, whatever the run's size.
func latencyQuantiles(lat []time.Duration) []float64 {
	ms := make([]float64, len(lat))
	for i, d := range lat {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	return plots.Quantiles(ms, plots.MaxPoints)
}

// drawCharts runs draw and reports what it wrote; a failure to draw is
// returned as a failure of the run.
func drawCharts(say func(string, ...any), draw func() ([]string, error)) []string {
	files, err := draw()
	if len(files) > 0 {
		say("charts: %s", strings.Join(files, ", "))
	}
	if err != nil {
		say("charts: %v", err)
		return []string{"charts: " + err.Error()}
	}
	return nil
}

// drawFailover draws a timeline per fault into dir, a panel per path.
func drawFailover(dir string, rows []FailoverRow, faults map[string]string) ([]string, error) {
	var order []string
	byFault := map[string][]FailoverRow{}
	for _, r := range rows {
		if len(r.samples) == 0 {
			continue // not measured
		}
		if byFault[r.Fault] == nil {
			order = append(order, r.Fault)
		}
		byFault[r.Fault] = append(byFault[r.Fault], r)
	}
	var files []string
	for _, fault := range order {
		tl := failoverTimeline(fault, faults[fault], byFault[fault])
		path := filepath.Join(dir, "failover-"+fault+".svg")
		if err := tl.Save(path); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

// failoverTimeline is one fault's chart: each path's requests answered
// and failed, the fault at 0 on the apiserver the path used (a band until
// the run ended) and when the path marked it down.
func failoverTimeline(fault, what string, rows []FailoverRow) plots.Timeline {
	tl := plots.Timeline{
		Title:  fmt.Sprintf("failover, %s: %s; on the apiserver each path uses, a fresh instance of each path", fault, what),
		XLabel: "seconds after the fault (GETs every 50ms and creates every 100ms, 10s timeout; counted when they end)",
		Bin:    failoverBin,
	}
	for _, r := range rows {
		first := 0.0
		for _, s := range r.samples {
			first = min(first, s.At)
		}
		start := math.Floor(first/failoverBin) * failoverBin
		end := max(r.Observed, 0)
		for _, s := range r.samples {
			end = max(end, s.At)
		}
		ok, failed := plots.Bin(r.samples, start, failoverBin, int(math.Ceil((end-start)/failoverBin))+1)
		down := "no health view"
		switch {
		case r.MarkedDown != nil:
			down = fmt.Sprintf("marked down %.2fs", *r.MarkedDown)
		case r.HasHealth:
			down = "not marked down"
		}
		pn := plots.Panel{
			Title: fmt.Sprintf("%s: %d/%d GETs and %d/%d creates failed, blind %.2fs, %s",
				r.Path, r.GetsFailed, r.Gets, r.CreatesFailed, r.Creates, r.LongestGetGap, down),
			Start: start, OK: ok, Failed: failed,
			Marks: []plots.Mark{{At: 0, Kind: plots.MarkFault, Label: fault}},
			Bands: []plots.Band{{From: 0, To: r.Observed, Kind: fault, Label: fault + " " + r.Victim}},
		}
		if r.MarkedDown != nil {
			pn.Marks = append(pn.Marks, plots.Mark{At: *r.MarkedDown, Kind: plots.MarkDown})
		}
		tl.Panels = append(tl.Panels, pn)
	}
	return tl
}

// drawOverhead draws a latency CDF per op into dir, a line per path.
func drawOverhead(dir string, rows []OverheadRow) ([]string, error) {
	var order []string
	byOp := map[string][]plots.Line{}
	for _, r := range rows {
		if len(r.latencies) == 0 {
			continue
		}
		if byOp[r.Op] == nil {
			order = append(order, r.Op)
		}
		byOp[r.Op] = append(byOp[r.Op], plots.Line{Name: fmt.Sprintf("%s (p50 %.2fms, p99 %.2fms)", r.Path, r.P50ms, r.P99ms), Values: r.latencies})
	}
	var files []string
	for _, op := range order {
		c := plots.CDF{Title: op + ": " + opDescriptions[op], XLabel: "latency (ms)", LogX: true, Lines: byOp[op]}
		path := filepath.Join(dir, "overhead-"+op+".svg")
		if err := c.Save(path); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}
