package runcost

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Trigger is a way to fire a tracepoint n times and time it.
type Trigger struct {
	// Name and Tracepoint (the raw tracepoint the variants attach to).
	Name, Tracepoint string
	// What it does, for the report.
	What string
	// fire fires the tracepoint n times and returns the time that took.
	fire func(n uint64) (time.Duration, error)
	// setup, when set, prepares the trigger; its result undoes it.
	setup func() (fire func(n uint64) (time.Duration, error), undo func(), err error)
}

// Triggers: one kernel entry per run, and runs inside one kernel entry.
var Triggers = []Trigger{
	{
		Name: "syscall", Tracepoint: "task_rename",
		What: "task:task_rename, fired by a prctl(PR_SET_NAME) loop on one pinned thread: a kernel entry per run; the thread's CPU time",
		fire: prctlLoop,
	},
	{
		Name: "in-kernel", Tracepoint: "bpf_trace_printk",
		What:  "bpf_trace:bpf_trace_printk, fired by a driver program run with BPF_PROG_TEST_RUN repeat: the runs follow each other in one kernel entry; the kernel's time per repeat",
		setup: printkDriver,
	},
}

// Variant is one program attached to the trigger, or none.
type Variant struct {
	// Name says what one run does; What the same in words.
	Name, What string
	// Stats turns BPF_ENABLE_STATS on while the variant runs: every run
	// of every BPF program then also reads the clock twice.
	Stats bool
	// program builds the instructions; nil: nothing is attached.
	program func(m *maps) asm.Instructions
	// btf attaches a tp_btf (tracing) program instead of a raw_tp one.
	btf bool
}

// Variants are measured in this order within a round (the order rotates
// from round to round). Every variant but none and the empty ones counts
// its runs, so a run that did not happen is seen.
var Variants = []Variant{
	{Name: "none", What: "nothing attached"},
	{Name: "empty", What: "raw_tp program: return 0", program: empty},
	{Name: "empty-tp_btf", What: "tp_btf program: return 0", program: empty, btf: true},
	{Name: "empty-stats", What: "raw_tp return 0 with kernel.bpf_stats_enabled on", program: empty, Stats: true},
	{Name: "count", What: "count the run in a per-CPU array (an inlined lookup and an add)", program: count},
	{Name: "probe-read", What: "count, then bpf_probe_read_kernel of 48 bytes (an IPv6 and UDP header)", program: probeRead},
	{Name: "ktime", What: "count, then bpf_ktime_get_ns", program: ktime},
	{Name: "jiffies", What: "count, then bpf_jiffies64", program: jiffies},
	{Name: "hash-miss", What: "count, then a hash map lookup that misses (44-byte key, a flow's)", program: hashMiss},
}

// counts reports whether v's program counts its runs.
func (v Variant) counts() bool { return v.program != nil && !strings.HasPrefix(v.Name, "empty") }

// maps are the programs' maps.
type maps struct {
	counter *ebpf.Map // per-CPU array, one u64
	hash    *ebpf.Map // hash, 44-byte key, empty
}

func newMaps() (*maps, error) {
	c, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("creating the counter map: %w", err)
	}
	h, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 44, ValueSize: 8, MaxEntries: 1024})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("creating the hash map: %w", err)
	}
	return &maps{counter: c, hash: h}, nil
}

func (m *maps) Close() {
	m.counter.Close()
	m.hash.Close()
}

// runs sums the counter over CPUs.
func (m *maps) runs() (uint64, error) {
	var per []uint64
	if err := m.counter.Lookup(uint32(0), &per); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

func (m *maps) reset() error {
	return m.counter.Update(uint32(0), make([]uint64, ebpf.MustPossibleCPU()), ebpf.UpdateAny)
}

func ret0() asm.Instructions { return asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()} }

func empty(*maps) asm.Instructions { return ret0() }

func count(m *maps) asm.Instructions { return append(countInsns(m), asm.Return()) }

// countInsns adds one to the per-CPU counter, keeps ctx in R6 and leaves
// R0 = 0.
func countInsns(m *maps) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, m.counter.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "counted"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("counted"),
	}
}

