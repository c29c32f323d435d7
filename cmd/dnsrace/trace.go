package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/dnsrace/dnsrace/internal/correlate"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/metrics"
	"github.com/dnsrace/dnsrace/internal/pcapout"
	"github.com/dnsrace/dnsrace/internal/podinfo"
	"github.com/dnsrace/dnsrace/internal/probe"
	"github.com/dnsrace/dnsrace/internal/trace"
)

// This file is the dnsrace trace command: its flags, their checks, and the
// run that wires the tracer to its outputs.

func init() {
	commands["trace"] = command{summary: "explain every DNS stall on this node, packet by packet", run: runTrace}
}

const traceUsage = `Usage: dnsrace trace [flags]

Follow every DNS query on this node to its answer, drop or retry, and
explain each lookup that stalled: a headline (time, cause, stall, pod,
question) and details (the lost packets with the kernel's drop reason, the
A/AAAA sibling, the flow that won the race). Causes: insert_race
(same_tuple or reply_clash, with the winner), table_full, rule_drop,
reply_unmatched, rcvbuf_full, no_reply, local_drop; races the kernel
rescued (clash_resolved) are summed up per pod every 10 s.

eBPF in the kernel follows each query by its first sight (its send, or the
first device that carries it) and its conntrack entry afterwards, so NAT
rewriting ports does not lose it; only what needs explaining reaches user
space. Tiers: fentry, else kprobe (legacy, or kprobe.multi where legacy
kprobes are compiled out), for the conntrack confirm/clash, send and
delivery hooks; where neither attaches, tracepoints alone, with a
netfilter program just before confirm (Linux 6.4+) in the namespaces
that NAT.

At the end (--duration, Ctrl-C or SIGTERM) what was explained is
reconciled with the kernel's own per-CPU conntrack counters; SIGUSR1
prints that reconciliation so far (a "checkpoint") without stopping.

Examples:
  sudo dnsrace trace
  sudo dnsrace trace --duration 10m --json > stalls.jsonl
  sudo dnsrace trace --list-probes
  sudo dnsrace trace --attach tracepoint --netns /run/netns/dnsrace-node
  sudo dnsrace trace --port 53,5353   # clients that also query a server on 5353
  sudo dnsrace trace --kernel-btf /var/lib/btf/$(uname -r).btf
  sudo dnsrace trace --pcap stalls.pcapng --metrics-addr :9153
  sudo dnsrace trace --json --output-file /var/log/dnsrace.jsonl --output-max-size 100M
  dnsrace trace --proc-root /host/proc --root /host   # in kubectl debug node/NAME

Flags:
`

type traceFlags struct {
	attach       string
	listProbes   bool
	kernelBTF    string
	ports        []uint
	netns        string
	duration     time.Duration
	json         bool
	readyFile    string
	ringSize     uint32
	flowEntries  uint32
	procRoot     string
	root         string
	pods         bool
	pcap         string
	metrics      string
	podLabels    bool
	maxPods      int
	outFile      string
	outMax       byteSize
	progress     string
	showResolved bool
	cpuProfile   string
	emptyProgs   bool
	readerNice   int
}

