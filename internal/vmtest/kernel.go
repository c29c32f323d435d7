package vmtest

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// KernelBuild is a kernel fetched and unpacked in the cache, at
// <cache>/<package>/<version>/root.
type KernelBuild struct {
	Image   PkgVersion
	Parts   []PkgVersion // the packages of a dependency image (Linux 7)
	Pin     string       // pinned, glob or fallback
	Dir     string
	Root    string
	Uname   string
	Vmlinuz string
}

// SeriesGlob is the kernel series of a pinned package with any build
// number: linux-image-6.1.0-57-cloud-amd64-unsigned -> linux-image-6.1.0-*-cloud-amd64-unsigned,
// linux-image-6.12.117+deb12-cloud-amd64 -> linux-image-6.12.*+deb12-cloud-amd64.
func SeriesGlob(pkg string) string {
	for _, re := range seriesREs {
		if m := re.FindStringSubmatch(pkg); m != nil {
			return m[1] + "*" + m[2]
		}
	}
	return pkg
}

var seriesREs = []*regexp.Regexp{
	regexp.MustCompile(`^(linux-image-[0-9]+\.[0-9]+\.0-)[0-9]+(-.*)$`),
	regexp.MustCompile(`^(linux-image-[0-9]+\.[0-9]+\.)[0-9]+(\+.*)$`),
}

type choice struct {
	PkgVersion
	pin string
}

// FetchKernel fetches the kernel a kernels.txt package names: the pinned
// build while apt offers it or the cache holds it, else (a pin the archive
// has dropped) the newest build of its series; a glob takes its newest
// match. The error of a kernel that cannot be had says why.
func FetchKernel(ctx context.Context, apt *Apt, cache, want string) (*KernelBuild, error) {
	var choices []choice
	add := func(ps []PkgVersion, pin string) {
		for _, p := range ps {
			if !containsChoice(choices, p) {
				choices = append(choices, choice{p, pin})
			}
		}
	}
	if strings.Contains(want, "*") {
		ps, err := apt.Matching(ctx, want)
		if err != nil {
			return nil, err
		}
		add(ps, "glob")
		add(cachedMatching(cache, want), "glob")
	} else {
		ps, err := apt.Candidates(ctx, want)
		if err != nil {
			return nil, err
		}
		add(ps, "pinned")
		add(cachedMatching(cache, want), "pinned")
		if series := SeriesGlob(want); series != want {
			ps, err := apt.Matching(ctx, series)
			if err != nil {
				return nil, err
			}
			add(ps, "fallback")
			add(cachedMatching(cache, series), "fallback")
		}
	}
	if len(choices) == 0 {
		return nil, fmt.Errorf("apt (%s, %s) offers no %s (nor a build of its series) and the cache has none", apt.Codename, apt.Arch, want)
	}
	var errs []error
	for _, c := range choices {
		kb, err := unpackKernel(ctx, apt, filepath.Join(cache, c.Name, c.Version), c.PkgVersion)
		if err != nil {
			apt.Log("%s: %v", c.PkgVersion, err)
			errs = append(errs, err)
			continue
		}
		kb.Pin = c.pin
		if c.pin == "fallback" {
			apt.Log("%s is not available: using %s, the newest build of its series that is", want, c.PkgVersion)
		}
		return kb, nil
	}
	return nil, fmt.Errorf("no build of %s could be fetched: %w", want, errors.Join(errs...))
}

func containsChoice(cs []choice, p PkgVersion) bool {
	for _, c := range cs {
		if c.PkgVersion == p {
			return true
		}
	}
	return false
}

// cachedMatching is every kernel unpacked in the cache whose package
// matches glob, newest first.
func cachedMatching(cache, glob string) []PkgVersion {
	dirs, _ := filepath.Glob(filepath.Join(cache, glob, "*", ".unpacked"))
	var ps []PkgVersion
	for _, d := range dirs {
		ver := filepath.Dir(d)
		ps = append(ps, PkgVersion{filepath.Base(filepath.Dir(ver)), filepath.Base(ver)})
	}
	sortNewest(ps)
	return ps
}

