package vmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options are a run's settings (cmd/vmtest maps flags and environment to
// them).
type Options struct {
	Root                    string // the repository
	KernelsFile, SuitesFile string
	ModulesFile             string
	Cache                   string
	Only                    []string
	Tiers                   []string
	Split                   string
	Full                    bool
	Jobs                    int
	Timeout                 time.Duration // a guest's hard limit (twice that for arm64 under TCG)
	TestTimeout             int           // -test.timeout of a binary, seconds
	Machine                 Machine
	Dnsrace                 string   // a dnsrace binary for the guests; built when no spec is given
	Specs                   []string // test binary specs; none: suites.txt
	RunPattern              string   // replaces every suites.txt pattern
	GuestEnv                []string // K=V for every test binary
	Verbose                 bool
	MatrixOut               string
	Keep                    bool // keep the run's folder (initramfs, binaries)
	AptEtc, OSRelease       string
	Mirror, SecurityMirror  string
	AptMaxAge               time.Duration
	Stdout, Stderr          io.Writer
}

// ErrCells is returned when a cell failed or nothing ran.
var ErrCells = errors.New("a cell failed or none ran")

type runner struct {
	Options
	runDir, logDir string
	apts           map[string]*Apt
	mu             sync.Mutex
}

func (r *runner) log(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.Stderr, "vmtest: "+format+"\n", args...)
}