func (f *traceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.attach, "attach", "auto", "attach tier: auto (fentry, else kprobe, else tracepoints alone), fentry, kprobe or tracepoint")
	fs.BoolVar(&f.listProbes, "list-probes", false, "print each hook's attach tier and why, then exit")
	fs.StringVar(&f.kernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	fs.UintSliceVar(&f.ports, "port", []uint{53}, "DNS ports a query is recognised by at first sight, comma separated (at most 8; filtered in the kernel; NAT may rewrite them later)")
	fs.StringVar(&f.netns, "netns", "", "trace only this network namespace (a path like /run/netns/NAME or /proc/PID/ns/net, or an inode number)")
	fs.DurationVar(&f.duration, "duration", 0, "stop after this long and print the summary (default: until Ctrl-C)")
	fs.BoolVar(&f.json, "json", false, "write JSON Lines: one object per incident, then a summary object")
	fs.StringVar(&f.readyFile, "ready-file", "", "write this file once every probe is attached (for scripts)")
	fs.Uint32Var(&f.ringSize, "ring-buffer-size", probe.DefaultRingBufferSize, "ring buffer size in bytes (a power of two multiple of the page size)")
	fs.Uint32Var(&f.flowEntries, "flow-entries", probe.DefaultFlowEntries, "queries the kernel's flow table holds awaiting their answer (unanswered ones leave it after 15 s; a full table leaves new queries untracked, counted in the summary)")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "where the host's /proc is (kubectl debug: /host/proc)")
	fs.StringVar(&f.root, "root", "/", "where the host's / is, for /var/log/pods, /var/log/containers and /sys/fs/cgroup (kubectl debug: /host)")
	fs.BoolVar(&f.pods, "pods", true, "name the pod, namespace and container of every incident (from cgroups and /var/log/pods; no API server)")
	fs.StringVar(&f.pcap, "pcap", "", "write each incident's packets to this pcapng file (reconstructed from traced headers, one comment per packet)")
	fs.StringVar(&f.metrics, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (e.g. :9153)")
	fs.BoolVar(&f.podLabels, "metrics-pod-labels", false, "add dnsrace_pod_incidents_total{namespace,pod,cause} (capped by --metrics-max-pods)")
	fs.IntVar(&f.maxPods, "metrics-max-pods", 200, "distinct pods labelled before the others count as pod=\"other\"")
	fs.StringVar(&f.outFile, "output-file", "", "write incidents and the summary to this file instead of stdout")
	fs.Var(&f.outMax, "output-max-size", "rotate --output-file once to FILE.1 when it would grow past this size (e.g. 100M; 0: no limit)")
	fs.StringVar(&f.progress, "progress", "auto", "progress line on stderr: auto (when stderr is a terminal), always or never")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the tracer to this file (for tuning)")
	_ = fs.MarkHidden("cpuprofile")
	fs.BoolVar(&f.emptyProgs, "empty-programs", false, "attach every hook with a program that returns at once and trace nothing: what the hooks alone cost (dnsrace bench --floor)")
	_ = fs.MarkHidden("empty-programs")
	fs.IntVar(&f.readerNice, "reader-nice", 0, "nice value (-20 to 19) of the two threads that drain and correlate the kernel's records; below 0 they keep up when a flood leaves more runnable threads than CPUs (needs CAP_SYS_NICE)")
	fs.BoolVar(&f.showResolved, "show-resolved", false, "list every race the kernel rescued (text output; by default they are summed up per pod every 10 s)")
}

// probeOptions checks the flags, and the files they name, and returns probe
// options. Kernel BTF is the loader's to check (probe.Open).
func (f *traceFlags) probeOptions() (probe.Options, error) {
	var o probe.Options
	if len(f.ports) == 0 || len(f.ports) > probe.MaxPorts {
		return o, usagef("--port: want 1 to %d ports", probe.MaxPorts)
	}
	for _, p := range f.ports {
		if p == 0 || p > 65535 {
			return o, usagef("--port %d: want 1-65535", p)
		}
		o.Ports = append(o.Ports, uint16(p))
	}
	if f.attach != "auto" {
		t, err := event.ParseTier(f.attach)
		if err != nil {
			return o, usageError{err}
		}
		o.Attach = t
	}
	if f.ringSize < 4096 || f.ringSize&(f.ringSize-1) != 0 {
		return o, usagef("--ring-buffer-size %d: want a power of two of at least 4096", f.ringSize)
	}
	o.RingBufferSize = f.ringSize
	if f.flowEntries < 1024 || f.flowEntries > 1<<22 {
		return o, usagef("--flow-entries %d: want 1024 to %d", f.flowEntries, 1<<22)
	}
	o.FlowEntries = f.flowEntries
	o.EmptyPrograms = f.emptyProgs
	if f.readerNice < -20 || f.readerNice > 19 {
		return o, usagef("--reader-nice %d: want -20 to 19", f.readerNice)
	}
	if f.duration < 0 {
		return o, usagef("--duration must not be negative")
	}
	if f.netns != "" {
		ino, err := netnsInode(f.netns)
		if err != nil {
			return o, usageError{err}
		}
		o.NetNS = ino
	}
	if f.kernelBTF != "" {
		if _, err := os.Stat(f.kernelBTF); err != nil {
			return o, usagef("--kernel-btf: %v", err)
		}
		o.KernelBTF = f.kernelBTF
	}
	return o, nil
}

