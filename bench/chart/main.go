// Command chart draws the bench's QPS table (results.tsv from bench/run.sh) as
// a grouped bar chart in PNG: one group per workload, one bar per server.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

var servers = []struct {
	name, title string
	color       color.RGBA
}{
	{"nodelocaldns", "nodelocaldns", color.RGBA{0x1f, 0x77, 0xb4, 0xff}},
	{"previous", "nodelocaldns (previous build)", color.RGBA{0xae, 0xc7, 0xe8, 0xff}},
	{"node-local-dns", "node-local-dns (stock)", color.RGBA{0x17, 0xbe, 0xcf, 0xff}},
	{"coredns", "CoreDNS", color.RGBA{0x2c, 0xa0, 0x2c, 0xff}},
	{"unbound", "Unbound", color.RGBA{0xff, 0x7f, 0x0e, 0xff}},
	{"dnsmasq", "dnsmasq", color.RGBA{0x94, 0x67, 0xbd, 0xff}},
	{"ceiling", "ceiling (canned answers)", color.RGBA{0xa0, 0xa0, 0xa0, 0xff}},
	{"limit", "limit (C, recvmmsg)", color.RGBA{0x50, 0x50, 0x50, 0xff}},
}

var workloads = []struct{ name, title string }{
	{"hit1", "hit, 1 name"},
	{"hit20", "hit, 20 names"},
	{"nx1", "NXDOMAIN, 1 name"},
	{"names10k", "10k names"},
	{"unique", "misses, TCP upstream"},
	{"uniqext", "misses, UDP upstream"},
	{"tcphit", "hit, 1 name, TCP"},
}

const (
	width, height = 1200, 640
	left, right   = 80, 20
	top, bottom   = 90, 70
)

var (
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grid  = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

func main() {
	in := flag.String("in", "bench/out/results.tsv", "results.tsv from bench/run.sh")
	status := flag.String("status", "bench/out/status.tsv", "status.tsv from bench/run.sh")
	out := flag.String("out", "bench/results.png", "PNG to write")
	title := flag.String("title", "Queries per second, server on one core (dnsperf -c 32, unlimited rate)", "chart title")
	flag.Parse()

	qps, err := readQPS(*in)
	if err != nil {
		fail(err)
	}
	st, err := readStatus(*status)
	if err != nil {
		fail(err)
	}
	img := draw1(qps, st, *title)
	f, err := os.Create(*out)
	if err != nil {
		fail(err)
	}
	if err := png.Encode(f, img); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "chart: %v\n", err)
	os.Exit(1)
}

// readQPS returns server → workload → QPS.
func readQPS(path string) (map[string]map[string]float64, error) {
	m := map[string]map[string]float64{}
	err := eachLine(path, func(f []string) {
		if len(f) < 3 {
			return
		}
		v, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			return
		}
		if m[f[0]] == nil {
			m[f[0]] = map[string]float64{}
		}
		m[f[0]][f[1]] = v
	})
	return m, err
}

// readStatus returns server → "ok" or why it was not measured.
func readStatus(path string) (map[string]string, error) {
	m := map[string]string{}
	err := eachLine(path, func(f []string) {
		if len(f) >= 3 {
			m[f[0]] = f[2]
		}
	})
	return m, err
}

func eachLine(path string, fn func([]string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fn(strings.Split(s.Text(), "\t"))
	}
	return s.Err()
}

func draw1(qps map[string]map[string]float64, status map[string]string, title string) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)

	// Servers shown: those in the run, in fixed order.
	type shown struct {
		name, title string
		color       color.RGBA
		na          bool
	}
	var ss []shown
	for _, s := range servers {
		st, inRun := status[s.name]
		if !inRun {
			continue
		}
		ss = append(ss, shown{s.name, s.title, s.color, st != "ok" || len(qps[s.name]) == 0})
	}

	maxQ := 0.0
	for _, m := range qps {
		for _, v := range m {
			maxQ = math.Max(maxQ, v)
		}
	}
	step := niceStep(maxQ / 5)
	yMax := math.Ceil(maxQ/step) * step
	if yMax <= 0 {
		yMax, step = 1000, 200
	}

	plotW, plotH := width-left-right, height-top-bottom
	y := func(v float64) int { return top + plotH - int(v/yMax*float64(plotH)) }

	// Title (twice the font size) and legend.
	text2x(img, left, 12, title, black)
	lx := left
	for _, s := range ss {
		fill(img, image.Rect(lx, 52, lx+14, 66), s.color)
		label := s.title
		if s.na {
			label += " (n/a)"
		}
		text(img, lx+20, 63, label, black)
		lx += 20 + 7*len(label) + 24
	}

	// Grid and y labels.
	for v := 0.0; v <= yMax+step/2; v += step {
		yy := y(v)
		fill(img, image.Rect(left, yy, left+plotW, yy+1), grid)
		l := strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
		text(img, left-10-7*len(l), yy+4, l, black)
	}
	fill(img, image.Rect(left, top, left+1, top+plotH+1), black)
	fill(img, image.Rect(left, top+plotH, left+plotW, top+plotH+1), black)

	// Bars.
	groupW := plotW / len(workloads)
	pad := 18
	barW := (groupW - 2*pad) / max(len(ss), 1)
	for gi, wl := range workloads {
		gx := left + gi*groupW
		for si, s := range ss {
			x0 := gx + pad + si*barW
			v, ok := qps[s.name][wl.name]
			if !ok || s.na {
				text(img, x0+(barW-7*3)/2, top+plotH-4, "n/a", black)
				continue
			}
			fill(img, image.Rect(x0+1, y(v), x0+barW-2, top+plotH), s.color)
			prec := 0
			if v < 10000 {
				prec = 1
			}
			l := strconv.FormatFloat(v/1000, 'f', prec, 64) + "k"
			text(img, x0+(barW-7*len(l))/2, y(v)-4, l, black)
		}
		text(img, gx+(groupW-7*len(wl.title))/2, top+plotH+22, wl.title, black)
	}
	text(img, left, height-16, "Bars: QPS at unlimited rate. Server pinned to core 0, dnsperf and the test upstream to core 1. Details: bench/RESULTS.md", black)
	return img
}

// niceStep rounds a raw grid step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

// text draws s with its baseline at y.
func text(img draw.Image, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// text2x draws s at twice the font size with its top-left corner at (x, y).
func text2x(dst *image.RGBA, x, y int, s string, c color.Color) {
	small := image.NewRGBA(image.Rect(0, 0, 7*len(s), 13))
	text(small, 0, 11, s, c)
	b := small.Bounds()
	for sy := b.Min.Y; sy < b.Max.Y; sy++ {
		for sx := b.Min.X; sx < b.Max.X; sx++ {
			px := small.RGBAAt(sx, sy)
			if px.A == 0 {
				continue
			}
			fill(dst, image.Rect(x+2*sx, y+2*sy, x+2*sx+2, y+2*sy+2), px)
		}
	}
}
