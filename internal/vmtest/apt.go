package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Keyring signs every Debian suite the harness reads.
const Keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// Apt is an apt of the harness's own for one Debian suite and architecture:
// its own sources list, state and cache under Dir, so the host's apt stays
// as it is. The host's /etc/apt/apt.conf.d (proxies) still applies.
type Apt struct {
	Dir      string
	Codename string
	Arch     string
	Mirror   string // the Debian archive, e.g. http://deb.debian.org/debian
	Security string // its security archive
	MaxAge   time.Duration
	Log      func(format string, args ...any)
}

// rolling reports whether a suite has no -updates and -security companions.
func rolling(codename string) bool {
	return codename == "sid" || codename == "unstable" || codename == "experimental"
}

// SourcesList is the sources list of a suite: the suite itself, and its
// -updates and -security suites where a stable release has them.
func SourcesList(codename, arch, mirror, security string) string {
	opt := fmt.Sprintf("[arch=%s signed-by=%s]", arch, Keyring)
	s := fmt.Sprintf("deb %s %s %s main\n", opt, mirror, codename)
	if !rolling(codename) {
		s += fmt.Sprintf("deb %s %s %s-updates main\n", opt, mirror, codename)
		s += fmt.Sprintf("deb %s %s %s-security main\n", opt, security, codename)
	}
	return s
}

// HostMirrors finds the Debian archive and security archive the host's apt
// uses for its own codename, in one-line .list files and deb822 .sources
// files under etc (normally /etc/apt). Other repositories are ignored.
func HostMirrors(etc, codename string) (mirror, security string) {
	note := func(uri string, suites []string) {
		for _, s := range suites {
			switch s {
			case codename + "-security":
				if security == "" {
					security = uri
				}
			case codename, codename + "-updates":
				if mirror == "" {
					mirror = uri
				}
			}
		}
	}
	lists, _ := filepath.Glob(filepath.Join(etc, "sources.list.d", "*.list"))
	for _, f := range append([]string{filepath.Join(etc, "sources.list")}, lists...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			line, _, _ = strings.Cut(line, "#")
			fs := strings.Fields(line)
			if len(fs) < 3 || fs[0] != "deb" {
				continue
			}
			i := 1
			if strings.HasPrefix(fs[1], "[") {
				for i < len(fs) && !strings.HasSuffix(fs[i], "]") {
					i++
				}
				i++
			}
			if i+1 < len(fs) {
				note(fs[i], fs[i+1:i+2])
			}
		}
	}
	srcs, _ := filepath.Glob(filepath.Join(etc, "sources.list.d", "*.sources"))
	for _, f := range srcs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, stanza := range strings.Split(string(data), "\n\n") {
			kv := map[string]string{"Types": "deb"}
			for _, line := range strings.Split(stanza, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(strings.TrimSpace(k), "#") {
					kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
				}
			}
			if !slices.Contains(strings.Fields(kv["Types"]), "deb") || strings.EqualFold(kv["Enabled"], "no") {
				continue
			}
			for _, uri := range strings.Fields(kv["URIs"]) {
				note(uri, strings.Fields(kv["Suites"]))
			}
		}
	}
	mirror, security = strings.TrimSuffix(mirror, "/"), strings.TrimSuffix(security, "/")
	if security == "" && mirror != "" {
		security = strings.TrimSuffix(mirror, "/debian") + "/debian-security"
	}
	return mirror, security
}

func (a *Apt) command(ctx context.Context, tool string, args ...string) *exec.Cmd {
	d := a.Dir
	opts := []string{"-q",
		"-o", "Dir::Etc::sourcelist=" + filepath.Join(d, "sources.list"),
		"-o", "Dir::Etc::sourceparts=" + filepath.Join(d, "empty"),
		"-o", "Dir::Etc::preferences=" + filepath.Join(d, "empty", "none"),
		"-o", "Dir::Etc::preferencesparts=" + filepath.Join(d, "empty"),
		"-o", "Dir::State=" + filepath.Join(d, "state"),
		"-o", "Dir::State::status=" + filepath.Join(d, "state", "status"),
		"-o", "Dir::Cache=" + filepath.Join(d, "cache"),
		"-o", "APT::Architecture=" + a.Arch, "-o", "APT::Architectures=" + a.Arch,
		"-o", "Acquire::Languages=none", "-o", "APT::Sandbox::User=root"}
	return exec.CommandContext(ctx, tool, append(opts, args...)...)
}

