// Package plots draws the charts of the chaos soak and the benchmarks with
// gonum.org/v1/plot: timelines of requests answered and failed, one panel
// per client path, with the faults as shaded bands and the paths' health
// events as markers (Timeline), and latency CDFs (CDF). The file name's
// extension picks the format: .svg (fonts not embedded, a few tens of
// KiB) or .png.
package plots

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Timeline is requests over time in panels that share their x axis
// (seconds), with fault bands across every panel.
type Timeline struct {
	Title  string
	XLabel string
	// Bin is the width in seconds of the panels' count bins. Counts are
	// drawn as rates: requests per second. Required.
	Bin float64
	// From and To bound the x axis. If both are zero, the bins, bands
	// and marks decide.
	From, To float64
	// Bands are drawn behind every panel, labelled in the first.
	Bands []Band
	// Panels, top to bottom. At least one.
	Panels []Panel
	// ScalePerPanel gives each panel a y axis of its own data: panels of
	// different rates (a path of 90 requests/s above one of 1/s). Else
	// one y axis serves every panel, for panels to compare.
	ScalePerPanel bool
}

// Band is a fault window.
type Band struct {
	From, To float64
	// Label names the fault and its target: "kill apiserver-2".
	Label string
	// Kind picks the colour: bands of one kind share it.
	Kind string
}

// Panel is one client path's requests.
type Panel struct {
	Title string
	// Start is the x of the first bin: OK[i] and Failed[i] count the
	// requests that ended in [Start+i*Bin, Start+(i+1)*Bin).
	Start      float64
	OK, Failed []float64
	Marks      []Mark
	// Bands are this panel's own, labelled in it: a fault that lasted
	// longer for one path than for another.
	Bands []Band
}

// MarkKind says what a Mark records; each kind has its colour and glyph.
type MarkKind int

const (
	// MarkFault: a fault was injected (a black line).
	MarkFault MarkKind = iota + 1
	// MarkDown: the path counted an apiserver down (red, downward
	// triangle).
	MarkDown
	// MarkUp: the path counted an apiserver healthy again (green, upward
	// triangle).
	MarkUp
	// MarkFailover: the path's preferred apiserver changed (blue,
	// diamond).
	MarkFailover
)

// Mark is a moment in one panel: a vertical line, a glyph at the top and
// an optional short label beside it.
type Mark struct {
	At    float64
	Kind  MarkKind
	Label string
}

// Sample is one finished request, At seconds on the timeline's axis.
type Sample struct {
	At float64
	OK bool
}

// Bin counts samples into n bins of width bin from start; samples outside
// are dropped.
func Bin(samples []Sample, start, bin float64, n int) (ok, failed []float64) {
	ok, failed = make([]float64, n), make([]float64, n)
	for _, s := range samples {
		i := int(math.Floor((s.At - start) / bin))
		if i < 0 || i >= n {
			continue
		}
		if s.OK {
			ok[i]++
		} else {
			failed[i]++
		}
	}
	return ok, failed
}

var (
	okColor     = color.RGBA{R: 0x1a, G: 0x98, B: 0x50, A: 0xff}
	failedColor = color.RGBA{R: 0xd7, G: 0x30, B: 0x27, A: 0xff}
	// bandColors are the fault bands' colours, light enough to draw the
	// series over them, one per kind in order of first appearance.
	bandColors = []color.NRGBA{
		{R: 0xfd, G: 0xae, B: 0x61, A: 0x55},
		{R: 0xab, G: 0xd9, B: 0xe9, A: 0x77},
		{R: 0xc2, G: 0xa5, B: 0xcf, A: 0x66},
		{R: 0xfe, G: 0xe0, B: 0x90, A: 0x88},
		{R: 0xa6, G: 0xd9, B: 0x6a, A: 0x66},
		{R: 0xf4, G: 0xa5, B: 0x82, A: 0x66},
		{R: 0x92, G: 0xc5, B: 0xde, A: 0x77},
		{R: 0xbd, G: 0xbd, B: 0xbd, A: 0x88},
	}
	markStyles = map[MarkKind]struct {
		color color.Color
		glyph draw.GlyphDrawer
		name  string
	}{
		MarkFault:    {color.Black, draw.BoxGlyph{}, "fault"},
		MarkDown:     {failedColor, downGlyph{}, "marked down"},
		MarkUp:       {okColor, draw.PyramidGlyph{}, "marked up"},
		MarkFailover: {color.RGBA{R: 0x21, G: 0x66, B: 0xac, A: 0xff}, diamondGlyph{}, "preferred changed"},
	}
)

