package surveyplot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/dnsrace/dnsrace/internal/lab"
)

// Input is one survey file to draw.
type Input struct {
	Name   string // the file name, for the legend when kernels repeat
	Result *lab.SurveyResult
}

// Labels are the legend texts of inputs, in order: the kernel, and the file
// name when two inputs have the same kernel.
func Labels(inputs []Input) []string {
	seen := map[string]int{}
	for _, in := range inputs {
		seen[in.Result.Kernel]++
	}
	out := make([]string, len(inputs))
	for i, in := range inputs {
		out[i] = in.Result.Kernel
		if seen[in.Result.Kernel] > 1 {
			out[i] += " (" + filepath.Base(in.Name) + ")"
		}
	}
	return out
}

const (
	cdfCols   = 2
	rateCols  = 3
	width     = 12 * vg.Inch
	cdfH      = 2.4 * vg.Inch
	rateH     = 2.8 * vg.Inch
	titleH    = 0.55 * vg.Inch
	legendH   = 0.22 * vg.Inch // a line of the legend under the title
	pngDPI    = 96
	minTimeMs = 0.05 // left edge of the time axis at least this low
)

// WriteFile draws inputs to path; the extension (.svg or .png) picks the
// format.
func WriteFile(path string, inputs []Input) error {
	format := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	if format != "svg" && format != "png" {
		return fmt.Errorf("plot file %s: want a .svg or .png name", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating the plot: %w", err)
	}
	if err := Write(f, format, inputs); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// Write draws inputs as format ("svg" or "png") to w.
func Write(w io.Writer, format string, inputs []Input) error {
	if len(inputs) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	scenarios := lab.ScenarioNamesOf(results(inputs)...)
	cdfRows := (len(scenarios) + cdfCols - 1) / cdfCols
	headH := titleH + vg.Length(len(inputs))*legendH + vg.Millimeter*2
	height := headH + vg.Length(cdfRows)*cdfH + rateH

	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(width, height)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(pngDPI))}
	default:
		return fmt.Errorf("plot format %q: want svg or png", format)
	}
	dc := draw.New(c)
	dc.FillPolygon(color.White, []vg.Point{{X: 0, Y: 0}, {X: width, Y: 0}, {X: width, Y: height}, {X: 0, Y: height}})
	drawHead(dc, inputs, height)

	// The CDFs, two a row, then the three rates in one row.
	cdfs := make([][]*plot.Plot, cdfRows)
	for r := range cdfs {
		cdfs[r] = make([]*plot.Plot, cdfCols)
	}
	for i, name := range scenarios {
		p, err := cdfPanel(name, inputs)
		if err != nil {
			return err
		}
		cdfs[i/cdfCols][i%cdfCols] = p
	}
	rates := [][]*plot.Plot{make([]*plot.Plot, rateCols)}
	for i, m := range rateMetrics {
		p, err := ratePanel(m, scenarios, inputs)
		if err != nil {
			return err
		}
		rates[0][i] = p
	}
	pad := func(rows, cols int) draw.Tiles {
		return draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 8, PadY: vg.Millimeter * 5,
			PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 5, PadBottom: vg.Millimeter * 2, PadTop: vg.Millimeter * 2}
	}
	body := draw.Crop(dc, 0, 0, 0, -headH)
	drawGrid(cdfs, pad(cdfRows, cdfCols), draw.Crop(body, 0, 0, rateH, 0))
	drawGrid(rates, pad(1, rateCols), draw.Crop(body, 0, 0, 0, -vg.Length(cdfRows)*cdfH))
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("writing the %s plot: %w", format, err)
	}
	return nil
}

func drawGrid(plots [][]*plot.Plot, t draw.Tiles, dc draw.Canvas) {
	canvases := plot.Align(plots, t, dc)
	for r := range plots {
		for col, p := range plots[r] {
			if p != nil {
				p.Draw(canvases[r][col])
			}
		}
	}
}

// drawHead writes the title and the legend: a colour swatch per input, its
// kernel, file and CPUs.
func drawHead(dc draw.Canvas, inputs []Input, height vg.Length) {
	sty := plot.New().Title.TextStyle
	sty.Font.Size = 15
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - vg.Millimeter*2}, "dnsrace lab survey: lookup latency and race rates by kernel")
	note := sty
	note.Font.Size = 10
	note.Color = color.Gray{Y: 90}
	dc.FillText(note, vg.Point{X: width / 2, Y: height - 0.3*vg.Inch}, "CDFs: share of lookups that took at most t, log time axis; dashed: 2.5 s, 5 s, 10 s (resolver timeouts)")
	sty.Font.Size = 11
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YCenter
	x := width / 2 * 0.45
	for i, l := range Labels(inputs) {
		y := height - titleH - (vg.Length(i)+0.5)*legendH
		sw := vg.Points(8)
		dc.FillPolygon(colour(i), []vg.Point{{X: x, Y: y - sw/2}, {X: x + 2*sw, Y: y - sw/2}, {X: x + 2*sw, Y: y + sw/2}, {X: x, Y: y + sw/2}})
		dc.FillText(sty, vg.Point{X: x + 3*sw, Y: y}, l)
		info := sty
		info.Color = color.Gray{Y: 90}
		in := inputs[i]
		dc.FillText(info, vg.Point{X: x + 3*sw + sty.Width(l) + vg.Points(10), Y: y},
			fmt.Sprintf("%s, %d CPUs, %s", filepath.Base(in.Name), in.Result.CPUs, in.Result.Started.Format("2006-01-02")))
	}
}