// Update writes the sources list and refreshes the package lists when they
// are missing, stale or of another sources list. An update that fails keeps
// the lists of an earlier one, if any.
func (a *Apt) Update(ctx context.Context) error {
	for _, d := range []string{"empty", "state/lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(a.Dir, d), 0o755); err != nil {
			return err
		}
	}
	status := filepath.Join(a.Dir, "state", "status")
	if _, err := os.Stat(status); err != nil {
		if err := os.WriteFile(status, nil, 0o644); err != nil {
			return err
		}
	}
	if _, err := os.Stat(Keyring); err != nil {
		return fmt.Errorf("no %s (apt-get install debian-archive-keyring)", Keyring)
	}
	src := SourcesList(a.Codename, a.Arch, a.Mirror, a.Security)
	list, stamp := filepath.Join(a.Dir, "sources.list"), filepath.Join(a.Dir, "updated")
	if old, _ := os.ReadFile(list); string(old) != src {
		os.Remove(stamp)
		if err := os.WriteFile(list, []byte(src), 0o644); err != nil {
			return err
		}
	}
	if st, err := os.Stat(stamp); err == nil && time.Since(st.ModTime()) < a.MaxAge {
		return nil
	}
	a.Log("apt (%s, %s): updating the lists (own state in %s)", a.Codename, a.Arch, a.Dir)
	out, err := a.command(ctx, "apt-get", "update").CombinedOutput()
	os.WriteFile(filepath.Join(a.Dir, "update.log"), out, 0o644)
	if err == nil {
		return os.WriteFile(stamp, nil, 0o644)
	}
	if lists, _ := filepath.Glob(filepath.Join(a.Dir, "state", "lists", "*_Packages*")); len(lists) > 0 {
		a.Log("apt (%s, %s): update failed (%s); using the lists of an earlier update", a.Codename, a.Arch, lastLine(out))
		return nil
	}
	return fmt.Errorf("apt-get update of %s (%s) from %s failed: %s", a.Codename, a.Arch, a.Mirror, lastLine(out))
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// PkgVersion is a package and a version of it.
type PkgVersion struct{ Name, Version string }

func (p PkgVersion) String() string { return p.Name + "=" + p.Version }

// Candidates is the version apt would fetch of each name it has one of.
func (a *Apt) Candidates(ctx context.Context, names ...string) ([]PkgVersion, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out, err := a.command(ctx, "apt-cache", append([]string{"policy"}, names...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache policy: %w", err)
	}
	return parsePolicy(out), nil
}

// parsePolicy reads apt-cache policy's "name:" and "  Candidate: v" lines.
func parsePolicy(out []byte) []PkgVersion {
	var ps []PkgVersion
	name := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' && strings.HasSuffix(line, ":") {
			name, _, _ = strings.Cut(strings.TrimSuffix(line, ":"), ":")
		} else if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate: "); ok && v != "(none)" && name != "" {
			ps = append(ps, PkgVersion{name, v})
		}
	}
	return ps
}

// Matching is every package matching glob that apt has a candidate for,
// newest first.
func (a *Apt) Matching(ctx context.Context, glob string) ([]PkgVersion, error) {
	prefix, _, _ := strings.Cut(glob, "*")
	out, err := a.command(ctx, "apt-cache", "pkgnames", prefix).Output()
	if err != nil && len(out) == 0 {
		return nil, nil // no name has that prefix
	}
	var names []string
	for _, n := range strings.Fields(string(out)) {
		if ok, _ := path.Match(glob, n); ok {
			names = append(names, n)
		}
	}
	ps, err := a.Candidates(ctx, names...)
	sortNewest(ps)
	return ps, err
}

// Download fetches name=version into dir and returns the .deb's path.
func (a *Apt) Download(ctx context.Context, dir string, p PkgVersion) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	a.Log("downloading %s (%s, %s)", p, a.Codename, a.Arch)
	cmd := a.command(ctx, "apt-get", "download", p.String())
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s (%s, %s): %s", p, a.Codename, a.Arch, lastLine(out))
	}
	debs, _ := filepath.Glob(filepath.Join(dir, p.Name+"_*.deb"))
	if len(debs) == 0 {
		return "", fmt.Errorf("apt-get download %s left no .deb in %s", p, dir)
	}
	return debs[0], nil
}

// sortNewest sorts by name, then version, newest first, comparing runs of
// digits as numbers (sort -V).
func sortNewest(ps []PkgVersion) {
	slices.SortStableFunc(ps, func(a, b PkgVersion) int {
		if c := versionCompare(a.Name, b.Name); c != 0 {
			return -c
		}
		return -versionCompare(a.Version, b.Version)
	})
}

// versionCompare compares two strings with runs of digits as numbers.
func versionCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := unicode.IsDigit(rune(a[0])), unicode.IsDigit(rune(b[0]))
		ra, rb := run(a, da), run(b, db)
		switch {
		case da && db:
			na, nb := strings.TrimLeft(ra, "0"), strings.TrimLeft(rb, "0")
			if len(na) != len(nb) {
				return cmpInt(len(na), len(nb))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
		case da != db:
			if da {
				return 1
			}
			return -1
		default:
			if c := strings.Compare(ra, rb); c != 0 {
				return c
			}
		}
		a, b = a[len(ra):], b[len(rb):]
	}
	return cmpInt(len(a), len(b))
}

func run(s string, digits bool) string {
	i := 0
	for i < len(s) && unicode.IsDigit(rune(s[i])) == digits {
		i++
	}
	return s[:i]
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
