package clashfix

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestKernelDocCitations: every "kernel.md §N" or "kernel.md#anchor" in the
// repository's code and docs names a section docs/kernel.md has, and code
// never cites a kernel.md outside the repository (a bare "kernel.md" not
// under docs/).
func TestKernelDocCitations(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "kernel.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections, anchors := map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## ((\d+)\..*)$`).FindAllStringSubmatch(string(doc), -1) {
		sections[m[2]] = true
		anchors[githubAnchor(m[1])] = true
	}
	if len(sections) < 9 {
		t.Fatalf("docs/kernel.md has %d numbered sections", len(sections))
	}
	reSection := regexp.MustCompile(`kernel\.md(?:#[\w-]+)?\)? ?§(\d+)`)
	reAnchor := regexp.MustCompile(`kernel\.md#([\w-]+)`)
	reBare := regexp.MustCompile(`(^|[^/\w])kernel\.md`)
	cited := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "headers" || n == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(p)
		if d.Name() == "citations_test.go" || ext != ".go" && ext != ".c" && ext != ".h" && ext != ".md" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := string(b)
		rel, _ := filepath.Rel(root, p)
		for _, m := range reSection.FindAllStringSubmatch(s, -1) {
			cited++
			if !sections[m[1]] {
				t.Errorf("%s cites docs/kernel.md §%s, which does not exist", rel, m[1])
			}
		}
		for _, m := range reAnchor.FindAllStringSubmatch(s, -1) {
			cited++
			if !anchors[m[1]] {
				t.Errorf("%s links docs/kernel.md#%s, which is no heading there", rel, m[1])
			}
		}
		// Markdown files in docs/ link their sibling as plain "kernel.md".
		if ext != ".md" || filepath.Dir(rel) != "docs" {
			for _, line := range strings.Split(s, "\n") {
				if reBare.MatchString(line) {
					t.Errorf("%s cites a kernel.md outside the repository: %q", rel, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Error("no citation of docs/kernel.md found: is the pattern still right?")
	}
}

// githubAnchor is the fragment GitHub gives a heading: lower case, spaces
// to '-', punctuation other than '-' and '_' dropped.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