func results(inputs []Input) []*lab.SurveyResult {
	out := make([]*lab.SurveyResult, len(inputs))
	for i, in := range inputs {
		out[i] = in.Result
	}
	return out
}

func colour(i int) color.Color { return plotutil.DarkColors[i%len(plotutil.DarkColors)] }

// timeTicks label the log time axis in words, the resolver timeouts
// among them.
func timeTicks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for _, t := range []struct {
		ms    float64
		label string
	}{{0.01, "10µs"}, {0.1, "0.1ms"}, {1, "1ms"}, {10, "10ms"}, {100, "0.1s"}, {1000, "1s"}, {2500, "2.5s"}, {5000, "5s"}, {20000, "20s"}, {60000, "60s"}} {
		if t.ms >= min && t.ms <= max {
			ticks = append(ticks, plot.Tick{Value: t.ms, Label: t.label})
		}
	}
	for d := math.Pow(10, math.Floor(math.Log10(min))); d <= max; d *= 10 {
		for k := 2.0; k < 10; k++ {
			if v := k * d; v >= min && v <= max {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
	}
	return ticks
}

// cdfPanel is one scenario's latency CDF, a line per input that has a
// histogram for it.
func cdfPanel(name string, inputs []Input) (*plot.Plot, error) {
	p := plot.New()
	// No X label: gonum centres it at the linear midpoint of the range,
	// which on a log axis pads the panel's right side away.
	p.Title.Text = name + ": lookup latency CDF"
	p.Y.Label.Text = "share of lookups"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.TickerFunc(timeTicks)
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.TextStyle.Font.Size = 9
	p.Legend.ThumbnailWidth = vg.Points(14)
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(6), vg.Points(6)
	lo, hi := math.Inf(1), 6000.0
	type curve struct {
		xy    plotter.XYs
		label string
		i     int
	}
	var curves []curve
	for i, in := range inputs {
		s, ok := in.Result.Scenario(name)
		if !ok {
			continue
		}
		label := s.Resolver
		if label == "" {
			label = "resolver not recorded"
		}
		h := s.Latency.Histogram
		if h == nil || len(h.LeMs) == 0 {
			p.Legend.Add(label + " (no latencies: survey format 1)")
			continue
		}
		xy := cdf(h)
		lo = math.Min(lo, xy[0].X)
		hi = math.Max(hi, xy[len(xy)-1].X)
		curves = append(curves, curve{xy, label, i})
	}
	if math.IsInf(lo, 1) {
		lo = 0.1
	}
	lo = math.Min(lo, minTimeMs)
	hi *= 1.5
	p.X.Min, p.X.Max = lo, hi
	// The resolvers' timeouts: musl retries after 2.5 s, glibc after 5 s.
	for _, ms := range []float64{2500, 5000, 10000} {
		l, err := plotter.NewLine(plotter.XYs{{X: ms, Y: 0}, {X: ms, Y: 1}})
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 170}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
	}
	for _, c := range curves {
		// Run on to the right edge at 1.
		xy := append(c.xy, plotter.XY{X: hi, Y: 1})
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, fmt.Errorf("drawing %s: %w", name, err)
		}
		l.Color = colour(c.i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(c.label, l)
	}
	return p, nil
}

// cdf turns a histogram into the points of its cumulative distribution:
// each bucket rises from its lower bound to its upper bound, and empty
// stretches between buckets stay flat.
func cdf(h *lab.LatencyHistogram) plotter.XYs {
	total := 0
	for _, n := range h.Count {
		total += n
	}
	width := math.Pow(10, 1.0/100) // a bucket's ratio of bounds
	var xy plotter.XYs
	cum := 0
	for i, le := range h.LeMs {
		lower := le / width
		if i > 0 && lower < h.LeMs[i-1] {
			lower = h.LeMs[i-1]
		}
		xy = append(xy, plotter.XY{X: lower, Y: float64(cum) / float64(total)})
		cum += h.Count[i]
		xy = append(xy, plotter.XY{X: le, Y: float64(cum) / float64(total)})
	}
	return xy
}

type rateMetric struct {
	title string
	get   func(lab.ScenarioResult) float64
}

var rateMetrics = []rateMetric{
	{"races per query (insert_failed + clash_resolve)", func(s lab.ScenarioResult) float64 { return s.RaceRate }},
	{"queries without an answer", func(s lab.ScenarioResult) float64 { return s.LossRate }},
	{"lookups that stalled", func(s lab.ScenarioResult) float64 { return s.StallRate }},
}

// ratePanel is one rate as grouped bars: a group per scenario, a bar per
// input.
func ratePanel(m rateMetric, scenarios []string, inputs []Input) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = m.title
	p.Y.Label.Text = "share"
	p.Y.Min = 0
	p.NominalX(scenarios...)
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	group := width / rateCols * 0.6 / vg.Length(len(scenarios))
	barW := group / vg.Length(len(inputs))
	for i, in := range inputs {
		vals := make(plotter.Values, len(scenarios))
		for j, n := range scenarios {
			if s, ok := in.Result.Scenario(n); ok {
				vals[j] = m.get(s)
			}
		}
		b, err := plotter.NewBarChart(vals, barW)
		if err != nil {
			return nil, fmt.Errorf("drawing %s: %w", m.title, err)
		}
		b.Color = colour(i)
		b.LineStyle.Width = 0
		b.Offset = (vg.Length(i) - vg.Length(len(inputs)-1)/2) * barW
		p.Add(b)
	}
	return p, nil
}
