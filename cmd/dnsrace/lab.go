package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/lab"
	"github.com/dnsrace/dnsrace/internal/surveyplot"
)

func init() {
	commands["lab"] = command{summary: "reproduce DNS stalls on purpose in a namespace lab", run: runLab}
}

const labUsage = `Usage: dnsrace lab <command> [flags]

A miniature Kubernetes node in network namespaces: pods on a bridge, a node
that DNATs the DNS VIP 10.96.0.10 to random backends (and can SNAT), and real
DNS servers. Each scenario makes lookups stall on purpose and measures what
the kernel did.

Commands:
  run        build a scenario's lab, drive lookups, report, tear down
  up         build a lab and leave it standing (for dnsrace trace)
  down       tear a standing lab down (also cleans up after a crash)
  survey     run scenarios repeatedly; JSON for comparing kernels
  compare    compare survey files side by side, and plot them
  scenarios  list the scenarios and what each must show

Examples:
  sudo dnsrace lab run --scenario snat-port
  sudo dnsrace lab run --scenario same-tuple --json > same-tuple.json
  sudo dnsrace lab up --scenario snat-port && sudo ip netns exec dnsrace-pod0 getent ahosts svc-00.lab.test.
  sudo dnsrace lab down
  sudo dnsrace lab survey --iterations 3 --json > $(uname -r).json
  dnsrace lab compare 6.1.json 6.18.json --plot kernels.png
`

func runLab(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(os.Stderr, labUsage)
		if len(args) == 0 {
			return usagef("missing lab command")
		}
		return nil
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "run":
		return labRun(ctx, rest)
	case "up":
		return labUp(rest)
	case "down":
		return labDown(rest)
	case "survey", "bench": // bench: its name until "bench" meant only the tracer's cost
		return labSurvey(ctx, rest)
	case "compare":
		return labCompare(rest)
	case "scenarios":
		return labScenarios()
	case "serve": // hidden: the detached DNS backends of `lab up`
		fs := pflag.NewFlagSet("lab serve", pflag.ContinueOnError)
		prefix := fs.String("prefix", "dnsrace", "")
		if err := fs.Parse(rest); err != nil {
			return usageError{err}
		}
		return lab.Serve(ctx, *prefix)
	}
	return usagef("unknown lab command %q (see dnsrace lab --help)", sub)
}

// labFlags are the flags shared by run and up.
type labFlags struct {
	scenario        string
	prefix          string
	pods            int
	backends        int
	duration        time.Duration
	resolver        string
	resolverTimeout time.Duration
	snatPorts       lab.PortRange
	randomFully     bool
	server          string
	json            bool
	// hidden test hooks
	failStep    string
	crashClient time.Duration
}

func (f *labFlags) register(fs *pflag.FlagSet, withDrive bool) {
	fs.StringVar(&f.scenario, "scenario", "", "scenario name (see 'dnsrace lab scenarios'); required")
	fs.StringVar(&f.prefix, "prefix", "dnsrace", "name prefix of the lab's namespaces")
	fs.IntVar(&f.pods, "pods", 0, "number of pod namespaces (default: the scenario's)")
	fs.IntVar(&f.backends, "backends", 2, "number of DNS backends behind the VIP (default: the scenario's)")
	fs.Var(&f.snatPorts, "snat-ports", "SNAT to this port range MIN-MAX (default: the scenario's)")
	fs.BoolVar(&f.randomFully, "random-fully", false, "SNAT with fully random port selection")
	fs.StringVar(&f.server, "server", lab.ServerBuiltin, "DNS backends: builtin (Go, can misbehave on purpose) or dnsmasq (real dnsmasq, must be installed)")
	fs.StringVar(&f.failStep, "fail-at-step", "", "")
	_ = fs.MarkHidden("fail-at-step")
	if !withDrive {
		return
	}
	fs.DurationVar(&f.duration, "duration", 0, "how long to start new lookups (default: the scenario's)")
	fs.StringVar(&f.resolver, "resolver", "", "client: "+strings.Join(lab.Resolvers, ", ")+" (default: the scenario's)")
	fs.DurationVar(&f.resolverTimeout, "resolver-timeout", 5*time.Second, "resolver timeout (glibc and Go default 5s; musl resends at half)")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	fs.DurationVar(&f.crashClient, "crash-client-after", 0, "")
	_ = fs.MarkHidden("crash-client-after")
}