// unpackKernel downloads and unpacks an image package into dir, once. An
// image with no kernel in it is a dependency package (Linux 7: the kernel
// is in linux-binary-<abi>, the modules in linux-modules-<abi>, their
// modules.builtin in linux-base-<abi>): the packages of its Depends named
// linux-*-<abi>, at the version it requires, are unpacked with it.
func unpackKernel(ctx context.Context, apt *Apt, dir string, img PkgVersion) (*KernelBuild, error) {
	kb := &KernelBuild{Image: img, Dir: dir, Root: filepath.Join(dir, "root")}
	partsFile := filepath.Join(dir, "parts")
	if _, err := os.Stat(filepath.Join(dir, ".unpacked")); err != nil {
		if err := fetchAndUnpack(ctx, apt, kb); err != nil {
			return nil, err
		}
		var b strings.Builder
		for _, p := range kb.Parts {
			fmt.Fprintln(&b, p)
		}
		if err := os.WriteFile(partsFile, []byte(b.String()), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, ".unpacked"), nil, 0o644); err != nil {
			return nil, err
		}
	} else {
		data, _ := os.ReadFile(partsFile)
		for _, l := range strings.Fields(string(data)) {
			n, v, _ := strings.Cut(l, "=")
			kb.Parts = append(kb.Parts, PkgVersion{n, v})
		}
	}
	return kb, kb.locate()
}

func fetchAndUnpack(ctx context.Context, apt *Apt, kb *KernelBuild) error {
	deb, err := cachedDeb(kb.Dir, kb.Image)
	if err != nil {
		if deb, err = apt.Download(ctx, kb.Dir, kb.Image); err != nil {
			return err
		}
	}
	os.RemoveAll(kb.Root)
	if err := dpkgExtract(ctx, deb, kb.Root); err != nil {
		return err
	}
	if kb.locate() != nil {
		out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Depends").Output()
		if err != nil {
			return fmt.Errorf("reading the Depends of %s: %w", deb, err)
		}
		kb.Parts = DependencyParts(kb.Image.Name, string(out))
		if len(kb.Parts) == 0 {
			return fmt.Errorf("%s holds no vmlinuz and depends on no linux-*-%s package (Depends: %s)",
				kb.Image, abi(kb.Image.Name), strings.TrimSpace(string(out)))
		}
		for _, p := range kb.Parts {
			pdeb, err := cachedDeb(kb.Dir, p)
			if err != nil {
				if pdeb, err = apt.Download(ctx, kb.Dir, p); err != nil {
					return fmt.Errorf("fetching %s, which holds part of %s: %w", p, kb.Image, err)
				}
			}
			if err := dpkgExtract(ctx, pdeb, kb.Root); err != nil {
				return err
			}
		}
	}
	// merged /usr: modules in usr/lib/modules, where depmod -b does not look
	if _, err := os.Lstat(filepath.Join(kb.Root, "lib")); err != nil {
		if _, err := os.Stat(filepath.Join(kb.Root, "usr", "lib", "modules")); err == nil {
			if err := os.Symlink("usr/lib", filepath.Join(kb.Root, "lib")); err != nil {
				return err
			}
		}
	}
	if err := kb.locate(); err != nil {
		return err
	}
	// Debian runs depmod in postinst; dpkg-deb -x does not.
	if out, err := exec.CommandContext(ctx, "depmod", "-b", kb.Root, kb.Uname).CombinedOutput(); err != nil {
		return fmt.Errorf("depmod -b %s %s: %s", kb.Root, kb.Uname, lastLine(out))
	}
	return nil
}

func cachedDeb(dir string, p PkgVersion) (string, error) {
	debs, _ := filepath.Glob(filepath.Join(dir, p.Name+"_*.deb"))
	if len(debs) == 0 {
		return "", os.ErrNotExist
	}
	return debs[0], nil
}

func dpkgExtract(ctx context.Context, deb, root string) error {
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %s", deb, lastLine(out))
	}
	return nil
}

// abi is an image package's kernel release: linux-image-7.2.13+deb14-cloud-amd64 -> 7.2.13+deb14-cloud-amd64.
func abi(image string) string {
	return strings.TrimSuffix(strings.TrimPrefix(image, "linux-image-"), "-unsigned")
}