// traceMemoryLimit is the soft heap limit of dnsrace trace.
const traceMemoryLimit = 128 << 20

func netnsInode(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat(s, &st); err != nil {
		return 0, fmt.Errorf("--netns %s: %w", s, err)
	}
	return uint32(st.Ino), nil
}

// checkConntrack fails clearly when nf_conntrack is not loaded: then no
// packet on the node is tracked and there is no insertion race to see.
func checkConntrack(procRoot string) error {
	p := filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("nf_conntrack is not loaded (%s missing): nothing on this node is connection-tracked, so there is no insertion race to trace; load it with 'modprobe nf_conntrack' to trace the other causes anyway", p)
	}
	return nil
}

func runTrace(ctx context.Context, args []string) error {
	var f traceFlags
	fs := pflag.NewFlagSet("trace", pflag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, args, traceUsage); err != nil {
		return err
	}
	opts, err := f.probeOptions()
	if err != nil {
		return err
	}
	if err := f.checkOutputFlags(); err != nil {
		return err
	}
	if err := requireRoot("dnsrace trace"); err != nil {
		return err
	}
	if err := checkConntrack(f.procRoot); err != nil {
		return err
	}
	// A soft heap limit keeps the correlator's memory near its caps on a
	// busy node: without it the GC lets the heap grow to twice what is
	// live. GOMEMLIMIT, when set, wins.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(traceMemoryLimit)
	}
	if w := hostViewWarning(f.procRoot, f.root, "/host/proc"); w != "" {
		fmt.Fprintln(os.Stderr, "warning: "+w)
	}

	// Output errors (a full disk, a closed pipe) must not pass silently:
	// the first is reported on one line and the summary goes to stderr.
	output := &outputWriter{w: os.Stdout, name: "stdout", report: os.Stderr}
	if f.outFile != "" {
		rf, err := openRotating(f.outFile, int64(f.outMax))
		if err != nil {
			return err
		}
		defer rf.Close()
		output.w, output.name = rf, f.outFile
	}
	var out io.Writer = output
	var prog *progress
	if f.progress == "always" || (f.progress == "auto" && isTerminal(os.Stderr)) {
		prog = &progress{w: os.Stderr, started: time.Now()}
		if f.outFile == "" {
			// Incidents on the same terminal: clear the progress line first.
			out = prog.clearing(out)
		}
	}

	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}
	var sess atomic.Pointer[trace.Session]
	var m *metrics.Metrics
	if f.metrics != "" {
		m = metrics.New(metrics.Config{PodLabels: f.podLabels, MaxPods: f.maxPods}, trace.MetricsSource(&sess))

		srv, err := metrics.Serve(f.metrics, m)
		if err != nil {
			return usageError{err}
		}
		defer srv.Close()
	}
	var pw *pcapout.Writer
	if f.pcap != "" {
		if pw, err = pcapout.Create(f.pcap); err != nil {
			return err
		}
		defer func() {
			if err := pw.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "dnsrace trace: "+err.Error())
			}
		}()
	}
	topts := trace.Options{Probe: opts, Out: out, JSON: f.json, ReadyFile: f.readyFile, ProcRoot: f.procRoot, ShowResolved: f.showResolved, ReaderNice: f.readerNice}
	if f.pods && !f.listProbes {
		topts.Pods = podinfo.New(podinfo.Config{ProcRoot: f.procRoot, Root: f.root})
	}
	// A failed pcap write is reported and counted, and the next incident
	// is tried again: one odd incident must not end the capture.
	var pcapErrors atomic.Uint64
	topts.OnIncident = func(inc *correlate.Incident) {
		if m != nil {
			m.Observe(inc)
		}
		if pw != nil {
			if err := pw.WriteIncident(inc); err != nil {
				pcapErrors.Add(1)
				fmt.Fprintf(os.Stderr, "dnsrace trace: pcap: incident %d not written: %v\n", inc.ID, err)
			}
		}
	}
	s, err := trace.Start(topts)
	if err != nil {
		return fmt.Errorf("starting the tracer: %w", err)
	}
	sess.Store(s)
	if f.listProbes {
		printProbes(s.Probes())
		s.Stop()
		return nil
	}
	if !f.json {
		fmt.Fprintln(os.Stderr, tracingLine(s.Probes(), f.ports, opts.NetNS))
	}
	if f.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.duration)
		defer cancel()
	}
	// SIGUSR1: the reconciliation so far, without stopping.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	go func() {
		for range usr1 {
			s.Checkpoint(func(cp *trace.Summary) {
				cp.PcapErrors = pcapErrors.Load()
				trace.WriteSummary(out, cp, f.json)
			})
		}
	}()
	if prog != nil {
		prog.run(ctx, s)
	} else {
		<-ctx.Done()
	}
	sum := s.Stop()
	sum.PcapErrors = pcapErrors.Load()
	if output.Err() == nil {
		trace.WriteSummary(out, sum, f.json)
	}
	if output.Err() != nil {
		trace.WriteSummary(os.Stderr, sum, f.json)
		return exitCodeError{1} // the error itself is already on stderr
	}
	return nil
}

