package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/overhead"
	"github.com/dnsrace/dnsrace/internal/runcost"
)

func init() {
	commands["bench"] = command{summary: "measure the tracer's overhead and capacity in a namespace lab", run: runBench}
}

const benchUsage = `Usage: dnsrace bench [flags]

Measure what tracing costs, in a namespace lab (prefix dnsperf), with
and without the tracer in alternating rounds:

  udp-forward   unpaced non-DNS UDP flood, pod -> node (forwarding) -> dns ns
  udp-loopback  the same on 127.0.0.1 inside one namespace
  dns-forward   unpaced DNS queries through the node, answered
  dns-loopback  the same on 127.0.0.1
  syscall-fork  fork/exec/exit loops on every CPU, no network
  syscall-open  open/close loops
  syscall-mmap  mmap/munmap loops
  capacity      paced DNS queries (--rate ladder), answered, traced: the
                highest rate with zero lost records, the tracer's CPU and RSS

The tracer is this binary's 'trace --json' subcommand, run as a child
process (--attach, default tracepoint) that writes to a file in a
temporary directory, read after each round; its summary says how many records
it read, their bytes, how many were lost, and the hook calls the kernel
skipped its programs for (recursion misses, shown when there are any). A
case whose traced rounds lost records, or (DNS floods) did not follow more
than 1% of the answers the flood read to their queries, reports no ratio
("invalid"), and --smoke fails on it. With two rounds or more each case
also shows its lowest and highest ratio of one round: two runs that differ
by less than that differ by the machine's noise, not the tracer. Each
valid case also gives the whole machine's busy CPU time (/proc/stat) per
packet, query or loop, untraced and traced: what tracing adds to a unit
in microseconds, and how much of that the target's ratio allows.
--memory instead feeds synthetic unanswered queries to the correlator in
this process and reports its memory. After the timed rounds, a count
pass (--skip-count leaves it out, --count-only runs it alone) runs one
tracer through every case with the kernel's BPF run-time statistics on
(Linux 5.8+; for that pass only: they add two clock reads to every BPF
program run on the machine) and reports, per case, each of the tracer's
programs' runs per answered query, packet or loop and its ns per run, and
the programs' kernel time per unit. Counts hold anywhere; times hold for
the machine only, and under emulation (qemu TCG) are the emulator's, not
a measurement of any hardware. --floor adds a third round to each cost
case, the tracer with every program emptied ("return 0") at the same
hooks: what the hooks alone cost this kernel, which no program at those
hooks can do better than. --soak instead runs
the tracer through pod churn (pods born and deleted continuously, each
asking DNS through NAT in its own namespace) and samples the tracer's
open files, RSS and held namespaces and the kernel's network namespaces:
flat, or growing with every pod (a leak); exit 1 when any grew.

Examples:
  sudo dnsrace bench
  sudo dnsrace bench --duration 5s --rounds 3 --json > bench.json
  sudo dnsrace bench --skip-cost --rate 50000,100000,200000
  sudo dnsrace bench --count-only --attach fentry
  sudo dnsrace bench --skip-capacity --case syscall-open,udp-forward --floor
  sudo dnsrace bench --smoke
  dnsrace bench --memory --queries 1000000
  sudo dnsrace bench --soak 5m

Flags:
`

