package main

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/report"
)

// TestPlots draws a recorded run's plots, one per figure of its summary,
// and reads them back: each is a PNG in which every mode that has the
// figure is drawn in its colour, and a mode that never synced (no figure)
// is not. `kubeproxy plot` over the JSON draws the same files again.
func TestPlots(t *testing.T) {
	sp := func(v float64) testutil.Spread { return testutil.Spread{Median: v, Min: v * 0.9, Max: v * 1.1} }
	sum := func(mode string, v float64) summary {
		return summary{Mode: mode, Rounds: 2, FirstSyncS: sp(v), LatencyS: sp(v / 100), RSSPeakMiB: sp(v * 10), CPUNetEndS: sp(v * 2)}
	}
	r := &result{Config: config{Stamp: "plots", Rounds: 2, Changes: 3, Endpoints: 10, Modes: allModes}, Versions: map[string]string{}}
	for _, n := range []int{1000, 30000} {
		f := float64(n) / 1000
		r.Points = append(r.Points, &point{Services: n, Endpoints: 10, Summary: []summary{
			sum(modeIptables, 0), // did not sync: no figure
			sum(modeNftables, 10*f),
			sum(modeSluice, f/5),
		}})
	}
	dir := t.TempDir()
	files, err := writeReport(dir, "plots", r)
	if err != nil {
		t.Fatal(err)
	}
	var pngs []string
	for _, f := range files {
		if filepath.Ext(f) == ".png" {
			pngs = append(pngs, f)
		}
	}
	if len(pngs) != len(kubePlots) {
		t.Fatalf("writeReport wrote %v: want %d plots", files, len(kubePlots))
	}
	drawn := map[string][]byte{}
	for _, p := range pngs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		drawn[p] = b
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for mode, want := range map[string]bool{modeNftables: true, modeSluice: true, modeIptables: false} {
			if n := pixels(img, report.ModeColor(mode)); (n > 0) != want {
				t.Errorf("%s: %d pixels in %s's colour, want drawn %v", filepath.Base(p), n, mode, want)
			}
		}
	}

	for p := range drawn {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	again, err := plotRecorded([]string{filepath.Join(dir, "kubeproxy-plots.json")})
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(pngs) {
		t.Fatalf("plot drew %v, want %v", again, pngs)
	}
	for _, p := range again {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, drawn[p]) {
			t.Errorf("%s: drawn from the JSON differs from the run's", filepath.Base(p))
		}
	}
	if _, err := plotRecorded([]string{filepath.Join(dir, "kubeproxy-plots.md")}); err == nil {
		t.Error("plot of a Markdown file: no error")
	}
}

// pixels counts img's pixels of palette colour i.
func pixels(img image.Image, i int) int {
	c := report.PaletteColor(i)
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
				n++
			}
		}
	}
	return n
}