// checkOutputFlags validates the output, progress and metrics flags.
func (f *traceFlags) checkOutputFlags() error {
	switch f.progress {
	case "auto", "always", "never":
	default:
		return usagef("--progress %q: want auto, always or never", f.progress)
	}
	if f.outMax > 0 && f.outFile == "" {
		return usagef("--output-max-size needs --output-file")
	}
	if f.outMax > 0 && f.outMax < 4096 {
		return usagef("--output-max-size %d: want at least 4096 bytes", f.outMax)
	}
	if f.maxPods < 1 {
		return usagef("--metrics-max-pods must be at least 1")
	}
	if f.podLabels && f.metrics == "" {
		return usagef("--metrics-pod-labels needs --metrics-addr")
	}
	if f.pcap != "" && f.pcap == f.outFile {
		return usagef("--pcap and --output-file are the same file")
	}
	return nil
}

// hostViewWarning says when --proc-root was left at /proc although this
// process does not see the host's processes there: the host's /proc is
// mounted at hostProc (/host/proc: kubectl debug, a DaemonSet) and its pid
// 1 is in another PID namespace than this process (a container without
// hostPID). Then pods' processes, and so their namespaces, counters and pod
// names, are invisible under /proc. kubectl debug node/NAME pods share the
// host's PID namespace, so there nothing is said.
func hostViewWarning(procRoot, root, hostProc string) string {
	if procRoot != "/proc" {
		return ""
	}
	host, ok1 := nsInode(filepath.Join(hostProc, "1/ns/pid"))
	mine, ok2 := nsInode("/proc/self/ns/pid")
	if !ok1 || !ok2 || host == mine {
		return ""
	}
	w := fmt.Sprintf("this process is in a PID namespace of its own and %s is the host's: pass --proc-root %s", hostProc, hostProc)
	if root == "/" {
		w += " --root " + filepath.Dir(hostProc)
	}
	return w + " (else pods' processes, namespaces and names are not found)"
}

func nsInode(path string) (uint64, bool) {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0, false
	}
	return st.Ino, true
}

// printProbes lists each hook's tier, and why a better tier was not used.
func printProbes(ps []probe.ProbeInfo) {
	fmt.Printf("%-24s %-10s %-8s %s\n", "HOOK", "TIER", "ATTACHED", "PROGRAM")
	for _, p := range ps {
		fmt.Printf("%-24s %-10s %-8v %s\n", p.Hook, p.Tier, p.Attached, p.Program)
		if p.Err != nil {
			for _, line := range strings.Split(p.Err.Error(), "\n") {
				fmt.Printf("    %s\n", line)
			}
		}
	}
}
