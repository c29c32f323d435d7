package deploytest

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// datedHeading matches a heading that names a day: a year or a month.
var datedHeading = regexp.MustCompile(`(?i)^#+ .*\b(20\d\d|January|February|March|April|June|July|August|September|October|November|December)\b`)

// TestManualStaysAManual holds the pages and the BPF sources to the sizes a
// newcomer can read (issue 40): measurements of a day go to commit
// messages, not to the manual, and a page that grows past its limit has
// turned back into a notebook.
func TestManualStaysAManual(t *testing.T) {
	root := filepath.Join("..", "..")
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rel := func(path string) string {
		r, _ := filepath.Rel(root, path)
		return r
	}
	if n := bytes.Count(read(filepath.Join(root, "README.md")), []byte("\n")); n > 250 {
		t.Errorf("README.md has %d lines, at most 250: move the detail to docs/", n)
	}
	for page, limit := range map[string]int{"docs/performance.md": 15000, "docs/vmtest.md": 10000} {
		if n := len(read(filepath.Join(root, page))); n > limit {
			t.Errorf("%s is %d bytes, at most %d: say how to measure, not what a day measured", page, n, limit)
		}
	}
	bpf, err := filepath.Glob(filepath.Join(root, "bpf", "*.[ch]"))
	if err != nil {
		t.Fatal(err)
	}
	lib, _ := filepath.Glob(filepath.Join(root, "bpf", "lib", "*.h"))
	if bpf = append(bpf, lib...); len(bpf) < 5 {
		t.Fatalf("found %d BPF sources: is the pattern still right?", len(bpf))
	}
	for _, f := range bpf {
		if n := bytes.Count(read(f), []byte("\n")); n > 600 {
			t.Errorf("%s has %d lines, at most 600: split it by concern", rel(f), n)
		}
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, page := range append(pages, filepath.Join(root, "README.md")) {
		for _, line := range strings.Split(string(read(page)), "\n") {
			if datedHeading.MatchString(line) {
				t.Errorf("%s: a section titled by a date: %q", rel(page), line)
			}
		}
	}
}

func TestDatedHeading(t *testing.T) {
	for line, want := range map[string]bool{
		"## Timing (4 December)":         true,
		"### Results 2026":               true,
		"## Timing on the CI machine":    false,
		"4 December was a Friday":        false,
		"## What one run costs":          false,
		"## The int3 oops: the emulator": false,
	} {
		if got := datedHeading.MatchString(line); got != want {
			t.Errorf("datedHeading(%q) = %v, want %v", line, got, want)
		}
	}
}
