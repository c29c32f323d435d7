package surveyplot

import (
	"bytes"
	"encoding/xml"
	"image"
	"image/color"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dnsrace/dnsrace/internal/lab"
)

// bench is a made-up survey result: every scenario with fast lookups and
// a share of them stalled at stallMs.
func survey(kernel string, version int, stallMs float64, stalled int) *lab.SurveyResult {
	r := &lab.SurveyResult{Version: version, Kernel: kernel, CPUs: 2}
	for _, n := range []string{"same-tuple", "snat-port", "rule-drop", "upstream-loss"} {
		s := lab.ScenarioResult{Name: n, Resolver: "glibc", RaceRate: 0.1, LossRate: 0.05, StallRate: 0.2}
		if version >= 2 {
			s.Latency.Histogram = &lab.LatencyHistogram{LeMs: []float64{0.3, 0.5, 1.2, stallMs}, Count: []int{50, 30, 20, stalled}}
		}
		r.Scenarios = append(r.Scenarios, s)
	}
	return r
}

func inputs() []Input {
	return []Input{
		{Name: "host.json", Result: survey("6.18.44", 2, 5012, 25)},
		{Name: "vm-a.json", Result: survey("6.1.0-57-cloud-amd64", 2, 2512, 10)},
		{Name: "vm-b.json", Result: survey("6.1.0-57-cloud-amd64", 1, 0, 0)},
	}
}

func TestLabels(t *testing.T) {
	got := strings.Join(Labels(inputs()), "|")
	want := "6.18.44|6.1.0-57-cloud-amd64 (vm-a.json)|6.1.0-57-cloud-amd64 (vm-b.json)"
	if got != want {
		t.Errorf("labels %q, want %q", got, want)
	}
}

// svgTexts returns the text of every <text> element of an SVG document,
// which must parse as XML.
func svgTexts(t *testing.T, r io.Reader) []string {
	t.Helper()
	dec := xml.NewDecoder(r)
	var texts []string
	in := false
	var cur strings.Builder
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			if tk.Name.Local == "text" {
				in = true
				cur.Reset()
			}
		case xml.CharData:
			if in {
				cur.Write(tk)
			}
		case xml.EndElement:
			if tk.Name.Local == "text" {
				in = false
				texts = append(texts, cur.String())
			}
		}
	}
	return texts
}

func TestSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cmp.svg")
	in := inputs()
	if err := WriteFile(path, in); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	texts := svgTexts(t, f)
	has := func(s string) bool {
		for _, x := range texts {
			if x == s {
				return true
			}
		}
		return false
	}
	// The legend under the title names every input; the CDF legends give
	// the resolver, or say why there is no line.
	for _, l := range Labels(in) {
		if !has(l) {
			t.Errorf("no legend entry %q in %q", l, texts)
		}
	}
	for _, want := range []string{"glibc", "glibc (no latencies: survey format 1)", "vm-b.json, 2 CPUs, 0001-01-01",
		"snat-port: lookup latency CDF", "upstream-loss: lookup latency CDF", "lookups that stalled", "2.5s", "5s"} {
		if !has(want) {
			t.Errorf("no text %q in %q", want, texts)
		}
	}
}

func TestPNG(t *testing.T) {
	var buf bytes.Buffer
	in := inputs()
	if err := Write(&buf, "png", in); err != nil {
		t.Fatal(err)
	}
	img, format, err := image.Decode(&buf)
	if err != nil || format != "png" {
		t.Fatalf("decoding: %v (format %q)", err, format)
	}
	// 12 in wide at 96 dpi; two rows of CDFs, a row of bars, the head.
	if b := img.Bounds(); b.Dx() != 1152 || b.Dy() < 700 || b.Dy() > 1100 {
		t.Errorf("size %v", b)
	}
	// Every input's colour is drawn: its bars are filled with it.
	for i := range in {
		want := color.RGBAModel.Convert(colour(i)).(color.RGBA)
		n := 0
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) == want {
					n++
				}
			}
		}
		if n < 500 {
			t.Errorf("input %d (%s): %d pixels of its colour %v", i, in[i].Name, n, want)
		}
	}
}

func TestBadInput(t *testing.T) {
	if err := WriteFile(filepath.Join(t.TempDir(), "x.pdf"), inputs()); err == nil {
		t.Error("a .pdf name was accepted")
	}
	if err := Write(io.Discard, "svg", nil); err == nil {
		t.Error("no inputs accepted")
	}
}

// TestDocsInputs draws the README's picture from its committed inputs:
// they read, and the legend names both kernels.
func TestDocsInputs(t *testing.T) {
	var in []Input
	for _, f := range []string{"../../docs/survey/6.18-host.json", "../../docs/survey/6.1-vm.json"} {
		r, err := lab.ReadSurvey(f)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, Input{Name: f, Result: r})
	}
	var buf bytes.Buffer
	if err := Write(&buf, "svg", in); err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, &buf)
	for _, k := range []string{"6.18.44-fc-v657", "6.1.0-57-cloud-amd64"} {
		found := false
		for _, x := range texts {
			found = found || x == k
		}
		if !found {
			t.Errorf("no legend entry %q", k)
		}
	}
}