// resolve checks the flags and returns the scenario and its topology.
func (f *labFlags) resolve(fs *pflag.FlagSet) (lab.Scenario, lab.Topology, error) {
	if f.scenario == "" {
		return lab.Scenario{}, lab.Topology{}, usagef("--scenario is required (one of %s)", strings.Join(lab.ScenarioNames(), ", "))
	}
	sc, err := lab.LookupScenario(f.scenario)
	if err != nil {
		return sc, lab.Topology{}, usageError{err}
	}
	pods := sc.Pods
	if fs.Changed("pods") {
		pods = f.pods
	}
	t := sc.Topology(f.prefix, pods)
	if fs.Changed("backends") {
		t.Backends = f.backends
	}
	if fs.Changed("snat-ports") {
		t.SNAT, t.SNATPorts = true, f.snatPorts
	}
	if f.randomFully {
		if !t.SNAT {
			return sc, t, usagef("--random-fully needs SNAT (--snat-ports or a scenario that SNATs)")
		}
		t.RandomFully = true
	}
	if err := t.Validate(); err != nil {
		return sc, t, usageError{err}
	}
	if f.resolver != "" {
		if !slices.Contains(lab.Resolvers, f.resolver) {
			return sc, t, usagef("unknown resolver %q (want %s)", f.resolver, strings.Join(lab.Resolvers, ", "))
		}
	}
	if fs.Changed("duration") && f.duration <= 0 {
		return sc, t, usagef("--duration must be positive")
	}
	if fs.Lookup("resolver-timeout") != nil && f.resolverTimeout < 100*time.Millisecond {
		return sc, t, usagef("--resolver-timeout %v is too short (want >= 100ms)", f.resolverTimeout)
	}
	switch f.server {
	case lab.ServerBuiltin:
	case lab.ServerDnsmasq:
		if sc.Server.IgnoreFraction > 0 || sc.Server.WrongSource {
			return sc, t, usagef("scenario %s needs a server that misbehaves on purpose: use --server builtin", sc.Name)
		}
	default:
		return sc, t, usagef("unknown --server %q (want builtin or dnsmasq)", f.server)
	}
	sc.Server.Kind = f.server
	return sc, t, nil
}

