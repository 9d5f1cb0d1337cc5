package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
)

// The chart: the latency distributions on top (dispatch and submit →
// terminal, as histograms on one millisecond axis), throughput over time
// below (submits and terminal writes per second). Drawn with image/draw only.
const (
	chartW      = 960
	chartH      = 660
	marginLeft  = 80
	marginRight = 24
	panelTop1   = 76
	panelBot1   = 310
	panelTop2   = 400
	panelBot2   = 610
	chartTicks  = 5
)

var (
	colBG       = color.RGBA{255, 255, 255, 255}
	colAxis     = color.RGBA{60, 60, 60, 255}
	colGrid     = color.RGBA{225, 225, 225, 255}
	colText     = color.RGBA{30, 30, 30, 255}
	colDispatch = color.RGBA{40, 100, 200, 255}
	colTerminal = color.RGBA{230, 120, 20, 255}
	colSubmit   = color.RGBA{150, 150, 150, 255}
	colDone     = color.RGBA{30, 150, 60, 255}
)

// WriteChart draws res to path as PNG.
func WriteChart(res *Result, path string) error {
	img := image.NewRGBA(image.Rect(0, 0, chartW, chartH))
	draw.Draw(img, img.Bounds(), &image.Uniform{colBG}, image.Point{}, draw.Src)

	title := fmt.Sprintf("%s (%s node): %d jobs, %d workers, %s: %.0f jobs/s", res.Target, res.NodeMode,
		res.Params.Jobs, res.Params.Workers, rateText(res.Params.Rate), res.JobsPerSec)
	drawText(img, marginLeft, 12, title, colText)
	drawText(img, marginLeft, 30, fmt.Sprintf("run %s  %s  %s", res.RunID, res.Started.Format("2006-01-02 15:04"),
		res.Env.Git), colAxis)

	// Latency histograms.
	h1, h2 := res.DispatchHist, res.TerminalHist
	peak := 1
	for i := range h1.Counts {
		peak = max(peak, h1.Counts[i])
	}
	for i := range h2.Counts {
		peak = max(peak, h2.Counts[i])
	}
	xMax := h1.BucketMs * float64(len(h1.Counts))
	peak = int(niceCeil(float64(peak)))
	axes(img, panelTop1, panelBot1, xMax, float64(peak), "latency ms", "jobs")
	drawHist(img, h2, peak, colTerminal)
	drawHist(img, h1, peak, colDispatch)
	legend(img, panelTop1-glyphH-10, []string{
		fmt.Sprintf("dispatch p50 %.2f p99 %.2f", res.DispatchMs.P50, res.DispatchMs.P99),
		fmt.Sprintf("submit > terminal p50 %.2f p99 %.2f", res.SubmitToTerminalMs.P50, res.SubmitToTerminalMs.P99),
	}, []color.Color{colDispatch, colTerminal})

	// Throughput over time.
	tl := res.Timeline
	if len(tl.Terminal) > 0 {
		perSec := 1000 / tl.BucketMs
		top := 1.0
		for i := range tl.Terminal {
			top = math.Max(top, float64(tl.Terminal[i])*perSec)
			top = math.Max(top, float64(tl.Submitted[i])*perSec)
		}
		top = niceCeil(top)
		secs := tl.BucketMs * float64(len(tl.Terminal)) / 1000
		axes(img, panelTop2, panelBot2, secs, top, "seconds since first submit", "jobs/s")
		drawSeries(img, tl.Submitted, perSec, top, colSubmit)
		drawSeries(img, tl.Terminal, perSec, top, colDone)
		legend(img, panelTop2-glyphH-10, []string{"submitted per s", "terminal per s"}, []color.Color{colSubmit, colDone})
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func rateText(rate float64) string {
	if rate <= 0 {
		return "full speed"
	}
	return fmt.Sprintf("%.0f jobs/s offered", rate)
}

// axes draws a panel's frame, grid and tick labels.
func axes(img *image.RGBA, top, bottom int, xMax, yMax float64, xLabel, yLabel string) {
	left, right := marginLeft, chartW-marginRight
	for i := 0; i <= chartTicks; i++ {
		y := bottom - (bottom-top)*i/chartTicks
		hline(img, left, right, y, colGrid)
		lbl := tickText(yMax * float64(i) / chartTicks)
		drawText(img, left-8-textWidth(lbl), y-glyphH/2, lbl, colText)
		x := left + (right-left)*i/chartTicks
		vline(img, x, top, bottom, colGrid)
		lbl = tickText(xMax * float64(i) / chartTicks)
		drawText(img, x-textWidth(lbl)/2, bottom+8, lbl, colText)
	}
	hline(img, left, right, bottom, colAxis)
	vline(img, left, top, bottom, colAxis)
	drawText(img, (left+right)/2-textWidth(xLabel)/2, bottom+26, xLabel, colAxis)
	drawText(img, 8, top-glyphH-6, yLabel, colAxis)
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 × 10^k, so the five y ticks fall on
// round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func tickText(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// legend draws the series' names in one row above a panel, right-aligned.
func legend(img *image.RGBA, y int, labels []string, cols []color.Color) {
	const swatch, gap = 16, 24
	w := 0
	for _, l := range labels {
		w += swatch + textWidth(l) + gap
	}
	x := chartW - marginRight - w + gap
	for i, l := range labels {
		fill(img, image.Rect(x, y, x+10, y+glyphH), cols[i])
		drawText(img, x+swatch, y, l, colText)
		x += swatch + textWidth(l) + gap
	}
}

// drawHist draws h as a step outline with a light fill, scaled to peak.
func drawHist(img *image.RGBA, h Histogram, peak int, c color.RGBA) {
	left, right := marginLeft, chartW-marginRight
	n := len(h.Counts)
	if n == 0 {
		return
	}
	light := color.RGBA{uint8((int(c.R) + 3*255) / 4), uint8((int(c.G) + 3*255) / 4), uint8((int(c.B) + 3*255) / 4), 255}
	prevY := panelBot1
	for i, cnt := range h.Counts {
		x0 := left + (right-left)*i/n
		x1 := left + (right-left)*(i+1)/n
		y := panelBot1 - (panelBot1-panelTop1)*cnt/peak
		if cnt > 0 {
			fill(img, image.Rect(x0+1, y+1, x1, panelBot1), light)
		}
		vline(img, x0, min(prevY, y), max(prevY, y), c)
		hline(img, x0, x1, y, c)
		prevY = y
	}
	vline(img, right, prevY, panelBot1, c)
}

// drawSeries draws counts×scale as a polyline, y scaled to top.
func drawSeries(img *image.RGBA, counts []int, scale, top float64, c color.Color) {
	left, right := marginLeft, chartW-marginRight
	n := len(counts)
	px, py := -1, -1
	for i, cnt := range counts {
		x := left + (right-left)*(2*i+1)/(2*n)
		y := panelBot2 - int(float64(panelBot2-panelTop2)*float64(cnt)*scale/top)
		if px >= 0 {
			line(img, px, py, x, y, c)
			line(img, px, py+1, x, y+1, c)
		}
		px, py = x, y
	}
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// line is Bresenham's.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for steps := 0; steps <= chartW+chartH; steps++ { // bounded: a line on the canvas is shorter
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
