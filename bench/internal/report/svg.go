package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// palette gives each system a fixed colour, so charts of different runs read alike.
var palette = map[string]string{
	"leasehold-efficiency":             "#1b7837",
	"leasehold-efficiency-per-worker":  "#5aae61",
	"leasehold-correctness":            "#7fbf7b",
	"leasehold-correctness-per-worker": "#a6dba0",
	"leasehold-correctness-3":          "#00441b",
	"redis-mem":                        "#d6604d",
	"redis-mem-rueidis":                "#f4a582",
	"redis-aof":                        "#b2182b",
	"redis-aof-rueidis":                "#67001f",
	"etcd":                             "#4393c3",
	"etcd-3":                           "#2166ac",
	"zookeeper":                        "#8073ac",
}

// SVG draws two grouped bar charts, one group per scenario and one bar per system, on
// log scales: acquire+release pairs per second (higher is better), and acquire p99
// latency (lower is better). Hand-written SVG 1.1, no scripts; each bar has a tooltip
// with its exact value.
func (r *Report) SVG(w io.Writer) error {
	systems := r.ran()
	if len(systems) == 0 || len(r.Scenarios) == 0 {
		_, err := io.WriteString(w, `<svg xmlns="http://www.w3.org/2000/svg" width="400" height="40"><text x="10" y="25" font-family="sans-serif" font-size="13">no results</text></svg>`+"\n")
		return err
	}
	const (
		left, right = 70.0, 20.0
		barW, gap   = 16.0, 28.0
		panelH      = 250.0 // plot height, of which headroom is left for value labels
		headroom    = 44.0
		legendH     = 28.0
		labelH      = 34.0
		titleH      = 30.0
		charW       = 6.5 // rough width of one character at font-size 11
	)
	groupW := float64(len(systems))*barW + gap
	for _, sc := range r.Scenarios {
		groupW = math.Max(groupW, charW*float64(len(sc.Name))+16)
	}
	legendW := left
	for _, s := range systems {
		legendW += 16 + charW*float64(len(s.Name)) + 18
	}
	// The panel titles are about 62 characters of bold 13px text.
	width := math.Max(math.Max(left+float64(len(r.Scenarios))*groupW+right, legendW), left+62*7.8+right)
	groupW = (width - left - right) / float64(len(r.Scenarios)) // spread the groups over the width
	height := legendH + 2*(titleH+panelH+labelH) + 30

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")

	// Legend.
	x := left
	for _, s := range systems {
		p(`<rect x="%.1f" y="8" width="12" height="12" fill="%s"/><text x="%.1f" y="18">%s</text>`+"\n", x, color(s.Name), x+16, html.EscapeString(s.Name))
		x += 16 + charW*float64(len(s.Name)) + 18
	}

	type metric struct {
		title string
		value func(system, scenario string) (float64, bool)
		label func(float64) string
		short func(float64) string
	}
	metrics := []metric{
		{"acquire+release pairs per second (log scale, higher is better)", func(sys, sc string) (float64, bool) {
			x, ok := r.result(sys, sc)
			return x.PairsPerSec, ok && x.PairsPerSec > 0
		}, func(v float64) string { return rate(v) + " pairs/s" }, rate},
		{"acquire latency p99 (log scale, lower is better)", func(sys, sc string) (float64, bool) {
			x, ok := r.result(sys, sc)
			return float64(x.AcqP99) / float64(time.Microsecond), ok && x.AcqP99 > 0
		}, func(v float64) string { return dur(time.Duration(v * float64(time.Microsecond))) },
			func(v float64) string { return dur(time.Duration(v * float64(time.Microsecond))) }},
	}
	top := legendH
	for mi, m := range metrics {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range systems {
			for _, sc := range r.Scenarios {
				if v, ok := m.value(s.Name, sc.Name); ok {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		p(`<text x="%.1f" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", left, top+16, html.EscapeString(m.title))
		y0 := top + titleH // top of the plot area
		if math.IsInf(lo, 1) {
			top = y0 + panelH + labelH
			continue
		}
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		plotH := panelH - headroom
		ypos := func(v float64) float64 { return y0 + panelH - (math.Log10(v)-dlo)/(dhi-dlo)*plotH }
		for d := dlo; d <= dhi; d++ {
			y := ypos(math.Pow(10, d))
			p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, width-right, y, y)
			p(`<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, html.EscapeString(decade(int(d), mi == 1)))
		}
		p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333333"/>`+"\n", left, width-right, y0+panelH, y0+panelH)
		for gi, sc := range r.Scenarios {
			gx := left + float64(gi)*groupW + (groupW-float64(len(systems))*barW)/2
			for si, s := range systems {
				v, ok := m.value(s.Name, sc.Name)
				if !ok {
					continue
				}
				bx := gx + float64(si)*barW
				by := ypos(v)
				p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %s</title></rect>`+"\n",
					bx, by, barW-2, y0+panelH-by, color(s.Name), html.EscapeString(s.Name), html.EscapeString(sc.Name), html.EscapeString(m.label(v)))
				p(`<text transform="translate(%.1f %.1f) rotate(-90)" font-size="9" fill="#333333">%s</text>`+"\n",
					bx+barW/2+2, by-3, html.EscapeString(m.short(v)))
			}
			p(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", gx+float64(len(systems))*barW/2, y0+panelH+16, html.EscapeString(sc.Name))
		}
		top = y0 + panelH + labelH
	}
	m := r.Machine
	p(`<text x="%.1f" y="%.1f" fill="#555555">%s</text>`+"\n", left, height-10,
		html.EscapeString(fmt.Sprintf("%d × %s, Linux %s, %s; %v per scenario", m.NProc, m.CPUModel, m.Kernel, r.Started.UTC().Format("2006-01-02"), r.Duration)))
	p("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// decade labels the gridline at 10^d: a count (1, 10, 100, 1k, ...) or, for latency, a
// duration of 10^d microseconds (1 µs ... 1 s).
func decade(d int, latency bool) string {
	if latency {
		names := []string{"1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s", "100 s"}
		if d >= 0 && d < len(names) {
			return names[d]
		}
		return fmt.Sprintf("1e%d µs", d)
	}
	names := []string{"1", "10", "100", "1k", "10k", "100k", "1M", "10M"}
	if d >= 0 && d < len(names) {
		return names[d]
	}
	return fmt.Sprintf("1e%d", d)
}

func color(name string) string {
	if c, ok := palette[name]; ok {
		return c
	}
	return "#999999"
}
