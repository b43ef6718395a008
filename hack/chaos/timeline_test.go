package chaos_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apifailover/apifailover/hack/chaos"
	"github.com/apifailover/apifailover/hack/plots"
)

// syntheticSummary is a 2-minute soak of seed 7 as summary.json holds it:
// its schedule as it happened, 60 requests a second per path with
// failures in the fault windows, and a down, a failover and an up on each
// path per fault.
func syntheticSummary() *chaos.Summary {
	d := 2 * time.Minute
	s := &chaos.Summary{Seed: 7, Duration: d.Seconds(), Schedule: chaos.Plan(7, d, 3),
		SuccessByPath: map[string]float64{"transport": 1, "localproxy": 0.9978}}
	s.Timeline.PerSecond = map[string]chaos.Counts{}
	for _, path := range []string{"localproxy", "transport"} {
		var c chaos.Counts
		for i := range int(d.Seconds()) {
			failed := 0
			for _, st := range s.Schedule {
				if float64(i) >= st.At.Seconds() && float64(i) < st.End().Seconds() && (st.Kind == chaos.AllDown || path == "localproxy") {
					failed = 6
					if st.Kind == chaos.AllDown {
						failed = 60
					}
				}
			}
			c.OK, c.Failed = append(c.OK, 60-failed), append(c.Failed, failed)
		}
		s.Timeline.PerSecond[path] = c
	}
	for _, st := range s.Schedule {
		from := st.At.Seconds() + 0.02
		s.Timeline.Faults = append(s.Timeline.Faults, chaos.FaultWindow{Kind: st.Kind, Server: st.Server, From: from, To: st.End().Seconds() + 0.3})
		if st.Server < 0 {
			continue
		}
		other := (st.Server + 1) % 3
		addr := func(i int) string { return fmt.Sprintf("10.250.0.%d:6443", i+1) }
		for _, path := range []string{"transport", "localproxy"} {
			s.Timeline.Events = append(s.Timeline.Events,
				chaos.PathEvent{At: from + 0.4, Path: path, Kind: "down", Server: st.Server, Addr: addr(st.Server)},
				chaos.PathEvent{At: from + 0.4, Path: path, Kind: "preferred", Server: other, Addr: addr(other)},
				chaos.PathEvent{At: st.End().Seconds() + 2, Path: path, Kind: "up", Server: st.Server, Addr: addr(st.Server)})
		}
	}
	return s
}

// TestWriteTimeline draws the timeline of a synthetic soak: an SVG
// document with a labelled band per fault and a panel per path.
func TestWriteTimeline(t *testing.T) {
	s := syntheticSummary()
	if len(s.Timeline.Faults) < 3 {
		t.Fatalf("seed 7's 2-minute schedule has %d faults: want a few to draw", len(s.Timeline.Faults))
	}
	path := filepath.Join(t.TempDir(), "timeline.svg")
	if err := chaos.WriteTimeline(s, path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("timeline.svg: %v (empty?)", err)
	}
	texts, err := plots.SVGTexts(path)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]int{}
	for _, f := range s.Timeline.Faults {
		target := fmt.Sprintf("apiserver-%d", f.Server+1)
		switch {
		case f.Kind == chaos.Handover:
			target = "localproxy"
		case f.Kind == chaos.Join && f.Server < 0:
			target = "a new apiserver"
		case f.Server < 0:
			target = "every apiserver"
		}
		labels[string(f.Kind)+" "+target]++
	}
	bands := 0
	for label, n := range labels {
		if got := plots.CountTexts(texts, label); got != n {
			t.Errorf("band %q labelled %d times, want %d", label, got, n)
		}
		bands += n
	}
	if bands != len(s.Timeline.Faults) {
		t.Errorf("%d band labels for %d faults", bands, len(s.Timeline.Faults))
	}
	for _, want := range []string{"transport (", "localproxy (", "seed 7", "marked down", "marked up", "preferred changed"} {
		if plots.CountTexts(texts, want) == 0 {
			t.Errorf("no %q in the timeline's texts %q", want, texts)
		}
	}
	if dir := os.Getenv("PLOTS_KEEP"); dir != "" {
		if err := chaos.WriteTimeline(s, filepath.Join(dir, "chaos-timeline.png")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWriteTimelineNeedsRequests(t *testing.T) {
	s := &chaos.Summary{Seed: 1, Duration: 60}
	if err := chaos.WriteTimeline(s, filepath.Join(t.TempDir(), "timeline.svg")); err == nil {
		t.Fatal("a timeline without requests was drawn")
	}
}
