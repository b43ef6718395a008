package plots

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// CDF is the cumulative distribution of one measure (a latency) over
// several series (paths), one line each.
type CDF struct {
	Title, XLabel string
	// LogX draws the x axis on a log scale; every value must be positive.
	LogX  bool
	Lines []Line
}

// Line is one series of a CDF: its values, in any order.
type Line struct {
	Name   string
	Values []float64
}

// MaxPoints bounds the points of one CDF line: more values are drawn
// through evenly spaced quantiles.
const MaxPoints = 2000

// Quantiles returns at most n values of v at evenly spaced ranks, the
// smallest and the largest included, sorted: what a CDF of v needs, in
// bounded memory. v is not changed.
func Quantiles(v []float64, n int) []float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) <= n || n < 2 {
		return s
	}
	out := make([]float64, n)
	for i := range n {
		out[i] = s[i*(len(s)-1)/(n-1)]
	}
	return out
}

// Save draws the CDF into path (.svg or .png).
func (c *CDF) Save(path string) error {
	if len(c.Lines) == 0 {
		return errors.New("plots: a CDF needs a line")
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = "fraction of requests"
	p.Y.Min, p.Y.Max = 0, 1
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = logTicks{}
	}
	p.Add(plotter.NewGrid())
	for i, ln := range c.Lines {
		q := Quantiles(ln.Values, MaxPoints)
		if len(q) == 0 {
			continue
		}
		if c.LogX && q[0] <= 0 {
			return fmt.Errorf("plots: %s: a log axis needs positive values", ln.Name)
		}
		xys := make(plotter.XYs, len(q))
		for j, v := range q {
			xys[j] = plotter.XY{X: v, Y: float64(j+1) / float64(len(q))}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plots: %s: %w", ln.Name, err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.DarkColors[i%len(plotutil.DarkColors)]
		l.Dashes = plotutil.Dashes(i / len(plotutil.DarkColors))
		l.Width = vg.Points(1.3)
		p.Add(l)
		p.Legend.Add(ln.Name, l)
	}
	p.Legend.Left, p.Legend.Top = false, false
	p.Legend.XOffs = -vg.Points(6)
	p.Legend.YOffs = vg.Points(20)
	return save(path, 7*vg.Inch, 4.5*vg.Inch, func(dc draw.Canvas) { p.Draw(dc) })
}

// logTicks labels 1, 2 and 5 of every decade, with minor ticks between.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
		for m := 1.0; m < 10; m++ {
			v := m * d
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ts = append(ts, t)
		}
	}
	return ts
}