// probeRead reads 48 bytes at the tracepoint's first argument (a task or
// a string, both kernel memory) to the stack, as a packet hook reads an
// IPv6 and UDP header.
func probeRead(m *maps) asm.Instructions {
	return append(countInsns(m),
		asm.LoadMem(asm.R3, asm.R6, 0, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -64),
		asm.Mov.Imm(asm.R2, 48),
		asm.FnProbeReadKernel.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

func ktime(m *maps) asm.Instructions {
	return append(countInsns(m), asm.FnKtimeGetNs.Call(), asm.Mov.Imm(asm.R0, 0), asm.Return())
}

func jiffies(m *maps) asm.Instructions {
	return append(countInsns(m), asm.FnJiffies64.Call(), asm.Mov.Imm(asm.R0, 0), asm.Return())
}

func hashMiss(m *maps) asm.Instructions {
	insns := countInsns(m)
	for off := int16(-48); off < -4; off += 4 {
		insns = append(insns, asm.StoreImm(asm.RFP, off, 0, asm.Word))
	}
	return append(insns,
		asm.LoadMapPtr(asm.R1, m.hash.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -48),
		asm.FnMapLookupElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// attached is a variant's program at a tracepoint.
type attached struct {
	prog  *ebpf.Program
	link  link.Link
	stats interface{ Close() error }
}

func (a *attached) Close() {
	if a.link != nil {
		a.link.Close()
	}
	if a.prog != nil {
		a.prog.Close()
	}
	if a.stats != nil {
		a.stats.Close()
	}
}

func attach(v Variant, tracepoint string, m *maps) (*attached, error) {
	a := &attached{}
	if v.Stats {
		s, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			return nil, fmt.Errorf("enabling BPF run-time statistics (Linux 5.8+): %w", err)
		}
		a.stats = s
	}
	if v.program == nil {
		return a, nil
	}
	spec := &ebpf.ProgramSpec{Name: "runcost", Type: ebpf.RawTracepoint, License: "GPL", Instructions: v.program(m)}
	if v.btf {
		spec.Type, spec.AttachType, spec.AttachTo = ebpf.Tracing, ebpf.AttachTraceRawTp, tracepoint
	}
	var err error
	if a.prog, err = ebpf.NewProgram(spec); err != nil {
		a.Close()
		return nil, fmt.Errorf("loading %s: %w", v.Name, err)
	}
	if v.btf {
		a.link, err = link.AttachTracing(link.TracingOptions{Program: a.prog})
	} else {
		a.link, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: tracepoint, Program: a.prog})
	}
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("attaching %s to %s: %w", v.Name, tracepoint, err)
	}
	return a, nil
}

// prctlLoop calls prctl(PR_SET_NAME) n times on a thread pinned to CPU 0
// and returns the thread's own CPU time for them (time the vCPU was taken
// away does not count). The thread's name is put back.
func prctlLoop(n uint64) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return 0, err
	}
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("pinning to CPU 0: %w", err)
	}
	defer unix.SchedSetaffinity(0, &old)
	var name [16]byte
	if err := unix.Prctl(unix.PR_GET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0); err != nil {
		return 0, err
	}
	defer unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
	tmp := [16]byte{'d', 'n', 's', 'r', 'a', 'c', 'e', '-', 'r', 'u', 'n'}
	p := uintptr(unsafe.Pointer(&tmp[0]))
	var t0, t1 unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t0); err != nil {
		return 0, err
	}
	for range n {
		if _, _, e := unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_NAME, p, 0, 0, 0, 0); e != 0 {
			return 0, fmt.Errorf("prctl(PR_SET_NAME): %w", e)
		}
	}
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t1); err != nil {
		return 0, err
	}
	return time.Duration(t1.Nano() - t0.Nano()), nil
}

// printkEvent is the ftrace event behind bpf_trace_printk: loading a
// program that calls it switches the event on, which would write every call
// to the trace buffer. The driver switches it off while it runs and puts it
// back as it was.
const printkEvent = "/sys/kernel/tracing/events/bpf_trace/bpf_trace_printk/enable"

