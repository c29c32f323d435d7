// Command vmtest runs dnsrace's test binaries in Debian kernels under qemu
// and prints a kernel × tier × suite matrix (internal/vmtest,
// docs/vmtest.md). Exit status: 0 every cell passed or skipped, 1 a cell
// failed or none ran, 2 a usage or setup error.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/vmtest"
)

const usage = `Usage: go run ./cmd/vmtest [options] [--] [[NAME=]PATH[:PATTERN][@TIERS]...]
       go run ./cmd/vmtest --replay LOG...

Boots every kernel of scripts/kernels.txt under qemu and runs each test binary once per tier
(DNSRACE_TEST_TIER=fentry|kprobe|tracepoint, CI=true, under test2json), then prints a kernel x tier x
suite matrix. A spec is a static go test -c binary, its suite NAME, -test.run PATTERN and tiers ("any":
once, DNSRACE_TEST_TIER empty). With no spec, scripts/vmtest.d/suites.txt is built and run.

Options:
`

const envHelp = `
Environment: DNSRACE_VMTEST_MATRIX_OUT=FILE writes the matrix as JSON; DNSRACE_VMTEST_RUN replaces the
-test.run pattern of the default suites; DNSRACE_VMTEST_CACHE (the cache, .cache/vmtest);
DNSRACE_VMTEST_TEST_TIMEOUT (-test.timeout per binary, 600); DNSRACE_VMTEST_MEM (2048), _SMP (2);
DNSRACE_VMTEST_GUEST_ENV="K=V ..." (every test binary's environment); DNSRACE_VMTEST_TCG_THREAD
(single, or multi to reproduce the int3 oops); DNSRACE_VMTEST_KERNEL_ARGS="preempt=full ..." (added
to every guest's kernel command line); DNSRACE_VMTEST_KEEP=1 keeps the run's initramfs;
DNSRACE_VMTEST_MIRROR, _SECURITY_MIRROR (default: the host's apt sources); DNSRACE_VMTEST_SCOPE=full
is --full; DNSRACE_VMTEST_{TIMEOUT,TIERS,ACCEL,JOBS,SPLIT,VERBOSE} are defaults of the options.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	switch {
	case err == nil:
	case errors.Is(err, vmtest.ErrCells):
		os.Exit(1)
	case errors.Is(err, pflag.ErrHelp):
	default:
		fmt.Fprintf(os.Stderr, "vmtest: error: %v\n", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	o := vmtest.Options{
		Root:        root,
		KernelsFile: env("DNSRACE_VMTEST_KERNELS_FILE", filepath.Join(root, "scripts", "kernels.txt")),
		SuitesFile:  filepath.Join(root, "scripts", "vmtest.d", "suites.txt"),
		ModulesFile: filepath.Join(root, "scripts", "vmtest.d", "modules.txt"),
		Cache:       env("DNSRACE_VMTEST_CACHE", filepath.Join(root, ".cache", "vmtest")),
		TestTimeout: envInt("DNSRACE_VMTEST_TEST_TIMEOUT", 600),
		Machine: vmtest.Machine{
			TCGThread:  env("DNSRACE_VMTEST_TCG_THREAD", "single"),
			SMP:        envInt("DNSRACE_VMTEST_SMP", 2),
			Mem:        envInt("DNSRACE_VMTEST_MEM", 2048),
			KernelArgs: os.Getenv("DNSRACE_VMTEST_KERNEL_ARGS"),
		},
		RunPattern:     os.Getenv("DNSRACE_VMTEST_RUN"),
		GuestEnv:       strings.Fields(os.Getenv("DNSRACE_VMTEST_GUEST_ENV")),
		MatrixOut:      os.Getenv("DNSRACE_VMTEST_MATRIX_OUT"),
		Keep:           os.Getenv("DNSRACE_VMTEST_KEEP") == "1",
		AptEtc:         env("DNSRACE_VMTEST_APT_ETC", "/etc/apt"),
		OSRelease:      env("DNSRACE_VMTEST_OS_RELEASE", "/etc/os-release"),
		Mirror:         os.Getenv("DNSRACE_VMTEST_MIRROR"),
		SecurityMirror: os.Getenv("DNSRACE_VMTEST_SECURITY_MIRROR"),
		AptMaxAge:      time.Duration(envInt("DNSRACE_VMTEST_APT_MAX_AGE", 720)) * time.Minute,
		Stdout:         os.Stdout,
		Stderr:         os.Stderr,
	}
	fs := pflag.NewFlagSet("vmtest", pflag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
		fmt.Fprint(os.Stderr, envHelp)
	}
	fs.StringVar(&o.KernelsFile, "kernels", o.KernelsFile, "kernel list")
	only := fs.String("only", "", "run only these kernel labels, comma separated (e.g. 6.1,7.2)")
	timeout := fs.Int("timeout", envInt("DNSRACE_VMTEST_TIMEOUT", 1200), "hard limit per guest in seconds (twice that for arm64): killed, its missing cells failed")
	tiers := fs.String("tiers", env("DNSRACE_VMTEST_TIERS", strings.Join(vmtest.DefaultTiers, " ")), "tiers to run, space or comma separated")
	fs.StringVar(&o.Dnsrace, "dnsrace", "", "put this dnsrace binary in the guests as /usr/bin/dnsrace (default: built when no spec is given)")
	fs.StringVar(&o.Machine.Accel, "accel", env("DNSRACE_VMTEST_ACCEL", "auto"), "qemu accelerator: auto (probe KVM, else TCG), tcg or kvm")
	// Two on 2 host cores. Three end the matrix 40% sooner (a guest's
	// vCPUs share one thread, TCG thread=single, and the tests' waits
	// leave it idle), but stretch the guests' timing, which has found
	// gaps (an answer freed at its socket's close, now an answer) faster
	// than CI can afford to fail on them (docs/vmtest.md).
	fs.IntVar(&o.Jobs, "jobs", envInt("DNSRACE_VMTEST_JOBS", 2), "guests booted at once (each has 2 vCPUs on one emulator thread)")
	fs.StringVar(&o.Split, "split", env("DNSRACE_VMTEST_SPLIT", vmtest.DefaultSplit), `a guest per kernel and group of tiers ("G G ...", each G a comma list); "all": one guest per kernel`)
	fs.BoolVar(&o.Full, "full", os.Getenv("DNSRACE_VMTEST_SCOPE") == "full", "the full matrix: the suites.txt and kernels.txt lines of scope full instead of those of the CI budget")
	fs.BoolVarP(&o.Verbose, "verbose", "v", os.Getenv("DNSRACE_VMTEST_VERBOSE") == "1", "stream the whole guest console, not only markers and failures")
	replay := fs.Bool("replay", false, "print the matrix of earlier console logs (the arguments), no VM")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	o.Tiers = strings.FieldsFunc(*tiers, func(r rune) bool { return r == ' ' || r == ',' })
	o.Timeout = time.Duration(*timeout) * time.Second
	if *timeout <= 0 || o.Jobs < 1 {
		return fmt.Errorf("--timeout and --jobs want numbers >= 1")
	}
	if o.Machine.TCGThread != "single" && o.Machine.TCGThread != "multi" {
		return fmt.Errorf("DNSRACE_VMTEST_TCG_THREAD: single or multi, not %q", o.Machine.TCGThread)
	}
	switch o.Machine.Accel {
	case "auto", "tcg", "kvm":
	default:
		return fmt.Errorf("--accel: auto, tcg or kvm, not %q", o.Machine.Accel)
	}
	if *replay {
		if fs.NArg() == 0 {
			return fmt.Errorf("--replay wants console log files")
		}
		return vmtest.Replay(o, fs.Args())
	}
	o.Specs = fs.Args()
	return vmtest.Run(ctx, o)
}

// repoRoot is the module's root: the working directory or a parent with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("no go.mod in %s or its parents: run from the repository", dir)
		}
	}
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}
