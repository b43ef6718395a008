package plots_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apifailover/apifailover/hack/plots"
)

// svgTexts checks that path is an SVG document and returns its texts.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	texts, err := plots.SVGTexts(path)
	if err != nil {
		t.Fatal(err)
	}
	return texts
}

func count(texts []string, s string) int { return plots.CountTexts(texts, s) }

func TestBin(t *testing.T) {
	samples := []plots.Sample{{At: -0.5, OK: true}, {At: 0, OK: true}, {At: 0.99, OK: false}, {At: 1, OK: true}, {At: 2.5, OK: false}, {At: 3, OK: true}}
	ok, failed := plots.Bin(samples, 0, 1, 3)
	if want := []float64{1, 1, 0}; !equal(ok, want) {
		t.Errorf("ok = %v, want %v", ok, want)
	}
	if want := []float64{1, 0, 1}; !equal(failed, want) {
		t.Errorf("failed = %v, want %v", failed, want)
	}
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestQuantiles(t *testing.T) {
	v := make([]float64, 10001)
	for i := range v {
		v[i] = float64(len(v) - i) // descending
	}
	q := plots.Quantiles(v, 101)
	if len(q) != 101 || q[0] != 1 || q[100] != 10001 || q[50] != 5001 {
		t.Fatalf("Quantiles: len %d, first %v, middle %v, last %v; want 101, 1, 5001, 10001", len(q), q[0], q[50], q[100])
	}
	if v[0] != 10001 {
		t.Fatal("Quantiles changed its input")
	}
	if got := plots.Quantiles([]float64{3, 1, 2}, 10); !equal(got, []float64{1, 2, 3}) {
		t.Fatalf("Quantiles of fewer values than points = %v, want them sorted", got)
	}
}

// synthetic is a two-path timeline of 60s with three faults.
func synthetic() plots.Timeline {
	tl := plots.Timeline{Title: "synthetic soak", XLabel: "seconds since the load started", Bin: 1,
		Bands: []plots.Band{
			{From: 5, To: 10, Label: "kill apiserver-1", Kind: "kill"},
			{From: 20, To: 26, Label: "hang apiserver-2", Kind: "hang"},
			{From: 40, To: 45, Label: "all-down every apiserver", Kind: "all-down"},
		}}
	for _, path := range []string{"transport", "localproxy"} {
		var samples []plots.Sample
		for i := range 60 * 30 {
			at := float64(i) / 30
			ok := !(at >= 40 && at < 45) && !(path == "localproxy" && at >= 20 && at < 20.5)
			samples = append(samples, plots.Sample{At: at, OK: ok})
		}
		ok, failed := plots.Bin(samples, 0, 1, 60)
		tl.Panels = append(tl.Panels, plots.Panel{Title: path, OK: ok, Failed: failed, Marks: []plots.Mark{
			{At: 5.05, Kind: plots.MarkDown, Label: "1"}, {At: 5.06, Kind: plots.MarkFailover, Label: "2"},
			{At: 12, Kind: plots.MarkUp, Label: "1"}, {At: 20.4, Kind: plots.MarkDown, Label: "2"},
		}})
	}
	return tl
}

func TestTimelineSVG(t *testing.T) {
	tl := synthetic()
	path := filepath.Join(t.TempDir(), "timeline.svg")
	if err := tl.Save(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 {
		t.Fatalf("timeline.svg: %v, size %d", err, fi.Size())
	}
	texts := svgTexts(t, path)
	for _, b := range tl.Bands {
		if n := count(texts, b.Label); n != 1 {
			t.Errorf("band %q labelled %d times, want once", b.Label, n)
		}
	}
	for _, want := range []string{"transport", "localproxy", "answered", "failed", "marked down", "marked up", "preferred changed", "seconds since the load started"} {
		if count(texts, want) == 0 {
			t.Errorf("no text %q in the SVG (texts: %q)", want, texts)
		}
	}
	if dir := os.Getenv("PLOTS_KEEP"); dir != "" {
		// For a look at the charts: PLOTS_KEEP=/tmp/x go test ./hack/plots/
		for _, ext := range []string{".svg", ".png"} {
			if err := tl.Save(filepath.Join(dir, "timeline"+ext)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// With ScalePerPanel a panel of 1 request/s gets a y axis of its own
// (ticks below 2), not the 30/s panel's; without it both share one.
func TestTimelineScalePerPanel(t *testing.T) {
	tl := synthetic()
	slow := make([]float64, 60)
	for i := range slow {
		slow[i] = 1
	}
	tl.Panels = append(tl.Panels, plots.Panel{Title: "kubectl", OK: slow, Failed: make([]float64, 60)})
	for _, perPanel := range []bool{false, true} {
		tl.ScalePerPanel = perPanel
		path := filepath.Join(t.TempDir(), "timeline.svg")
		if err := tl.Save(path); err != nil {
			t.Fatal(err)
		}
		texts := svgTexts(t, path)
		// "1.5" is a tick only on an axis that ends below 2 requests/s.
		if got := count(texts, "1.5") > 0; got != perPanel {
			t.Errorf("ScalePerPanel %v: a tick at 1.5 requests/s: %v (texts %q)", perPanel, got, texts)
		}
	}
}

func TestTimelineNeedsAPanel(t *testing.T) {
	tl := plots.Timeline{Bin: 1}
	if err := tl.Save(filepath.Join(t.TempDir(), "x.svg")); err == nil {
		t.Fatal("a timeline without panels saved")
	}
	tl = synthetic()
	if err := tl.Save(filepath.Join(t.TempDir(), "x.pdf")); err == nil {
		t.Fatal("a .pdf saved: want .svg or .png only")
	}
}

func TestCDFSVG(t *testing.T) {
	c := plots.CDF{Title: "get-seq", XLabel: "latency (ms)", LogX: true}
	for i, path := range []string{"direct", "transport", "localproxy", "haproxy"} {
		var v []float64
		for j := range 5000 {
			v = append(v, 1+float64(i)*0.1+float64(j%100)*0.05)
		}
		c.Lines = append(c.Lines, plots.Line{Name: path, Values: v})
	}
	path := filepath.Join(t.TempDir(), "cdf.svg")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, path)
	for _, l := range c.Lines {
		if count(texts, l.Name) != 1 {
			t.Errorf("line %q in the legend %d times, want once", l.Name, count(texts, l.Name))
		}
	}
	if dir := os.Getenv("PLOTS_KEEP"); dir != "" {
		if err := c.Save(filepath.Join(dir, "cdf.png")); err != nil {
			t.Fatal(err)
		}
	}
	c.Lines[0].Values[0] = 0
	if err := c.Save(path); err == nil {
		t.Error("a log axis accepted a zero latency")
	}
}