// Save draws the timeline into path (.svg or .png).
func (t *Timeline) Save(path string) error {
	if len(t.Panels) == 0 || t.Bin <= 0 {
		return errors.New("plots: a timeline needs a panel and a bin width")
	}
	from, to := t.xRange()
	// The y axis' top: the highest rate, with headroom for the legend
	// and the marks' glyphs above the data.
	peak := func(panels ...Panel) float64 {
		top := 1.0
		for _, p := range panels {
			for i := range p.OK {
				top = max(top, (p.OK[i]+p.Failed[i])/t.Bin)
			}
		}
		return top * 1.75
	}
	top := peak(t.Panels...)
	kinds := map[string]color.Color{}
	for _, b := range slices.Concat(t.Bands, t.panelBands()) {
		if _, ok := kinds[b.Kind]; !ok {
			kinds[b.Kind] = bandColors[len(kinds)%len(bandColors)]
		}
	}
	// One legend, in the first panel: the marks of every panel.
	var allMarks marks
	for _, pn := range t.Panels {
		allMarks.marks = append(allMarks.marks, pn.Marks...)
	}
	plots := make([][]*plot.Plot, len(t.Panels))
	for i, pn := range t.Panels {
		p := plot.New()
		p.Title.Text = pn.Title
		p.Title.TextStyle.Font.Size = vg.Points(11)
		p.X.Tick.Marker = stepTicks{}
		p.Y.Label.Text = "requests/s"
		p.Y.Tick.Marker = rateTicks{}
		if i == len(t.Panels)-1 {
			p.X.Label.Text = t.XLabel
		}
		p.Add(plotter.NewGrid())
		p.Add(&bands{bands: t.Bands, colors: kinds, labels: i == 0})
		p.Add(&bands{bands: pn.Bands, colors: kinds, labels: true})
		for _, s := range []struct {
			name   string
			counts []float64
			color  color.Color
			width  vg.Length
		}{{"answered", pn.OK, okColor, 1.2}, {"failed", pn.Failed, failedColor, 1.2}} {
			l, err := plotter.NewLine(rates(pn.Start, t.Bin, s.counts))
			if err != nil {
				return fmt.Errorf("plots: %s: %w", pn.Title, err)
			}
			l.StepStyle = plotter.PostStep
			l.Color, l.Width = s.color, s.width
			p.Add(l)
			if i == 0 {
				p.Legend.Add(s.name, l)
			}
		}
		p.Add(&marks{marks: pn.Marks})
		if i == 0 {
			for _, k := range allMarks.kinds() {
				p.Legend.Add(markStyles[k].name, markThumb(k))
			}
		}
		// After the plotters: adding one widens the axes to its data.
		p.X.Min, p.X.Max = from, to
		p.Y.Min, p.Y.Max = 0, top
		if t.ScalePerPanel {
			p.Y.Max = peak(pn)
		}
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		plots[i] = []*plot.Plot{p}
	}
	if t.Title != "" {
		plots[0][0].Title.Text = t.Title + "\n" + plots[0][0].Title.Text
	}
	height := vg.Length(len(t.Panels))*2.3*vg.Inch + 0.6*vg.Inch
	return save(path, 10*vg.Inch, height, func(dc draw.Canvas) {
		tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: 4, PadBottom: 4, PadLeft: 4, PadRight: 8, PadY: 10}
		cs := plot.Align(plots, tiles, dc)
		for i := range plots {
			plots[i][0].Draw(cs[i][0])
		}
	})
}

// xRange is From..To, or what the data cover.
func (t *Timeline) xRange() (from, to float64) {
	if t.From != 0 || t.To != 0 {
		return t.From, t.To
	}
	from, to = math.Inf(1), math.Inf(-1)
	see := func(x float64) { from, to = min(from, x), max(to, x) }
	for _, p := range t.Panels {
		see(p.Start)
		see(p.Start + float64(len(p.OK))*t.Bin)
		for _, m := range p.Marks {
			see(m.At)
		}
	}
	for _, b := range slices.Concat(t.Bands, t.panelBands()) {
		see(b.From)
		see(b.To)
	}
	return from, to
}

func (t *Timeline) panelBands() []Band {
	var bs []Band
	for _, p := range t.Panels {
		bs = append(bs, p.Bands...)
	}
	return bs
}

// rates turns counts per bin into a step line of rates per second: a
// point at the start of every bin and one at the end of the last.
func rates(start, bin float64, counts []float64) plotter.XYs {
	xys := make(plotter.XYs, 0, len(counts)+1)
	for i, c := range counts {
		xys = append(xys, plotter.XY{X: start + float64(i)*bin, Y: c / bin})
	}
	if n := len(counts); n > 0 {
		xys = append(xys, plotter.XY{X: start + float64(n)*bin, Y: counts[n-1] / bin})
	} else {
		xys = append(xys, plotter.XY{X: start}, plotter.XY{X: start + bin})
	}
	return xys
}

// bands draws the fault windows over the whole height of a panel.
type bands struct {
	bands  []Band
	colors map[string]color.Color
	labels bool
}

