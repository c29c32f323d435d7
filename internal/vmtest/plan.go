package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Tiers the harness knows; "any" runs a suite once with DNSRACE_TEST_TIER
// empty (a suite that attaches nothing).
const TierAny = "any"

// DefaultTiers and DefaultSplit are the run's defaults (--tiers, --split).
var (
	DefaultTiers = []string{"fentry", "kprobe", "tracepoint"}
	// A kernel's fentry tier, with the nine trace scenarios, takes about as
	// long as its other tiers together: one guest each packs two slots evenly.
	DefaultSplit = "fentry kprobe,tracepoint,any"
)

// Kernel is a line of kernels.txt:
// <label> <package> [suite=CODENAME] [arch=amd64|arm64] [scope=full].
type Kernel struct {
	Label   string
	Package string // a name or a glob (the newest match)
	Suite   string // Debian suite; empty: the host's
	Arch    string
	// Full is set for a kernel of the full matrix only (scope=full): the
	// default run leaves it out unless --only names it.
	Full bool
}

// ParseKernels reads kernels.txt.
func ParseKernels(r io.Reader) ([]Kernel, error) {
	var ks []Kernel
	seen := map[string]bool{}
	err := eachLine(r, func(n int, f []string) error {
		if len(f) < 2 {
			return fmt.Errorf("line %d: want <label> <package> [suite=CODENAME] [arch=ARCH] [scope=full]", n)
		}
		k := Kernel{Label: f[0], Package: f[1], Arch: "amd64"}
		for _, w := range f[2:] {
			key, val, _ := strings.Cut(w, "=")
			switch {
			case key == "suite" && val != "":
				k.Suite = val
			case key == "arch" && (val == "amd64" || val == "arm64"):
				k.Arch = val
			case key == "scope" && (val == "full" || val == "default"):
				k.Full = val == "full"
			default:
				return fmt.Errorf("line %d: kernel %s: unknown field %q (want suite=CODENAME, arch=amd64|arm64 or scope=full)", n, k.Label, w)
			}
		}
		if seen[k.Label] {
			return fmt.Errorf("line %d: kernel %s listed twice", n, k.Label)
		}
		seen[k.Label] = true
		ks = append(ks, k)
		return nil
	})
	return ks, err
}