// printkDriver loads a socket filter that calls bpf_trace_printk once; its
// BPF_PROG_TEST_RUN with repeat n fires bpf_trace:bpf_trace_printk n times
// inside one kernel entry, the way the kernel's trigger benchmarks keep
// their runs in the kernel.
func printkDriver() (func(n uint64) (time.Duration, error), func(), error) {
	before, readErr := os.ReadFile(printkEvent)
	drv, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: asm.Instructions{
		asm.StoreImm(asm.RFP, -8, 0x0a78, asm.Word), // "x\n\0"
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 3),
		asm.FnTracePrintk.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("loading the bpf_trace_printk driver: %w", err)
	}
	if readErr == nil {
		os.WriteFile(printkEvent, []byte("0"), 0)
	}
	undo := func() {
		drv.Close()
		if readErr == nil {
			os.WriteFile(printkEvent, before, 0)
		}
	}
	in := make([]byte, 64)
	fire := func(n uint64) (time.Duration, error) {
		_, per, err := drv.Benchmark(in, int(n), nil)
		if err != nil {
			return 0, fmt.Errorf("running the driver (BPF_PROG_TEST_RUN): %w", err)
		}
		return per * time.Duration(n), nil
	}
	return fire, undo, nil
}

// Config sets a measurement.
type Config struct {
	// Iterations of the trigger per variant and round (default 1,000,000).
	Iterations uint64
	// Rounds: every variant once per round, the order rotated (default 5).
	Rounds int
	// Triggers and Variants by name (default: all).
	Triggers, Variants []string
}

// Result is one variant under one trigger.
type Result struct {
	Trigger string `json:"trigger"`
	Variant string `json:"variant"`
	What    string `json:"what"`
	// NsPerFire is the median over rounds of the trigger's time per
	// firing; Rounds holds each round's.
	NsPerFire float64   `json:"ns_per_fire"`
	Rounds    []float64 `json:"rounds_ns_per_fire"`
	// NsPerRun is NsPerFire less that of "none": what one run of the
	// program adds to the trigger, dispatch included.
	NsPerRun float64 `json:"ns_per_run"`
	// Counted: runs the program counted itself, over every round (0 for
	// none and the empty ones). KernelRuns, KernelNsPerRun: the kernel's
	// run_cnt and run_time_ns per run (empty-stats).
	Counted        uint64  `json:"runs_counted,omitempty"`
	KernelRuns     uint64  `json:"kernel_run_cnt,omitempty"`
	KernelNsPerRun float64 `json:"kernel_ns_per_run,omitempty"`
	// Misses: runs the kernel skipped (a BPF program already running on
	// that CPU).
	Misses uint64 `json:"recursion_misses,omitempty"`
}

// ErrMissedRuns: a counting program ran fewer times than it was triggered.
var ErrMissedRuns = errors.New("the program did not run once per trigger")