func (b *bands) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	sty := draw.TextStyle{Color: color.Gray{Y: 0x30}, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler,
		Rotation: math.Pi / 2, XAlign: draw.XRight, YAlign: draw.YBottom}
	sty.Font.Size = vg.Points(8)
	for _, band := range b.bands {
		x0, x1 := max(trX(band.From), c.Min.X), min(trX(band.To), c.Max.X)
		if x1 <= x0 {
			continue
		}
		c.FillPolygon(b.colors[band.Kind], []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		if b.labels && band.Label != "" {
			// Along the band's right edge, inside: the marks sit at its
			// left, where the fault began.
			c.FillText(sty, vg.Point{X: x1 - 1, Y: c.Max.Y - 3}, band.Label)
		}
	}
}

// marks draws vertical lines with a glyph and label near the top.
type marks struct{ marks []Mark }

func (m *marks) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	lsty := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler, XAlign: draw.XLeft, YAlign: draw.YCenter}
	lsty.Font.Size = vg.Points(7)
	// Glyphs of one kind share a row below the top, so kinds do not
	// hide each other.
	row := map[MarkKind]vg.Length{MarkFault: 8, MarkDown: 20, MarkUp: 32, MarkFailover: 44}
	for _, mk := range m.marks {
		st, ok := markStyles[mk.Kind]
		if !ok {
			continue
		}
		x := trX(mk.At)
		if !c.ContainsX(x) {
			continue
		}
		line := draw.LineStyle{Color: st.color, Width: vg.Points(0.6), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
		if mk.Kind == MarkFault {
			line = draw.LineStyle{Color: st.color, Width: vg.Points(1)}
		}
		c.StrokeLine2(line, x, c.Min.Y, x, c.Max.Y)
		y := c.Max.Y - row[mk.Kind]
		c.DrawGlyph(draw.GlyphStyle{Color: st.color, Radius: vg.Points(3.5), Shape: st.glyph}, vg.Point{X: x, Y: y})
		if mk.Label != "" {
			c.FillText(lsty, vg.Point{X: x + 5, Y: y}, mk.Label)
		}
	}
}

// kinds returns the kinds present, in MarkKind order.
func (m *marks) kinds() []MarkKind {
	var ks []MarkKind
	for _, mk := range m.marks {
		if _, ok := markStyles[mk.Kind]; ok && !slices.Contains(ks, mk.Kind) {
			ks = append(ks, mk.Kind)
		}
	}
	slices.Sort(ks)
	return ks
}

// markThumb is a legend entry for a kind of mark.
type markThumb MarkKind

func (k markThumb) Thumbnail(c *draw.Canvas) {
	st := markStyles[MarkKind(k)]
	c.DrawGlyph(draw.GlyphStyle{Color: st.color, Radius: vg.Points(3.5), Shape: st.glyph}, c.Center())
}

// downGlyph is a triangle pointing down.
type downGlyph struct{}

func (downGlyph) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetColor(sty.Color)
	r := sty.Radius
	var p vg.Path
	p.Move(vg.Point{X: pt.X - r, Y: pt.Y + r*0.6})
	p.Line(vg.Point{X: pt.X + r, Y: pt.Y + r*0.6})
	p.Line(vg.Point{X: pt.X, Y: pt.Y - r})
	p.Close()
	c.Fill(p)
}

// diamondGlyph is a filled diamond.
type diamondGlyph struct{}

func (diamondGlyph) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetColor(sty.Color)
	r := sty.Radius
	var p vg.Path
	p.Move(vg.Point{X: pt.X, Y: pt.Y + r})
	p.Line(vg.Point{X: pt.X + r, Y: pt.Y})
	p.Line(vg.Point{X: pt.X, Y: pt.Y - r})
	p.Line(vg.Point{X: pt.X - r, Y: pt.Y})
	p.Close()
	c.Fill(p)
}

// stepTicks labels the x axis every 1, 2, 5, 10, 15, 30, 60, 120 or 300
// seconds, whichever gives at most 16 labels.
type stepTicks struct{}

func (stepTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 300.0
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120} {
		if (hi-lo)/s <= 16 {
			step = s
			break
		}
	}
	var ts []plot.Tick
	for x := math.Ceil(lo/step) * step; x <= hi; x += step {
		ts = append(ts, plot.Tick{Value: x, Label: strconv.FormatFloat(x+0, 'f', -1, 64)}) // +0: no "-0"
		if minor := x + step/2; minor < hi {
			ts = append(ts, plot.Tick{Value: minor})
		}
	}
	return ts
}

// rateTicks labels the y axis at 1, 2 or 5 × 10^k steps, at most 6
// labels, without decimals where none are needed.
type rateTicks struct{}

func (rateTicks) Ticks(lo, hi float64) []plot.Tick {
	step := math.Pow(10, math.Floor(math.Log10(max(hi-lo, 1e-9))))
	for _, m := range []float64{0.1, 0.2, 0.5, 1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var ts []plot.Tick
	for y := math.Ceil(lo/step) * step; y <= hi; y += step {
		ts = append(ts, plot.Tick{Value: y, Label: strconv.FormatFloat(y+0, 'g', 4, 64)})
	}
	return ts
}