// SelectKernels keeps the kernels of a run: those --only names (in any
// scope), else those of the run's scope.
func SelectKernels(ks []Kernel, only []string, full bool) ([]Kernel, error) {
	var out []Kernel
	for _, k := range ks {
		if len(only) > 0 {
			if slices.Contains(only, k.Label) {
				out = append(out, k)
			}
			continue
		}
		if !k.Full || full {
			out = append(out, k)
		}
	}
	for _, l := range only {
		if !slices.ContainsFunc(ks, func(k Kernel) bool { return k.Label == l }) {
			return nil, fmt.Errorf("--only %s: no such kernel label", l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no kernel selected")
	}
	return out, nil
}

// SuiteLine is a line of suites.txt:
// <name> <package> <pattern> <tiers> [<arches> [<scope>]]; the arches
// column may name kernel labels too (the suite then runs on those alone).
type SuiteLine struct {
	Name, Package, Pattern string
	Tiers                  []string // "all" expands to the run's tiers
	Arches                 []string // empty: every architecture
	Kernels                []string // kernel labels it runs on; empty: every kernel
	Scope                  string   // always, default or full
}

// isArch tells an architecture from a kernel label in the arches column.
func isArch(w string) bool { return w == "amd64" || w == "arm64" }

// ParseSuites reads suites.txt.
func ParseSuites(r io.Reader) ([]SuiteLine, error) {
	var ss []SuiteLine
	err := eachLine(r, func(n int, f []string) error {
		if len(f) < 4 || len(f) > 6 {
			return fmt.Errorf("line %d: want <name> <package> <pattern> <tiers> [<arches> [<scope>]]", n)
		}
		s := SuiteLine{Name: f[0], Package: f[1], Pattern: f[2], Tiers: strings.Split(f[3], ","), Scope: "always"}
		if len(f) > 4 && f[4] != "all" {
			for _, w := range strings.Split(f[4], ",") {
				if isArch(w) {
					s.Arches = append(s.Arches, w)
				} else {
					s.Kernels = append(s.Kernels, w)
				}
			}
		}
		if len(f) > 5 {
			s.Scope = f[5]
		}
		switch s.Scope {
		case "always", "default", "full":
		default:
			return fmt.Errorf("line %d: suite %s: scope %q, want always, default or full", n, s.Name, s.Scope)
		}
		ss = append(ss, s)
		return nil
	})
	return ss, err
}

// Suite is one test binary to run in the guests of an architecture.
type Suite struct {
	Name     string
	Binary   string // host path of the test binary; for a suites.txt line, its package
	Pattern  string // -test.run
	Tiers    []string
	Arch     string
	Kernels  []string // the kernel labels it runs on; empty: every kernel of Arch
	Testdata string   // a testdata folder copied along, or ""
}

// RunsOn tells whether the suite runs in the guests of kernel label.
func (s Suite) RunsOn(label string) bool {
	return len(s.Kernels) == 0 || slices.Contains(s.Kernels, label)
}

// SuitesFor picks the suites.txt lines of a run for one architecture: the
// lines of its scope (full or the CI's default) and of that architecture.
// run, when set, replaces every pattern (DNSRACE_VMTEST_RUN).
func SuitesFor(lines []SuiteLine, arch string, full bool, tiers []string, run string) []Suite {
	scope := "default"
	if full {
		scope = "full"
	}
	var out []Suite
	for _, l := range lines {
		if l.Scope != "always" && l.Scope != scope {
			continue
		}
		if len(l.Arches) > 0 && !slices.Contains(l.Arches, arch) {
			continue
		}
		s := Suite{Name: l.Name, Binary: l.Package, Pattern: l.Pattern, Tiers: expandTiers(l.Tiers, tiers), Arch: arch,
			Kernels: l.Kernels}
		if len(s.Tiers) == 0 {
			continue // e.g. traceone in a run of the fentry tier alone
		}
		if run != "" {
			s.Pattern = run
		}
		out = append(out, s)
	}
	return out
}

// expandTiers is a suites.txt line's tiers in a run of the given tiers:
// "all" is all of them, a list keeps those the run has, "any" stays.
func expandTiers(ts, run []string) []string {
	if len(ts) == 1 && ts[0] == "all" {
		return slices.Clone(run)
	}
	var out []string
	for _, t := range ts {
		if t == TierAny || slices.Contains(run, t) {
			out = append(out, t)
		}
	}
	return out
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
var tierRE = regexp.MustCompile(`^[a-z0-9_]+$`)

// ParseSpec reads a test binary spec [NAME=]PATH[:PATTERN][@TIERS]. The
// architecture and testdata are filled in by the caller, which sees files.
func ParseSpec(spec string, tiers []string) (Suite, error) {
	rest := spec
	s := Suite{Pattern: ".", Tiers: slices.Clone(tiers)}
	if name, path, ok := strings.Cut(rest, "="); ok && !strings.Contains(name, "/") {
		s.Name, rest = name, path
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		s.Tiers = strings.Split(rest[i+1:], ",")
		for _, t := range s.Tiers {
			if !tierRE.MatchString(t) {
				return s, fmt.Errorf("spec %s: bad tier %q", spec, t)
			}
		}
		rest = rest[:i]
	}
	if path, pattern, ok := strings.Cut(rest, ":"); ok {
		rest = path
		if pattern != "" {
			s.Pattern = pattern
		}
	}
	if strings.ContainsAny(s.Pattern, " \t") {
		return s, fmt.Errorf("spec %s: the -test.run pattern cannot contain spaces", spec)
	}
	s.Binary = rest
	if s.Binary == "" {
		return s, fmt.Errorf("spec %s: no path", spec)
	}
	if s.Name == "" {
		s.Name = strings.TrimSuffix(filepath.Base(s.Binary), ".test")
	}
	if !nameRE.MatchString(s.Name) {
		return s, fmt.Errorf("spec %s: bad suite name %q", spec, s.Name)
	}
	return s, nil
}

// PlanTiers is the tiers of an architecture's suites in run order: the
// run's tiers first (in --tiers order), then others such as "any", in the
// order the suites name them.
func PlanTiers(suites []Suite, tiers []string) []string {
	var used []string
	for _, s := range suites {
		for _, t := range s.Tiers {
			if !slices.Contains(used, t) {
				used = append(used, t)
			}
		}
	}
	var out []string
	for _, t := range tiers {
		if slices.Contains(used, t) {
			out = append(out, t)
		}
	}
	for _, t := range used {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// SplitTiers groups a kernel's plan tiers into guests by split ("G G ...",
// each G a comma list): a guest per group that has a planned tier, and one
// more for the planned tiers in no group. "all" is one guest.
func SplitTiers(plan []string, split string) [][]string {
	if split == "all" || strings.TrimSpace(split) == "" {
		return [][]string{slices.Clone(plan)}
	}
	var groups [][]string
	left := slices.Clone(plan)
	for _, g := range strings.Fields(split) {
		var got []string
		for _, t := range strings.Split(g, ",") {
			if i := slices.Index(left, t); i >= 0 {
				got = append(got, t)
				left = slices.Delete(left, i, i+1)
			}
		}
		if len(got) > 0 {
			groups = append(groups, got)
		}
	}
	if len(left) > 0 {
		groups = append(groups, left)
	}
	return groups
}

// Guest is one boot of a kernel, with the tiers it runs.
type Guest struct {
	Kernel Kernel
	Tiers  []string
	// Name is the kernel's label, then @ and the tiers joined by + when the
	// kernel is split over several guests; it names the console log.
	Name  string
	group int
}

// Guests lists the guests of a run in boot order: group by group (the
// first, with the trace scenarios, is the longest), and in each the arm64
// guests first (slower under TCG), so two slots end close together.
// planTiers gives each architecture's plan tiers.
func Guests(ks []Kernel, planTiers map[string][]string, split string) []Guest {
	var gs []Guest
	for _, k := range ks {
		groups := SplitTiers(planTiers[k.Arch], split)
		for i, g := range groups {
			name := k.Label
			if len(groups) > 1 {
				name += "@" + strings.Join(g, "+")
			}
			gs = append(gs, Guest{Kernel: k, Tiers: g, Name: name, group: i})
		}
	}
	sort.SliceStable(gs, func(i, j int) bool {
		if gs[i].group != gs[j].group {
			return gs[i].group < gs[j].group
		}
		return gs[i].Kernel.Arch != "amd64" && gs[j].Kernel.Arch == "amd64"
	})
	return gs
}

// eachLine calls f with the fields of every line that is not blank or a
// comment; a '#' starts a comment anywhere.
func eachLine(r io.Reader, f func(n int, fields []string) error) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fs := strings.Fields(line)
		if len(fs) == 0 {
			continue
		}
		if err := f(n, fs); err != nil {
			return err
		}
	}
	return sc.Err()
}