func pick[T any](all []T, names []string, name func(T) string) ([]T, error) {
	if len(names) == 0 {
		return all, nil
	}
	var out []T
	for _, n := range names {
		i := slices.IndexFunc(all, func(x T) bool { return name(x) == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown name %q", n)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// Measure times every variant under every trigger, cfg.Rounds rounds each.
// It fails when a counting program ran fewer times than its trigger fired:
// the figures would not be per run.
func Measure(cfg Config) ([]Result, error) {
	if cfg.Iterations == 0 {
		cfg.Iterations = 1_000_000
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 5
	}
	trigs, err := pick(Triggers, cfg.Triggers, func(t Trigger) string { return t.Name })
	if err != nil {
		return nil, fmt.Errorf("trigger: %w", err)
	}
	vs, err := pick(Variants, cfg.Variants, func(v Variant) string { return v.Name })
	if err != nil {
		return nil, fmt.Errorf("variant: %w", err)
	}
	if vs[0].Name != "none" {
		vs = append([]Variant{Variants[0]}, slices.DeleteFunc(slices.Clone(vs), func(v Variant) bool { return v.Name == "none" })...)
	}
	m, err := newMaps()
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var all []Result
	for _, t := range trigs {
		res, err := measureTrigger(t, vs, m, cfg)
		if err != nil {
			return nil, fmt.Errorf("trigger %s: %w", t.Name, err)
		}
		all = append(all, res...)
	}
	return all, nil
}

func measureTrigger(t Trigger, vs []Variant, m *maps, cfg Config) ([]Result, error) {
	fire := t.fire
	if t.setup != nil {
		f, undo, err := t.setup()
		if err != nil {
			return nil, err
		}
		defer undo()
		fire = f
	}
	res := make([]Result, len(vs))
	for i, v := range vs {
		res[i] = Result{Trigger: t.Name, Variant: v.Name, What: v.What}
	}
	for round := range cfg.Rounds {
		for k := range vs {
			i := (k + round) % len(vs)
			if err := measureOnce(t.Tracepoint, fire, vs[i], m, cfg.Iterations, &res[i]); err != nil {
				return nil, err
			}
		}
	}
	for i := range res {
		res[i].NsPerFire = median(res[i].Rounds)
		res[i].NsPerRun = res[i].NsPerFire - res[0].NsPerFire
		if res[i].KernelRuns > 0 {
			res[i].KernelNsPerRun /= float64(res[i].KernelRuns)
		}
	}
	return res, nil
}

func measureOnce(tracepoint string, fire func(uint64) (time.Duration, error), v Variant, m *maps, n uint64, r *Result) error {
	if err := m.reset(); err != nil {
		return err
	}
	a, err := attach(v, tracepoint, m)
	if err != nil {
		return err
	}
	defer a.Close()
	var before *ebpf.ProgramStats
	if a.prog != nil {
		if before, err = a.prog.Stats(); err != nil {
			return err
		}
	}
	d, err := fire(n)
	if err != nil {
		return err
	}
	r.Rounds = append(r.Rounds, float64(d.Nanoseconds())/float64(n))
	if a.prog != nil {
		after, err := a.prog.Stats()
		if err != nil {
			return err
		}
		r.Misses += after.RecursionMisses - before.RecursionMisses
		if v.Stats {
			r.KernelRuns += after.RunCount - before.RunCount
			r.KernelNsPerRun += float64(after.Runtime - before.Runtime)
		}
	}
	if !v.counts() {
		return nil
	}
	c, err := m.runs()
	if err != nil {
		return err
	}
	r.Counted += c
	if c < n {
		return fmt.Errorf("%s: %d runs for %d firings of %s: %w", v.Name, c, n, tracepoint, ErrMissedRuns)
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Call is what an empty program costs run by BPF_PROG_TEST_RUN repeat, by
// how the kernel calls it: XDP programs directly (the BPF dispatcher
// patches a direct call in), socket filters through an indirect call,
// which the spectre_v2 mitigation (retpolines) makes dearer.
type Call struct {
	DirectNs   float64 `json:"direct_ns"`
	IndirectNs float64 `json:"indirect_ns"`
}

// MeasureCall measures Call over repeat runs each, the median of rounds.
func MeasureCall(repeat, rounds int) (Call, error) {
	var c Call
	for _, k := range []struct {
		typ ebpf.ProgramType
		out *float64
	}{{ebpf.XDP, &c.DirectNs}, {ebpf.SocketFilter, &c.IndirectNs}} {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: k.typ, License: "GPL", Instructions: ret0()})
		if err != nil {
			return c, fmt.Errorf("loading an empty %s program: %w", k.typ, err)
		}
		var per []float64
		for range rounds {
			_, d, err := p.Benchmark(make([]byte, 64), repeat, nil)
			if err != nil {
				p.Close()
				return c, fmt.Errorf("running an empty %s program: %w", k.typ, err)
			}
			per = append(per, float64(d.Nanoseconds()))
		}
		p.Close()
		*k.out = median(per)
	}
	return c, nil
}
