package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/plots"
	"github.com/apifailover/apifailover/hack/workload"
)

func TestRequestSamples(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := workload.Results{
		Gets:   []workload.Request{{End: t0.Add(-time.Second)}, {End: t0.Add(1500 * time.Millisecond), Err: errors.New("timeout")}},
		Writes: []workload.Request{{End: t0.Add(2 * time.Second)}},
	}
	got := requestSamples(r, t0)
	want := []plots.Sample{{At: -1, OK: true}, {At: 1.5, OK: false}, {At: 2, OK: true}}
	if len(got) != len(want) {
		t.Fatalf("requestSamples = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("requestSamples = %v, want %v", got, want)
		}
	}
}

func TestLatencyQuantilesBounded(t *testing.T) {
	lat := make([]time.Duration, 3*plots.MaxPoints)
	for i := range lat {
		lat[i] = time.Duration(i+1) * time.Microsecond
	}
	q := latencyQuantiles(lat)
	if len(q) != plots.MaxPoints || q[0] != 0.001 || q[len(q)-1] != float64(len(lat))/1000 {
		t.Fatalf("latencyQuantiles: %d points from %v to %v; want %d from 0.001 to %v", len(q), q[0], q[len(q)-1], plots.MaxPoints, float64(len(lat))/1000)
	}
}

// syntheticFailover is a hang on three paths: the transport marks the
// server down at 0.4s and loses nothing, localproxy loses what was in
// flight, HAProxy fails every GET until they time out at 10s.
func syntheticFailover() []FailoverRow {
	down := func(v float64) *float64 { return &v }
	var rows []FailoverRow
	for _, p := range []struct {
		path     string
		observed float64
		down     *float64
		blind    float64
	}{{pathTransport, 2.5, down(0.4), 0.4}, {pathLocalProxy, 2.6, down(0.4), 0.4}, {pathHAProxy, 54, down(53.5), 11.7}} {
		r := FailoverRow{Fault: "hang", Path: p.path, Victim: "10.250.0.2:6443", MarkedDown: p.down, HasHealth: true, Observed: p.observed, LongestGetGap: p.blind}
		for i := -60; float64(i)/30 < p.observed; i++ {
			at := float64(i) / 30
			ok := true
			if p.path == pathLocalProxy && at >= 0.4 && at < 0.45 {
				ok = false
			}
			if p.path == pathHAProxy && at >= 0 && at < 11.7 {
				if at < 10 {
					continue // stuck until they time out
				}
				ok = false
			}
			if at >= 0 {
				r.Gets++
				if !ok {
					r.GetsFailed++
				}
			}
			r.samples = append(r.samples, plots.Sample{At: at, OK: ok})
		}
		rows = append(rows, r)
	}
	return append(rows, FailoverRow{Fault: "kill", Path: pathTransport, Error: "could not measure"})
}

func TestDrawFailover(t *testing.T) {
	dir := t.TempDir()
	rows := syntheticFailover()
	files, err := drawFailover(dir, rows, map[string]string{"hang": "SIGSTOP"})
	if err != nil {
		t.Fatal(err)
	}
	// The kill row was not measured: no chart for it.
	if want := filepath.Join(dir, "failover-hang.svg"); len(files) != 1 || files[0] != want {
		t.Fatalf("drawFailover wrote %v, want [%s]", files, want)
	}
	texts, err := plots.SVGTexts(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if n := plots.CountTexts(texts, "hang 10.250.0.2:6443"); n != 3 {
		t.Errorf("fault band labelled %d times, want once per path (3)", n)
	}
	for _, want := range []string{"transport: 0/", "localproxy: ", "haproxy: ", "marked down 53.50s", "marked down", "SIGSTOP"} {
		if plots.CountTexts(texts, want) == 0 {
			t.Errorf("no %q in the chart's texts %q", want, texts)
		}
	}
	if keep := os.Getenv("PLOTS_KEEP"); keep != "" {
		tl := failoverTimeline("hang", "SIGSTOP", rows[:3])
		if err := tl.Save(filepath.Join(keep, "failover-hang.png")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDrawOverhead(t *testing.T) {
	dir := t.TempDir()
	var rows []OverheadRow
	for i, path := range []string{pathDirect, pathTransport, pathLocalProxy, pathHAProxy} {
		lat := make([]time.Duration, 500)
		for j := range lat {
			lat[j] = time.Millisecond + time.Duration(i*100+j)*10*time.Microsecond
		}
		rows = append(rows, OverheadRow{Op: opGetSeq, Path: path, latencies: latencyQuantiles(lat)},
			OverheadRow{Op: opList, Path: path, latencies: latencyQuantiles(lat)})
	}
	rows = append(rows, OverheadRow{Op: opNewConn, Path: pathDirect, Error: "100 of 100 requests failed"})
	files, err := drawOverhead(dir, rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0] != filepath.Join(dir, "overhead-get-seq.svg") || files[1] != filepath.Join(dir, "overhead-list.svg") {
		t.Fatalf("drawOverhead wrote %v, want overhead-get-seq.svg and overhead-list.svg", files)
	}
	for _, f := range files {
		texts, err := plots.SVGTexts(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{pathDirect, pathTransport, pathLocalProxy, pathHAProxy} {
			if plots.CountTexts(texts, path+" (p50") != 1 {
				t.Errorf("%s: no line for %s in %q", f, path, texts)
			}
		}
	}
}
