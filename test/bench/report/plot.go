package report

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/sluice-lb/sluice/test/bench/harness"
)

var plotFiles = []struct{ suffix, title string }{
	{"conns-packet", "new conns/s, per-packet path, random VIP"},
	{"conns-socket", "new conns/s, socket layer, random VIP"},
	{"p99-packet", "p99 conn latency, per-packet path, random VIP"},
	{"p99-socket", "p99 conn latency, socket layer, random VIP"},
	{"prog", "programming time (solid: initial, dashed: 1 endpoint change)"},
}

// series is one line: a point per N with its min..max spread.
type series struct {
	name           string
	xs, ys, lo, hi []float64
	dashed         bool
	colorIdx       int
}

var palette = []color.RGBA{
	{0, 0, 0, 255},       // direct
	{214, 39, 40, 255},   // iptables-nft
	{255, 127, 14, 255},  // iptables-legacy
	{31, 119, 180, 255},  // nftables
	{44, 160, 44, 255},   // sluice
	{148, 103, 189, 255}, // kube-proxy
	{140, 86, 75, 255},
}

func modeColor(m string) int {
	for i, n := range []string{harness.ModeFloor, harness.ModeIptNft, harness.ModeIptLeg, harness.ModeNft, harness.ModeSluice, harness.ModeKubeProx} {
		if n == m {
			return i
		}
	}
	return 6
}

// ModeColor is the palette index of a mode: the load runs' modes by their
// names, the real kube-proxy's (test/bench/kubeproxy) in the colour of the
// ruleset they write, so that a chart of either kind reads alike.
func ModeColor(m string) int {
	switch m {
	case "kube-proxy-iptables":
		return modeColor(harness.ModeIptNft)
	case "kube-proxy-nftables":
		return modeColor(harness.ModeNft)
	}
	return modeColor(m)
}

// PaletteColor is the colour of palette index i, as Chart draws it.
func PaletteColor(i int) color.RGBA { return palette[i%len(palette)] }

// Line is one line of a Chart: a point per N (Xs, ascending) with its
// median (Ys) and min..max spread (Lo, Hi), drawn in palette colour Color
// (ModeColor).
type Line struct {
	Name           string
	Xs, Ys, Lo, Hi []float64
	Dashed         bool
	Color          int
}

// Chart draws lines over a log10 N axis ("services (N, log)") as a PNG at
// path: what Plots draws, for other benchmarks' figures.
func Chart(path, title, ylabel string, logY bool, lines []Line) error {
	ss := make([]series, len(lines))
	for i, l := range lines {
		ss[i] = series{name: l.Name, xs: l.Xs, ys: l.Ys, lo: l.Lo, hi: l.Hi, dashed: l.Dashed, colorIdx: l.Color}
	}
	return chart(path, title, ylabel, logY, ss)
}

// Plots draws the PNG plots and returns their paths.
func Plots(dir, stamp string, res *harness.Results) ([]string, error) {
	var files []string
	for _, f := range plotFiles {
		var ss []series
		var ylabel string
		logY := false
		switch f.suffix {
		case "conns-packet", "conns-socket", "p99-packet", "p99-socket":
			layer := "packet"
			if f.suffix == "conns-socket" || f.suffix == "p99-socket" {
				layer = "socket"
			}
			byMode := map[string]*series{}
			var order []string
			for _, p := range res.Points {
				for _, c := range p.Conn {
					if c.Layer != layer || c.Target != "random" || c.ConnsPerS.Median == 0 {
						continue
					}
					s := byMode[c.Mode]
					if s == nil {
						s = &series{name: c.Mode, colorIdx: modeColor(c.Mode)}
						byMode[c.Mode] = s
						order = append(order, c.Mode)
					}
					st := c.ConnsPerS
					if f.suffix[:3] == "p99" {
						st = c.P99us
					}
					s.xs, s.ys, s.lo, s.hi = append(s.xs, float64(p.Services)), append(s.ys, st.Median), append(s.lo, st.Min), append(s.hi, st.Max)
				}
			}
			for _, m := range order {
				ss = append(ss, *byMode[m])
			}
			ylabel = "connections/s"
			if f.suffix[:3] == "p99" {
				ylabel = "p99 latency (us)"
			}
		case "prog":
			logY = true
			ylabel = "seconds (log)"
			ini, upd := map[string]*series{}, map[string]*series{}
			var order []string
			for _, p := range res.Points {
				for _, ps := range p.Prog {
					if ini[ps.Mode] == nil {
						ini[ps.Mode] = &series{name: ps.Mode + " init", colorIdx: modeColor(ps.Mode)}
						upd[ps.Mode] = &series{name: ps.Mode + " update", colorIdx: modeColor(ps.Mode), dashed: true}
						order = append(order, ps.Mode)
					}
					if len(ps.InitialS) > 0 {
						s := ini[ps.Mode]
						s.xs, s.ys, s.lo, s.hi = append(s.xs, float64(p.Services)), append(s.ys, ps.Initial.Median), append(s.lo, ps.Initial.Min), append(s.hi, ps.Initial.Max)
					}
					if len(ps.UpdateS) > 0 {
						s := upd[ps.Mode]
						s.xs, s.ys, s.lo, s.hi = append(s.xs, float64(p.Services)), append(s.ys, ps.Update.Median), append(s.lo, ps.Update.Min), append(s.hi, ps.Update.Max)
					}
				}
			}
			for _, m := range order {
				ss = append(ss, *ini[m], *upd[m])
			}
		}
		p := filepath.Join(dir, stamp+"-"+f.suffix+".png")
		if err := chart(p, f.title, ylabel, logY, ss); err != nil {
			return files, err
		}
		files = append(files, p)
	}
	return files, nil
}

