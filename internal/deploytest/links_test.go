package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink is an inline Markdown link or image: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineCode is a code span, whose brackets are no link.
var inlineCode = regexp.MustCompile("`[^`]*`")

// relativeLinks returns the link targets of md that point inside the
// repository, outside code blocks and code spans.
func relativeLinks(md string) []string {
	var out []string
	fence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			out = append(out, target)
		}
	}
	return out
}

// TestDocLinks: every relative link of the README, the changelog and the
// pages under docs/ names a file of the repository, and a #fragment on a
// Markdown file names one of its headings, so moving a section cannot
// leave a link pointing at nothing.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"))
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchors[path] = githubAnchors(string(b))
		return anchors[path], nil
	}
	links := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, target := range relativeLinks(string(b)) {
			links++
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links %s: no such file", rel, target)
				continue
			}
			if frag == "" || filepath.Ext(path) != ".md" {
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Errorf("%s links %s: %v", rel, target, err)
				continue
			}
			if !a[frag] {
				t.Errorf("%s links %s: no heading with anchor %q there", rel, target, frag)
			}
		}
	}
	if links < 20 {
		t.Errorf("found %d relative links in %d pages: is the pattern still right?", links, len(pages))
	}
}

func TestRelativeLinks(t *testing.T) {
	md := "See [design](docs/design.md#causes) and ![pic](docs/survey/kernels.png \"title\").\n" +
		"Not `[code](x.md)`, not [web](https://example.com/a.md).\n```\n[fenced](y.md)\n```\n[same page](#usage)\n"
	got := strings.Join(relativeLinks(md), " ")
	if want := "docs/design.md#causes docs/survey/kernels.png #usage"; got != want {
		t.Errorf("relativeLinks = %q, want %q", got, want)
	}
}