// DependencyParts reads an image package's Depends field: the packages
// named linux-<word>-<abi> with the exact version it requires.
func DependencyParts(image, depends string) []PkgVersion {
	var ps []PkgVersion
	re := regexp.MustCompile(`^linux-[a-z0-9]+-` + regexp.QuoteMeta(abi(image)) + `$`)
	for _, dep := range strings.Split(depends, ",") {
		if strings.Contains(dep, "|") {
			continue
		}
		name, ver, _ := strings.Cut(strings.TrimSpace(dep), " ")
		ver = strings.TrimSpace(ver)
		if !re.MatchString(name) || !strings.HasPrefix(ver, "(=") {
			continue
		}
		ps = append(ps, PkgVersion{name, strings.TrimSpace(strings.Trim(ver, "(=)"))})
	}
	return ps
}

// locate finds the kernel release and vmlinuz in the unpacked root:
// boot/vmlinuz-<release> (Linux 6 and older) or
// usr/lib/modules/<release>/vmlinuz (Linux 7).
func (kb *KernelBuild) locate() error {
	rels, _ := filepath.Glob(filepath.Join(kb.Root, "usr", "lib", "modules", "*"))
	more, _ := filepath.Glob(filepath.Join(kb.Root, "lib", "modules", "*"))
	for _, d := range append(rels, more...) {
		rel := filepath.Base(d)
		for _, v := range []string{filepath.Join(kb.Root, "boot", "vmlinuz-"+rel), filepath.Join(d, "vmlinuz")} {
			if _, err := os.Stat(v); err == nil {
				kb.Uname, kb.Vmlinuz = rel, v
				return nil
			}
		}
	}
	return fmt.Errorf("%s: no vmlinuz (neither boot/vmlinuz-<release> nor usr/lib/modules/<release>/vmlinuz)", kb.Image)
}

// Modules resolves the module roots of modules.txt (a trailing ? marks an
// optional one) against the kernel's own modules.dep, dependencies first,
// soft dependencies included; built-in modules need nothing.
func (kb *KernelBuild) Modules(ctx context.Context, roots []string, log func(string, ...any)) ([]string, error) {
	var files []string
	seen := map[string]bool{}
	for _, m := range roots {
		name, optional := strings.CutSuffix(m, "?")
		out, err := exec.CommandContext(ctx, "modprobe", "-C", "/nonexistent", "-d", kb.Root, "-S", kb.Uname, "--show-depends", name).CombinedOutput()
		if err != nil {
			if optional {
				log("%s: optional module %s not found, skipped", kb.Uname, name)
				continue
			}
			return nil, fmt.Errorf("%s: module %s: %s", kb.Uname, name, lastLine(out))
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "insmod" && !seen[f[1]] {
				seen[f[1]] = true
				files = append(files, f[1])
			}
		}
	}
	return files, nil
}

// ReadModuleRoots reads modules.txt.
func ReadModuleRoots(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var roots []string
	err = eachLine(f, func(_ int, fs []string) error {
		roots = append(roots, fs[0])
		return nil
	})
	return roots, err
}

// decompressModule returns a module's plain .ko bytes and name (busybox
// insmod takes no compressed modules).
func decompressModule(ctx context.Context, file string) (string, []byte, error) {
	base := path.Base(file)
	var data []byte
	var err error
	switch {
	case strings.HasSuffix(base, ".xz"):
		data, err = exec.CommandContext(ctx, "xz", "-dc", file).Output()
	case strings.HasSuffix(base, ".zst"):
		data, err = exec.CommandContext(ctx, "zstd", "-qdc", file).Output()
	case strings.HasSuffix(base, ".gz"):
		var f *os.File
		if f, err = os.Open(file); err == nil {
			var z *gzip.Reader
			if z, err = gzip.NewReader(f); err == nil {
				data, err = io.ReadAll(z)
			}
			f.Close()
		}
	default:
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return "", nil, fmt.Errorf("decompressing %s: %w", file, err)
	}
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		base = strings.TrimSuffix(base, ext)
	}
	return base, data, nil
}
