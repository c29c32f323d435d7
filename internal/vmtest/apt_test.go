package vmtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSourcesList(t *testing.T) {
	sid := SourcesList("sid", "amd64", "http://m/debian", "http://m/debian-security")
	if strings.Contains(sid, "-updates") || strings.Contains(sid, "-security") || !strings.Contains(sid, " sid main") {
		t.Errorf("sid has no -updates or -security suites:\n%s", sid)
	}
	bw := SourcesList("bookworm", "arm64", "http://m/debian", "http://m/debian-security")
	for _, s := range []string{"[arch=arm64 signed-by=" + Keyring + "] http://m/debian bookworm main", "http://m/debian bookworm-updates main", "http://m/debian-security bookworm-security main"} {
		if !strings.Contains(bw, s) {
			t.Errorf("bookworm lacks %q:\n%s", s, bw)
		}
	}
}

func TestHostMirrors(t *testing.T) {
	etc := t.TempDir()
	os.MkdirAll(filepath.Join(etc, "sources.list.d"), 0o755)
	os.WriteFile(filepath.Join(etc, "sources.list.d", "debian.sources"), []byte(
		"Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"+
			"Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "sources.list.d", "vendor.list"), []byte("deb [signed-by=/k.gpg] http://vendor.example/apt stable main\n"), 0o644)
	m, s := HostMirrors(etc, "bookworm")
	if m != "http://mirror.example/debian" || s != "http://mirror.example/debian-security" {
		t.Errorf("deb822: %q %q", m, s)
	}
	etc = t.TempDir()
	os.WriteFile(filepath.Join(etc, "sources.list"), []byte("# comment\ndeb [arch=amd64] http://other.example/debian/ trixie main\n"), 0o644)
	m, s = HostMirrors(etc, "trixie")
	if m != "http://other.example/debian" || s != "http://other.example/debian-security" {
		t.Errorf("one-line: %q %q", m, s)
	}
}

func TestParsePolicy(t *testing.T) {
	out := "linux-image-6.1.0-57-cloud-amd64-unsigned:\n  Installed: (none)\n  Candidate: 6.1.192-3\n  Version table:\n" +
		"linux-image-6.1.0-9-cloud-arm64-unsigned:arm64:\n  Installed: (none)\n  Candidate: (none)\n"
	got := parsePolicy([]byte(out))
	if !slices.Equal(got, []PkgVersion{{"linux-image-6.1.0-57-cloud-amd64-unsigned", "6.1.192-3"}}) {
		t.Errorf("policy %v", got)
	}
}

func TestNewestFirstAndSeries(t *testing.T) {
	ps := []PkgVersion{{"linux-image-6.1.0-9-cloud-amd64", "6.1.27-1"}, {"linux-image-6.1.0-57-cloud-amd64", "6.1.192-3"}, {"linux-image-6.1.0-10-cloud-amd64", "6.1.38-1"}}
	sortNewest(ps)
	if ps[0].Name != "linux-image-6.1.0-57-cloud-amd64" || ps[2].Name != "linux-image-6.1.0-9-cloud-amd64" {
		t.Errorf("newest first: %v", ps)
	}
	for in, want := range map[string]string{
		"linux-image-6.1.0-57-cloud-amd64-unsigned":       "linux-image-6.1.0-*-cloud-amd64-unsigned",
		"linux-image-6.12.117+deb12-cloud-amd64-unsigned": "linux-image-6.12.*+deb12-cloud-amd64-unsigned",
		"linux-image-7.2.13+deb14-cloud-amd64":            "linux-image-7.2.*+deb14-cloud-amd64",
		"linux-image-cloud-amd64":                         "linux-image-cloud-amd64",
	} {
		if got := SeriesGlob(in); got != want {
			t.Errorf("SeriesGlob(%s) = %s, want %s", in, got, want)
		}
	}
}

// Linux 7's image package holds no kernel: its Depends name the packages
// that do (as sid's linux-image-7.2.13+deb14-cloud-amd64 has it).
func TestDependencyParts(t *testing.T) {
	deps := "dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), " +
		"linux-binary-7.2.13+deb14-cloud-amd64 (= 7.2.13-1), linux-modules-7.2.13+deb14-cloud-amd64 (= 7.2.13-1)"
	got := DependencyParts("linux-image-7.2.13+deb14-cloud-amd64", deps)
	want := []PkgVersion{{"linux-base-7.2.13+deb14-cloud-amd64", "7.2.13-1"}, {"linux-binary-7.2.13+deb14-cloud-amd64", "7.2.13-1"}, {"linux-modules-7.2.13+deb14-cloud-amd64", "7.2.13-1"}}
	if !slices.Equal(got, want) {
		t.Errorf("parts %v, want %v", got, want)
	}
	// an image of the old packaging depends on no package of its release
	old := "kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool"
	if got := DependencyParts("linux-image-6.1.0-57-cloud-amd64-unsigned", old); len(got) != 0 {
		t.Errorf("old packaging: parts %v", got)
	}
}

func TestLocateBothPackagings(t *testing.T) {
	for _, layout := range []string{"boot/vmlinuz-6.1.0-57-cloud-amd64", "usr/lib/modules/7.2.13+deb14-cloud-amd64/vmlinuz"} {
		root := t.TempDir()
		rel := "6.1.0-57-cloud-amd64"
		if strings.HasPrefix(layout, "usr") {
			rel = "7.2.13+deb14-cloud-amd64"
		} else {
			os.MkdirAll(filepath.Join(root, "lib", "modules", rel), 0o755)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(root, layout)), 0o755)
		os.WriteFile(filepath.Join(root, layout), []byte("kernel"), 0o644)
		kb := &KernelBuild{Root: root}
		if err := kb.locate(); err != nil || kb.Uname != rel || kb.Vmlinuz != filepath.Join(root, layout) {
			t.Errorf("%s: uname %q vmlinuz %q err %v", layout, kb.Uname, kb.Vmlinuz, err)
		}
	}
	// the dependency package alone: no kernel, an error that says so
	root := t.TempDir()
	kb := &KernelBuild{Root: root, Image: PkgVersion{"linux-image-7.2.13+deb14-cloud-amd64", "7.2.13-1"}}
	if err := kb.locate(); err == nil || !strings.Contains(err.Error(), "no vmlinuz") {
		t.Errorf("empty root: %v", err)
	}
}