func parseFlags(fs *pflag.FlagSet, args []string, usage string) error {
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitCodeError{0}
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func labRun(ctx context.Context, args []string) error {
	var f labFlags
	fs := pflag.NewFlagSet("lab run", pflag.ContinueOnError)
	f.register(fs, true)
	if err := parseFlags(fs, args, "Usage: dnsrace lab run --scenario NAME [flags]\n\nBuild the scenario's lab, drive lookups, print ground truth, tear down.\nExit status 1 when the scenario's expected outcome was not seen.\n\n"); err != nil {
		return err
	}
	sc, t, err := f.resolve(fs)
	if err != nil {
		return err
	}
	if err := requireRoot("dnsrace lab run"); err != nil {
		return err
	}
	if !f.json {
		fmt.Fprintf(os.Stderr, "running %s: %s\n", sc.Name, sc.Summary)
	}
	rep, err := lab.RunTopology(ctx, t, lab.RunConfig{
		Drive: lab.DriveConfig{
			Scenario: sc, Resolver: f.resolver, Duration: f.duration,
			ResolverTimeout: f.resolverTimeout, CrashClientAfter: f.crashClient,
		},
		FailStep: f.failStep,
	})
	if rep != nil {
		if f.json {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			rep.WriteText(os.Stdout)
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("interrupted; the lab was torn down")
		}
		return err
	}
	if !rep.Expectation.Met {
		return exitCodeError{1}
	}
	return nil
}

func labUp(args []string) error {
	var f labFlags
	fs := pflag.NewFlagSet("lab up", pflag.ContinueOnError)
	f.register(fs, false)
	if err := parseFlags(fs, args, "Usage: dnsrace lab up --scenario NAME [flags]\n\nBuild a scenario's lab and leave it standing, DNS backends running, for\nmanual work and dnsrace trace. Tear it down with 'dnsrace lab down'.\n\n"); err != nil {
		return err
	}
	sc, t, err := f.resolve(fs)
	if err != nil {
		return err
	}
	if err := requireRoot("dnsrace lab up"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := lab.UpDetached(t, sc.Server, sc.Name, []string{self, "lab", "serve", "--prefix", t.Prefix}, f.failStep); err != nil {
		return err
	}
	fmt.Printf("lab %q is up (scenario %s): node %s, dns %s, pods %s..%s\n", t.Prefix, sc.Name, t.NodeNS(), t.DNSNS(), t.PodNS(0), t.PodNS(t.Pods-1))
	if t.LocalNAT {
		fmt.Printf("NAT and conntrack are in each pod's own namespace; the node only routes\n")
	}
	fmt.Printf("try:  ip netns exec %s getent ahosts %s\n", t.PodNS(0), lab.QName(0))
	fmt.Printf("done: dnsrace lab down --prefix %s\n", t.Prefix)
	return nil
}

func labDown(args []string) error {
	fs := pflag.NewFlagSet("lab down", pflag.ContinueOnError)
	prefix := fs.String("prefix", "dnsrace", "name prefix of the lab to tear down")
	if err := parseFlags(fs, args, "Usage: dnsrace lab down [--prefix NAME]\n\nTear down a standing lab: its processes, namespaces, /etc/netns folders and state.\n\n"); err != nil {
		return err
	}
	if err := requireRoot("dnsrace lab down"); err != nil {
		return err
	}
	return lab.Teardown(*prefix)
}

func labSurvey(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("lab survey", pflag.ContinueOnError)
	scenarios := fs.StringSlice("scenarios", lab.ScenarioNames(), "scenarios to run, comma-separated")
	iterations := fs.Int("iterations", 1, "runs per scenario")
	duration := fs.Duration("duration", 0, "per-run duration (default: each scenario's)")
	prefix := fs.String("prefix", "dnsrace", "name prefix of the lab's namespaces")
	resolver := fs.String("resolver", "", "resolver for the scenarios that use glibc: "+strings.Join(lab.Resolvers, ", ")+" (default glibc; under emulation glibc is too slow to race)")
	asJSON := fs.Bool("json", false, "print the result as JSON (documented in README)")
	if err := parseFlags(fs, args, "Usage: dnsrace lab survey [flags]\n\nRun scenarios repeatedly and report race, drop, resolve, loss and stall rates\nand latency per scenario: how this kernel fares, in one JSON file to compare\nwith other kernels' (lab compare).\n\n"); err != nil {
		return err
	}
	scs, err := lab.LookupScenarios(*scenarios)
	if err != nil {
		return usageError{err}
	}
	if *iterations < 1 {
		return usagef("--iterations must be at least 1")
	}
	if *resolver != "" && !slices.Contains(lab.Resolvers, *resolver) {
		return usagef("unknown resolver %q (want %s)", *resolver, strings.Join(lab.Resolvers, ", "))
	}
	if err := requireRoot("dnsrace lab survey"); err != nil {
		return err
	}
	res, err := lab.Survey(ctx, lab.SurveyConfig{Prefix: *prefix, Scenarios: scs, Iterations: *iterations, Duration: *duration, Resolver: *resolver, Progress: os.Stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\truns\tmet\trace_rate\tdrop_rate\tresolve_rate\tloss_rate\tstall_rate\tp50_ms\tp99_ms\tmax_ms\n")
	for _, s := range res.Scenarios {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.1f\t%.1f\t%.1f\n", s.Name, s.Runs, s.Met,
			s.RaceRate, s.DropRate, s.ResolveRate, s.LossRate, s.StallRate, s.Latency.P50Ms, s.Latency.P99Ms, s.Latency.MaxMs)
	}
	return tw.Flush()
}

const labCompareUsage = `Usage: dnsrace lab compare A.json B.json [C.json ...] [--plot FILE.svg|png]

Print the rates and latencies of 'lab survey --json' files side by side, and
the change from the first file to the last. With --plot, also draw them:
each scenario's lookup latency CDF on a log time axis (survey format 2) and
the race, loss and stall rates, one colour per file.

`

func labCompare(args []string) error {
	fs := pflag.NewFlagSet("lab compare", pflag.ContinueOnError)
	plotFile := fs.String("plot", "", "also draw the files to this .svg or .png file")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, labCompareUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitCodeError{0}
		}
		return usageError{err}
	}
	files := fs.Args()
	if len(files) < 2 {
		return usagef("usage: dnsrace lab compare A.json B.json [C.json ...] [--plot FILE.svg|png]")
	}
	if *plotFile != "" {
		if ext := strings.ToLower(filepath.Ext(*plotFile)); ext != ".svg" && ext != ".png" {
			return usagef("--plot %s: want a .svg or .png file name", *plotFile)
		}
	}
	var results []*lab.SurveyResult
	var inputs []surveyplot.Input
	for _, f := range files {
		r, err := lab.ReadSurvey(f)
		if err != nil {
			return usageError{err}
		}
		results = append(results, r)
		inputs = append(inputs, surveyplot.Input{Name: f, Result: r})
	}
	lab.Compare(os.Stdout, results...)
	if *plotFile != "" {
		if err := surveyplot.WriteFile(*plotFile, inputs); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote %s\n", *plotFile)
	}
	return nil
}

func labScenarios() error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tresolver\tpods\twhat\texpected on kernel >= 5.6\n")
	for _, s := range lab.Scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Name, s.Resolver, s.Pods, s.Summary, s.Expect)
	}
	return tw.Flush()
}