func runBench(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchUsage); fs.PrintDefaults() }
	var (
		duration   = fs.Duration("duration", 5*time.Second, "length of each flood")
		rounds     = fs.Int("rounds", 3, "untraced/traced round pairs per case (alternating order)")
		sockets    = fs.Int("sockets", 2, "sending sockets per flood")
		rates      = fs.IntSlice("rate", nil, "capacity ladder in DNS queries/s (default 2000,10000,25000,50000,100000,150000,200000,300000)")
		cases      = fs.StringSlice("case", nil, "cost cases to run (default all: udp-forward, udp-loopback, dns-forward, dns-loopback, syscall-fork, syscall-open, syscall-mmap)")
		skipCost   = fs.Bool("skip-cost", false, "leave out the per-packet cost cases")
		skipCap    = fs.Bool("skip-capacity", false, "leave out the capacity search")
		skipCount  = fs.Bool("skip-count", false, "leave out the count pass (BPF program runs per unit of the cost cases)")
		ring       = fs.Uint32("ring-buffer-size", 0, "the tracer's ring buffer size in bytes (default: the tracer's)")
		attach     = fs.String("attach", "tracepoint", "the tracer's attach tier: auto, fentry, kprobe or tracepoint")
		tracerArgs = fs.StringArray("tracer-arg", nil, "one more argument for the tracer (repeatable; e.g. --tracer-arg=--cpuprofile=/tmp/p)")
		smoke      = fs.Bool("smoke", false, "short CI run (~40s): checks the harness, that no record is lost in the floods and at 2,000 queries/s, and that the DNS floods' answers are followed to their queries; exit 1 otherwise")
		jsonOut    = fs.Bool("json", false, "write one JSON document")
		memory     = fs.Bool("memory", false, "measure the correlator's memory with --queries unanswered queries in flight (no root, no lab)")
		queries    = fs.Int("queries", 1_000_000, "unanswered queries fed by --memory")
		maxQueries = fs.Int("max-queries", 0, "--memory: the correlator's cap on queries in flight (default: its default)")
		floor      = fs.Bool("floor", false, "add rounds with the tracer's programs emptied, at the same hooks: the cost of the hooks alone")
		runCost    = fs.Bool("run-cost", false, "measure what one BPF program run costs on this kernel: a trivial program on a tracepoint this process fires, with and without kernel.bpf_stats_enabled (no lab, no tracer)")
		iterations = fs.Uint64("iterations", 1_000_000, "--run-cost: firings of the tracepoint per variant and round")
		countDur   = fs.Duration("count-duration", 2*time.Second, "length of each case in the count pass (BPF program runs per unit, with the kernel's run-time statistics on for that pass only)")
		countOnly  = fs.Bool("count-only", false, "run the count pass alone: BPF program runs per unit of every case, no timing (counts hold under emulation)")
		soak       = fs.Duration("soak", 0, "run the tracer through pod churn this long and sample what a leak would grow (no cost cases)")
		soakEvery  = fs.Duration("soak-every", 500*time.Millisecond, "--soak: a pod is deleted and one born this often")
	)
	_ = fs.MarkHidden("tracer-arg")
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return nil
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *memory {
		if *queries <= 0 {
			return usagef("--queries must be positive")
		}
		r := overhead.Memory(*queries, *maxQueries)
		if *jsonOut {
			return writeJSON(r)
		}
		overhead.WriteMemoryText(os.Stdout, r)
		return nil
	}
	if *runCost {
		return benchRunCost(*rounds, *iterations, *jsonOut)
	}
	if *soak != 0 {
		return benchSoak(ctx, *soak, *soakEvery, *attach, *jsonOut)
	}
	if *duration <= 0 || *rounds <= 0 || *sockets <= 0 {
		return usagef("--duration, --rounds and --sockets must be positive")
	}
	for _, r := range *rates {
		if r <= 0 {
			return usagef("--rate %d: want a positive rate", r)
		}
	}
	known := make([]string, len(overhead.Cases))
	for i, k := range overhead.Cases {
		known[i] = k.Name
	}
	for _, c := range *cases {
		if !slices.Contains(known, c) {
			return usagef("--case %q: unknown case (known: %s)", c, strings.Join(known, ", "))
		}
	}
	switch *attach {
	case "auto", "fentry", "kprobe", "tracepoint":
	default:
		return usagef("--attach %q: want auto, fentry, kprobe or tracepoint", *attach)
	}
	if err := requireRoot("dnsrace bench"); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary: %w", err)
	}
	cfg := overhead.Config{
		Exe: exe, Duration: *duration, Rounds: *rounds, Sockets: *sockets, Rates: *rates,
		Cases: *cases, SkipCost: *skipCost, SkipCapacity: *skipCap, RingBufferSize: *ring, Attach: *attach, TracerArgs: *tracerArgs, CountDuration: *countDur, CountOnly: *countOnly, SkipCount: *skipCount, Floor: *floor, Log: os.Stderr,
	}
	if *smoke {
		cfg.Duration, cfg.Rounds, cfg.Rates = 2*time.Second, 1, []int{2000}
		cfg.Cases = []string{"udp-forward", "dns-forward", "dns-loopback"}
	}
	res, err := overhead.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *jsonOut {
		if err := writeJSON(res); err != nil {
			return err
		}
	} else {
		overhead.WriteText(os.Stdout, res)
	}
	if *smoke {
		if p := overhead.Problems(res); len(p) > 0 {
			for _, s := range p {
				fmt.Fprintf(os.Stderr, "dnsrace bench: smoke: %s\n", s)
			}
			return exitCodeError{1}
		}
		fmt.Fprintln(os.Stderr, "dnsrace bench: smoke ok: no record lost in the floods or at 2000 queries/s, every flood's answers followed")
	}
	return nil
}

// benchSoak is bench --soak.
func benchSoak(ctx context.Context, d, every time.Duration, attach string, jsonOut bool) error {
	if d < time.Minute || every <= 0 {
		return usagef("--soak must be a minute or more (two namespace scans a sample), --soak-every positive")
	}
	if err := requireRoot("dnsrace bench --soak"); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary: %w", err)
	}
	res, err := overhead.Soak(ctx, overhead.SoakConfig{Exe: exe, Duration: d, Every: every,
		TraceArgs: []string{"--attach", attach}, Log: func(s string) { fmt.Fprintln(os.Stderr, s) }})
	if err != nil {
		return err
	}
	if jsonOut {
		if err := writeJSON(res); err != nil {
			return err
		}
	} else {
		overhead.WriteSoakText(os.Stdout, res)
	}
	if !res.Flat || len(res.Mismatch) > 0 {
		return exitCodeError{1}
	}
	return nil
}

// benchRunCost is bench --run-cost.
func benchRunCost(rounds int, iterations uint64, jsonOut bool) error {
	if rounds <= 0 || iterations == 0 {
		return usagef("--rounds and --iterations must be positive")
	}
	if err := requireRoot("dnsrace bench --run-cost"); err != nil {
		return err
	}
	m := runcost.ReadMachine()
	c, err := runcost.MeasureCall(int(min(iterations, 10_000_000)), rounds)
	if err != nil {
		return err
	}
	res, err := runcost.Measure(runcost.Config{Iterations: iterations, Rounds: rounds})
	if err != nil {
		return err
	}
	if jsonOut {
		return writeJSON(struct {
			Machine runcost.Machine  `json:"machine"`
			Call    runcost.Call     `json:"call"`
			Results []runcost.Result `json:"results"`
		}{m, c, res})
	}
	runcost.WriteText(os.Stdout, m, c, res)
	return nil
}

func writeJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