const (
	width, height            = 1100, 600
	left, right, top, bottom = 90, 310, 64, 60
)

// chart draws a line chart with a log10 N axis.
func chart(path, title, ylabel string, logY bool, ss []series) error {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	grey := color.RGBA{200, 200, 200, 255}
	black := color.RGBA{0, 0, 0, 255}
	pw, ph := width-left-right, height-top-bottom
	drawText(img, max(5, (width-textWidth(title))/2), 15, title, black)

	var xs, ys []float64
	for _, s := range ss {
		xs = append(xs, s.xs...)
		for i, y := range s.ys {
			if !logY || y > 0 {
				ys = append(ys, y, s.lo[i], s.hi[i])
			}
		}
	}
	if len(xs) == 0 {
		drawText(img, left+20, top+ph/2, "no data", black)
		return save(path, img)
	}
	xmin, xmax := math.Log10(slices.Min(xs)), math.Log10(slices.Max(xs))
	if xmax-xmin < 1 {
		xmin, xmax = xmin-0.5, xmax+0.5
	}
	xmin, xmax = xmin-0.1, xmax+0.1
	var ymin, ymax float64
	if logY {
		pos := slices.DeleteFunc(slices.Clone(ys), func(v float64) bool { return v <= 0 })
		if len(pos) == 0 {
			pos = []float64{1}
		}
		ymin, ymax = math.Floor(math.Log10(slices.Min(pos))), math.Ceil(math.Log10(slices.Max(pos)))
		if ymax == ymin {
			ymax++
		}
	} else {
		ymin, ymax = 0, slices.Max(ys)*1.1
		if ymax == 0 {
			ymax = 1
		}
	}
	px := func(x float64) int { return left + int((math.Log10(x)-xmin)/(xmax-xmin)*float64(pw)) }
	py := func(y float64) int {
		v := y
		if logY {
			if y <= 0 {
				return top + ph
			}
			v = math.Log10(y)
		}
		return top + ph - int((v-ymin)/(ymax-ymin)*float64(ph))
	}
	// Axes, grid and ticks.
	seenX := map[float64]bool{}
	for _, x := range xs {
		if seenX[x] {
			continue
		}
		seenX[x] = true
		line(img, px(x), top, px(x), top+ph, grey, 1, false)
		l := fmt.Sprintf("%g", x)
		drawText(img, px(x)-textWidth(l)/2, top+ph+10, l, black)
	}
	drawText(img, left+pw/2-textWidth("services (N, log)")/2, top+ph+35, "services (N, log)", black)
	if logY {
		for e := ymin; e <= ymax; e++ {
			y := math.Pow(10, e)
			line(img, left, py(y), left+pw, py(y), grey, 1, false)
			l := fmt.Sprintf("%g", y)
			drawText(img, left-8-textWidth(l), py(y)-7, l, black)
		}
	} else {
		step := niceStep(ymax / 5)
		for y := 0.0; y <= ymax; y += step {
			line(img, left, py(y), left+pw, py(y), grey, 1, false)
			l := fmt.Sprintf("%g", y)
			drawText(img, left-8-textWidth(l), py(y)-7, l, black)
		}
	}
	drawText(img, 5, top-20, ylabel, black)
	line(img, left, top, left, top+ph, black, 2, false)
	line(img, left, top+ph, left+pw, top+ph, black, 2, false)

	for i, s := range ss {
		c := palette[s.colorIdx%len(palette)]
		off := (i - len(ss)/2) * 3 // spread bars of different series apart
		for j := range s.xs {
			x := px(s.xs[j]) + off
			line(img, x, py(s.lo[j]), x, py(s.hi[j]), c, 1, false)
			fill(img, image.Rect(x-4, py(s.ys[j])-4, x+5, py(s.ys[j])+5), c)
			if j > 0 {
				line(img, px(s.xs[j-1])+off, py(s.ys[j-1]), x, py(s.ys[j]), c, 2, s.dashed)
			}
		}
		ly := top + 10 + i*22
		line(img, left+pw+15, ly+7, left+pw+45, ly+7, c, 2, s.dashed)
		drawText(img, left+pw+52, ly, s.name, black)
	}
	return save(path, img)
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.Set(x, y, c)
		}
	}
}

// line draws a straight line of thickness w; dashed lines skip every other
// 8 pixels.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color, w int, dashed bool) {
	dx, dy := x1-x0, y1-y0
	n := max(abs(dx), abs(dy))
	if n == 0 {
		n = 1
	}
	for i := 0; i <= n; i++ {
		if dashed && (i/8)%2 == 1 {
			continue
		}
		x := x0 + dx*i/n
		y := y0 + dy*i/n
		for a := 0; a < w; a++ {
			for b := 0; b < w; b++ {
				img.Set(x+a, y+b, c)
			}
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func save(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