// Run boots the guests of a run and prints its report. It returns ErrCells
// when a cell failed, another error when the run could not be set up.
func Run(ctx context.Context, o Options) error {
	start := time.Now()
	r := &runner{Options: o, apts: map[string]*Apt{}}
	f, err := os.Open(o.KernelsFile)
	if err != nil {
		return err
	}
	all, err := ParseKernels(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("reading %s: %w", o.KernelsFile, err)
	}
	kernels, err := SelectKernels(all, o.Only, o.Full)
	if err != nil {
		return err
	}
	var arches []string
	for _, k := range kernels {
		if !slices.Contains(arches, k.Arch) {
			arches = append(arches, k.Arch)
		}
	}
	if err := needTools(arches); err != nil {
		return err
	}
	id := time.Now().UTC().Format("20060102T150405Z") + "-" + strconv.Itoa(os.Getpid())
	r.runDir, r.logDir = filepath.Join(o.Cache, "run", id), filepath.Join(o.Cache, "logs", id)
	for _, d := range []string{r.runDir, r.logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if !o.Keep {
		defer os.RemoveAll(r.runDir)
	}
	r.pruneLogs()

	// every kernel first: one that cannot be had stops the run before the builds
	plans, vmlinuz, mods := map[string]GuestPlan{}, map[string]string{}, map[string]string{}
	roots, err := ReadModuleRoots(o.ModulesFile)
	if err != nil {
		return err
	}
	for _, k := range kernels {
		p, v, m, err := r.prepare(ctx, k, roots)
		if err != nil {
			return fmt.Errorf("kernel %s (%s): %w", k.Label, k.Package, err)
		}
		plans[k.Label], vmlinuz[k.Label], mods[k.Label] = p, v, m
	}
	suites, dnsrace, err := r.suites(ctx, arches)
	if err != nil {
		return err
	}
	// a base and a suites archive per architecture
	planTiers := map[string][]string{}
	base, suitesCpio := map[string]string{}, map[string]string{}
	for _, a := range arches {
		if len(suites[a]) == 0 {
			return fmt.Errorf("no test binary for %s, the architecture of a selected kernel", a)
		}
		planTiers[a] = PlanTiers(suites[a], o.Tiers)
		t2j, err := r.goBuild(ctx, a, "test2json", "cmd/test2json")
		if err != nil {
			return err
		}
		suitesCpio[a] = filepath.Join(r.runDir, "suites-"+a+".cpio")
		gf := GuestFiles{Suites: suites[a], Test2json: t2j, Dnsrace: dnsrace[a], TestTimeout: o.TestTimeout, Env: o.GuestEnv}
		if err := WriteSuites(suitesCpio[a], gf); err != nil {
			return err
		}
		var u *Userland
		if a == "amd64" {
			u, err = HostUserland(ctx)
		} else {
			var apt *Apt
			if apt, err = r.apt(ctx, hostCodename(o.OSRelease), a); err == nil {
				u, err = ForeignUserland(ctx, apt, filepath.Join(o.Cache, "userland", apt.Codename+"-"+a))
			}
		}
		if err != nil {
			return fmt.Errorf("preparing the %s userland: %w", a, err)
		}
		base[a] = filepath.Join(r.runDir, "base-"+a+".cpio")
		if err := WriteBase(base[a], u); err != nil {
			return err
		}
	}

	// every initramfs written before the first boot; a kernel's guests
	// skip the suites of other kernels (vmtest.skip=)
	skips := map[string][]string{}
	for _, k := range kernels {
		p := plans[k.Label]
		for _, su := range suites[k.Arch] {
			if !su.RunsOn(k.Label) {
				skips[k.Label] = append(skips[k.Label], su.Name)
				continue
			}
			p.Suites = append(p.Suites, PlannedSuite{Name: su.Name, Tiers: su.Tiers})
		}
		plans[k.Label] = p
		if err := concat(filepath.Join(r.runDir, k.Label+".initrd"), base[k.Arch], mods[k.Label], suitesCpio[k.Arch]); err != nil {
			return err
		}
	}
	for _, a := range arches {
		os.Remove(base[a])
		os.Remove(suitesCpio[a])
	}
	machine := o.Machine
	if machine.Accel == "auto" {
		machine.Accel = r.pickAccel(ctx, kernels, vmlinuz)
	}

	guests := Guests(kernels, planTiers, o.Split)
	logs := make([]string, len(guests))
	sem := make(chan struct{}, o.Jobs)
	var wg sync.WaitGroup
	for i, g := range guests {
		plan := plans[g.Kernel.Label]
		plan.Guest, plan.Tiers = g.Name, g.Tiers
		logs[i] = filepath.Join(r.logDir, g.Name+".console")
		sem <- struct{}{}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			timeout := o.Timeout
			if g.Kernel.Arch != "amd64" {
				// TCG emulates arm64 on x86 several times slower than x86
				timeout *= time.Duration(atoiOr(os.Getenv("DNSRACE_VMTEST_FOREIGN_TIMEOUT_FACTOR"), 2))
			}
			m := machine
			if g.Kernel.Arch != "amd64" {
				m.Accel = "tcg" // the KVM probe was of an amd64 guest
			}
			plan.Accel = m.Accel
			r.log("%s: booting %s (%s, %s, %d CPUs, %d MiB, timeout %s), console in %s",
				g.Name, plan.Uname, plan.Arch, m.Accel, m.SMP, m.Mem, timeout, logs[i])
			initrd := filepath.Join(r.runDir, g.Kernel.Label+".initrd")
			hr, err := m.Boot(ctx, plan, vmlinuz[g.Kernel.Label], initrd, guestArgs(g.Tiers, skips[g.Kernel.Label]), timeout, logs[i], r.follower(g.Name))
			if err != nil {
				r.log("%s: %v", g.Name, err)
				return
			}
			if err := decodeFile(logs[i], strings.TrimSuffix(logs[i], ".console")+".log"); err != nil {
				r.log("%s: %v", g.Name, err)
			}
			if hr.TimedOut {
				r.log("%s: guest killed after %s", g.Name, timeout)
			}
			r.log("%s: guest ran %.1fs (qemu rc %d)", g.Name, hr.Seconds, hr.RC)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return report(logs, time.Since(start).Seconds(), o)
}

// decodeFile writes the text of a console log (DecodeConsole).
func decodeFile(console, text string) error {
	in, err := os.Open(console)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(text)
	if err != nil {
		return err
	}
	err = DecodeConsole(in, out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// Replay prints the report of earlier console logs.
func Replay(o Options, logs []string) error {
	return report(logs, -1, o)
}

func report(logs []string, total float64, o Options) error {
	rep := &Report{TotalSeconds: total}
	sum := 0.0
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			return err
		}
		g, err := ParseConsole(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", l, err)
		}
		g.Path = l
		if g.Host != nil {
			sum += g.Host.Seconds
		}
		rep.Guests = append(rep.Guests, g)
	}
	if total < 0 {
		rep.TotalSeconds = sum // a replay: the guests' walls added up
	}
	rep.Write(o.Stdout)
	if o.MatrixOut != "" {
		f, err := os.Create(o.MatrixOut)
		if err != nil {
			return err
		}
		err = rep.WriteJSON(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(o.Stderr, "vmtest: matrix written to %s\n", o.MatrixOut)
	}
	if rep.Failed() {
		return ErrCells
	}
	return nil
}

// follower streams a guest's markers and failures (everything with
// Verbose), decoded from test2json.
func (r *runner) follower(name string) func(string) {
	prefix := ""
	if r.Jobs > 1 {
		prefix = "[" + name + "] "
	}
	return func(line string) {
		text := line
		if loc := eventRE.FindStringIndex(line); loc != nil {
			var ev testEvent
			if json.Unmarshal([]byte(line[loc[0]:]), &ev) == nil {
				if ev.Action != "output" {
					return
				}
				text = strings.TrimRight(ev.Output, "\n")
			}
		}
		if r.Verbose || strings.Contains(text, "VMTEST-") || strings.HasPrefix(strings.TrimSpace(text), "--- FAIL") ||
			strings.HasPrefix(text, "panic:") || strings.Contains(text, "insmod") || strings.Contains(text, "Kernel panic") {
			r.mu.Lock()
			fmt.Fprintf(r.Stderr, "%s%s\n", prefix, text)
			r.mu.Unlock()
		}
	}
}

// suites is the test binaries per architecture, and dnsrace per
// architecture: the specs given, or suites.txt built for each architecture.
func (r *runner) suites(ctx context.Context, arches []string) (map[string][]Suite, map[string]string, error) {
	suites, dnsrace := map[string][]Suite{}, map[string]string{}
	if r.Dnsrace != "" {
		a, err := ElfArch(r.Dnsrace)
		if err != nil {
			return nil, nil, fmt.Errorf("--dnsrace: %w", err)
		}
		dnsrace[a] = r.Dnsrace
	}
	if len(r.Specs) > 0 {
		for _, spec := range r.Specs {
			s, err := ParseSpec(spec, r.Tiers)
			if err != nil {
				return nil, nil, err
			}
			if st, err := os.Stat(s.Binary); err != nil || st.Mode()&0o111 == 0 {
				return nil, nil, fmt.Errorf("test binary %s (spec %s) is not an executable file", s.Binary, spec)
			}
			if s.Arch, err = ElfArch(s.Binary); err != nil {
				return nil, nil, err
			}
			if td := filepath.Join(filepath.Dir(s.Binary), "testdata"); isDir(td) {
				s.Testdata = td
			}
			suites[s.Arch] = append(suites[s.Arch], s)
		}
		return suites, dnsrace, nil
	}
	f, err := os.Open(r.SuitesFile)
	if err != nil {
		return nil, nil, err
	}
	lines, err := ParseSuites(f)
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", r.SuitesFile, err)
	}
	for _, a := range arches {
		for _, s := range SuitesFor(lines, a, r.Full, r.Tiers, r.RunPattern) {
			if err := r.checkTestPackage(ctx, s); err != nil {
				return nil, nil, err
			}
			pkg := s.Binary
			if s.Binary, err = r.goTest(ctx, a, pkg); err != nil {
				return nil, nil, err
			}
			if td := filepath.Join(r.Root, pkg, "testdata"); isDir(td) {
				s.Testdata = td
			}
			r.log("suite %s (%s): %s, -test.run '%s', tiers %s", s.Name, a, pkg, s.Pattern, strings.Join(s.Tiers, ","))
			suites[a] = append(suites[a], s)
		}
		if dnsrace[a] == "" {
			if dnsrace[a], err = r.goBuild(ctx, a, "dnsrace", "./cmd/dnsrace"); err != nil {
				return nil, nil, err
			}
		}
	}
	return suites, dnsrace, nil
}

// checkTestPackage: a suite names tests that must run, so a package that
// is gone, or has none, is an error in suites.txt, not a cell to skip.
func (r *runner) checkTestPackage(ctx context.Context, s Suite) error {
	if !isDir(filepath.Join(r.Root, s.Binary)) {
		return fmt.Errorf("%s: suite %s: package %s does not exist", r.SuitesFile, s.Name, s.Binary)
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-f", "{{len .TestGoFiles}} {{len .XTestGoFiles}}", s.Binary)
	cmd.Dir = r.Root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list %s: %w", s.Binary, err)
	}
	if strings.TrimSpace(string(out)) == "0 0" {
		return fmt.Errorf("%s: suite %s: package %s has no test files", r.SuitesFile, s.Name, s.Binary)
	}
	return nil
}

// goTest builds a package's static test binary for arch, once per run.
func (r *runner) goTest(ctx context.Context, arch, pkg string) (string, error) {
	out := filepath.Join(r.runDir, "bin", arch, strings.TrimPrefix(pkg, "./")+".test")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	r.log("building %s test binary for %s", pkg, arch)
	return out, r.goCmd(ctx, arch, "test", "-c", "-o", out, pkg)
}

// goBuild builds a static program for arch.
func (r *runner) goBuild(ctx context.Context, arch, name, pkg string) (string, error) {
	out := filepath.Join(r.runDir, "bin", arch, name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	r.log("building %s for %s", pkg, arch)
	return out, r.goCmd(ctx, arch, "build", "-o", out, pkg)
}

func (r *runner) goCmd(ctx context.Context, arch string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = r.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = r.Stderr, r.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (%s): %w", strings.Join(args, " "), arch, err)
	}
	return nil
}

// apt is the apt of a Debian suite and architecture, updated once a run.
func (r *runner) apt(ctx context.Context, codename, arch string) (*Apt, error) {
	key := codename + "-" + arch
	if a := r.apts[key]; a != nil {
		return a, nil
	}
	mirror, security := HostMirrors(r.AptEtc, hostCodename(r.OSRelease))
	if r.Mirror != "" {
		mirror = strings.TrimSuffix(r.Mirror, "/")
	}
	if r.SecurityMirror != "" {
		security = strings.TrimSuffix(r.SecurityMirror, "/")
	}
	if mirror == "" {
		return nil, fmt.Errorf("no Debian mirror of suite %s in %s/sources.list*; set DNSRACE_VMTEST_MIRROR", hostCodename(r.OSRelease), r.AptEtc)
	}
	a := &Apt{Dir: filepath.Join(r.Cache, "apt", key), Codename: codename, Arch: arch, Mirror: mirror, Security: security, MaxAge: r.AptMaxAge, Log: r.log}
	if err := a.Update(ctx); err != nil {
		return nil, err
	}
	r.apts[key] = a
	return a, nil
}

// prepare fetches a kernel and writes its modules archive (under the
// cache's lock: concurrent runs share the cache); it returns the guest plan
// (without suites), the vmlinuz and the modules archive.
func (r *runner) prepare(ctx context.Context, k Kernel, roots []string) (GuestPlan, string, string, error) {
	var plan GuestPlan
	codename := k.Suite
	if codename == "" {
		codename = hostCodename(r.OSRelease)
	}
	lock, err := os.OpenFile(filepath.Join(r.Cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return plan, "", "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return plan, "", "", fmt.Errorf("locking the cache: %w", err)
	}
	apt, err := r.apt(ctx, codename, k.Arch)
	if err != nil {
		return plan, "", "", err
	}
	kb, err := FetchKernel(ctx, apt, r.Cache, k.Package)
	if err != nil {
		return plan, "", "", err
	}
	mods, err := ModulesArchive(ctx, kb, k.Label, roots, r.log)
	if err != nil {
		return plan, "", "", err
	}
	plan = GuestPlan{Kernel: k.Label, Arch: k.Arch, Suite: codename, Wanted: k.Package, Package: kb.Image.Name,
		Version: kb.Image.Version, Pin: kb.Pin, Uname: kb.Uname, Timeout: int(r.Timeout.Seconds())}
	for _, p := range kb.Parts {
		plan.Parts = append(plan.Parts, p.String())
	}
	parts := ""
	if len(plan.Parts) > 0 {
		parts = " (" + strings.Join(plan.Parts, ", ") + ")"
	}
	r.log("kernel %s: %s%s, %s, pin %s", k.Label, kb.Image, parts, kb.Uname, kb.Pin)
	return plan, kb.Vmlinuz, mods, nil
}

// pickAccel is kvm if a tiny amd64 guest reaches /init under KVM within a
// few seconds, else tcg (nested KVM hangs at boot on some hosts). The
// answer is remembered per host boot.
func (r *runner) pickAccel(ctx context.Context, kernels []Kernel, vmlinuz map[string]string) string {
	if syscall.Access("/dev/kvm", 2) != nil {
		r.log("no writable /dev/kvm: using TCG")
		return "tcg"
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	memo := filepath.Join(r.Cache, "accel-"+strings.TrimSpace(string(boot)))
	if b, err := os.ReadFile(memo); err == nil {
		r.log("accelerator %s (probed earlier in this host boot; rm %s to probe again)", strings.TrimSpace(string(b)), memo)
		return strings.TrimSpace(string(b))
	}
	i := slices.IndexFunc(kernels, func(k Kernel) bool { return k.Arch == "amd64" })
	if i < 0 {
		return "tcg"
	}
	k := kernels[i]
	m := r.Machine
	m.Accel = "kvm"
	probe := filepath.Join(r.logDir, "kvm-probe.log")
	m.Boot(ctx, GuestPlan{Kernel: k.Label, Arch: "amd64"}, vmlinuz[k.Label], filepath.Join(r.runDir, k.Label+".initrd"), "vmtest.probe=1", 10*time.Second, probe, nil)
	accel := "tcg"
	if b, _ := os.ReadFile(probe); strings.Contains(string(b), "VMTEST-PROBE-OK") {
		accel = "kvm"
	}
	r.log("KVM probe: using %s", accel)
	os.WriteFile(memo, []byte(accel+"\n"), 0o644)
	return accel
}

// pruneLogs keeps the console logs of the last 20 runs (and of every run
// still going: its folder ends in its pid), points logs/latest at this
// run, and removes run folders of killed runs (an hour old).
func (r *runner) pruneLogs() {
	logs := filepath.Dir(r.logDir)
	os.Remove(filepath.Join(logs, "latest"))
	os.Symlink(filepath.Base(r.logDir), filepath.Join(logs, "latest"))
	ents, _ := os.ReadDir(logs)
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	sort.Strings(dirs)
	for n := len(dirs); n > 20; n-- {
		if !running(dirs[0]) {
			os.RemoveAll(filepath.Join(logs, dirs[0]))
		}
		dirs = dirs[1:]
	}
	runs, _ := os.ReadDir(filepath.Dir(r.runDir))
	for _, e := range runs {
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < time.Hour {
			continue
		}
		if !running(e.Name()) {
			os.RemoveAll(filepath.Join(filepath.Dir(r.runDir), e.Name()))
		}
	}
}

// running: the run whose folder is name (STAMP-PID) is still going.
func running(name string) bool {
	_, pid, _ := strings.Cut(name, "-")
	n, err := strconv.Atoi(pid)
	return err == nil && syscall.Kill(n, 0) == nil
}

// needTools checks the host programs a run calls.
func needTools(arches []string) error {
	tools := map[string]string{"dpkg-deb": "dpkg", "depmod": "kmod", "modprobe": "kmod", "apt-get": "apt", "xz": "xz-utils", "go": "golang"}
	if slices.Contains(arches, "amd64") {
		tools[envOr("DNSRACE_VMTEST_QEMU", "qemu-system-x86_64")] = "qemu-system-x86"
	}
	if slices.Contains(arches, "arm64") {
		tools[envOr("DNSRACE_VMTEST_QEMU_ARM64", "qemu-system-aarch64")] = "qemu-system-arm"
	}
	var missing []string
	for t, pkg := range tools {
		if _, err := exec.LookPath(t); err != nil && !slices.Contains(missing, pkg) {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("missing tools; install: apt-get install %s", strings.Join(missing, " "))
	}
	return nil
}

// hostCodename is the host's Debian codename (bookworm when unknown).
func hostCodename(osRelease string) string {
	data, _ := os.ReadFile(osRelease)
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok && strings.Trim(v, `"`) != "" {
			return strings.Trim(v, `"`)
		}
	}
	return "bookworm"
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func atoiOr(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return n
	}
	return def
}

// guestArgs is the kernel command line's part for init.sh: the tiers a
// guest runs and the suites it skips.
func guestArgs(tiers, skip []string) string {
	a := "vmtest.tiers=" + strings.Join(tiers, ",")
	if len(skip) > 0 {
		a += " vmtest.skip=" + strings.Join(skip, ",")
	}
	return a
}
