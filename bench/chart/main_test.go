package main

import (
	"image/color"
	"testing"
)

func TestNiceStep(t *testing.T) {
	for _, tt := range []struct{ raw, want float64 }{
		{0, 1}, {45000, 50000}, {50000, 50000}, {51000, 100000}, {12000, 20000}, {1, 1},
	} {
		if got := niceStep(tt.raw); got != tt.want {
			t.Errorf("niceStep(%v) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

func TestDraw(t *testing.T) {
	qps := map[string]map[string]float64{
		"unbound": {"hit1": 200000, "unique": 50000},
		"coredns": {"hit1": 60000},
	}
	status := map[string]string{"nodelocaldns": "n/a: not built", "unbound": "ok", "coredns": "ok"}
	img := draw1(qps, status, "title")
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Fatalf("size %v", b)
	}
	// The Unbound hit1 bar reaches near the top of the plot: some pixel of
	// its colour sits in the upper fifth.
	var unbound color.RGBA
	for _, s := range servers {
		if s.name == "unbound" {
			unbound = s.color
		}
	}
	found := false
	for y := top; y < top+(height-top-bottom)/5 && !found; y++ {
		for x := left; x < width-right; x++ {
			if img.RGBAAt(x, y) == unbound {
				found = true
				break
			}
		}
	}
	if !found {
		t.Error("no Unbound bar near the top")
	}
}
