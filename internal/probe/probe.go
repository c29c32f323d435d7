package probe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
	"github.com/dnsrace/dnsrace/internal/kconfig"
	"github.com/dnsrace/dnsrace/internal/preemption"
)

// DefaultRingBufferSize is the ring buffer size when Options leaves it 0:
// about 180,000 records of an answered query (a QUERY and an ANSWER record
// take about 190 bytes), half a second of the fastest flood this project's
// machines make.
const DefaultRingBufferSize = 32 << 20

// DefaultFlowEntries is the flow table's size: queries awaiting their
// answer, and the unanswered ones of the last FlowMaxAge. Preallocated:
// the flows and answers maps take about 136 and 168 bytes an entry of
// kernel memory (bpftool's memlock).
const DefaultFlowEntries = 32768

// MaxPorts is how many DNS ports Options.Ports may list.
const MaxPorts = 8

// Options configure Open.
type Options struct {
	// Ports are the DNS ports a query is first recognised by; empty means
	// 53. At most MaxPorts.
	Ports []uint16
	// NetNS keeps only events of the network namespace with this inode;
	// 0 keeps every namespace.
	NetNS uint32
	// Attach forces one tier: TierFentry or TierKprobe for the function
	// hooks (an error if one of them cannot use it), TierTracepoint for the
	// tracepoint tier alone. TierNone chooses the best tier per hook
	// (fentry, then kprobe) and falls back to the tracepoint tier when the
	// confirm or delivery hook cannot attach.
	Attach event.Tier
	// KernelBTF is a BTF file to use instead of /sys/kernel/btf/vmlinux
	// (for CO-RE and for choosing program variants), e.g. from btfhub.
	KernelBTF string
	// RingBufferSize in bytes: a power of two multiple of the page size;
	// 0 means DefaultRingBufferSize.
	RingBufferSize uint32
	// ProcRoot is where the host's /proc is ("" means /proc): the
	// kmem_cache_free hook of kernels before 6.1 needs nf_conntrack's text
	// range from /proc/modules.
	ProcRoot string
	// EmptyPrograms loads every program as "return 0" and attaches it at
	// its hook, choosing tiers and variants as usual: what the hooks alone
	// cost this kernel, before any work (dnsrace bench --floor). Nothing is
	// traced.
	EmptyPrograms bool
	// FlowEntries is how many flows (queries awaiting their answer) the
	// flow table holds; 0 is DefaultFlowEntries. Tests shrink it to fill
	// it.
	FlowEntries uint32
	// FlowMaxAge is how long a flow nobody answered stays in the table
	// after its last sight (the sweeper: sweep.go); 0 is
	// DefaultFlowMaxAge.
	FlowMaxAge time.Duration
	// KprobeMulti attaches the kprobe tier through kprobe.multi links
	// (fprobe, 5.18+, CONFIG_FPROBE) even where legacy kprobes work;
	// where they are compiled out (no CONFIG_KPROBES) kprobe.multi is
	// tried anyway.
	KprobeMulti bool
	// ReaderNice, when not 0, is the nice value of the thread Read drains
	// the ring buffer on (needs CAP_SYS_NICE; Read fails if it cannot be
	// set). The drain is locked to its thread and gives the nice value
	// back before it ends (NiceThread).
	ReaderNice int

	// sweepBySyscalls walks the flow table with map syscalls, as on
	// kernels without bpf_for_each_map_elem: tests run both ways.
	sweepBySyscalls bool
}

// sharedBTF, when set, holds the running kernel's BTF across Opens: the
// package's tests open dozens of tracers, and decoding vmlinux's BTF takes
// a second or more of an Open under emulation. Unset (dnsrace itself), each
// Open decodes it once and lets it go with the loader.
var sharedBTF *btf.Cache

// Mode is how the tracer learns what conntrack did.
type Mode int

const (
	// ModeFunction: the confirm and clash hooks (fentry or kprobe) report
	// verdicts; queries are first seen at udp_sendmsg and answers at
	// skb_consume_udp. No device hook runs.
	ModeFunction Mode = iota
	// ModeTracepoint: device tracepoints first see queries, watch entries
	// get confirmed (the maps of confirmed entries name winners) and see
	// answers reach the asking namespace; merged losers are seen by a
	// netfilter program just before confirm (6.4+, in the namespaces
	// watched: WatchNetNS) or, before 6.4, by their unconfirmed entry freed
	// (kmem_cache_free).
	ModeTracepoint
)

func (m Mode) String() string {
	if m == ModeFunction {
		return "function"
	}
	return "tracepoint"
}

// Tracer is a loaded and attached set of dnsrace programs.
type Tracer struct {
	mode   Mode
	probes []ProbeInfo
	colls  []*ebpf.Collection
	links  []link.Link
	maps   map[string]*ebpf.Map // every map, created once, shared
	rd     *ringbuf.Reader
	// The netfilter program (tracepoint tier, 6.4+) and its links, per
	// namespace (guarded by closeMu).
	nfProg  *ebpf.Program
	watched map[uint32]*watched

	readMu    sync.Mutex // one Read at a time; guards rec, ev and batches
	rec       ringbuf.Record
	ev        event.Event
	batches   []*batch // Read's, made by the first
	nice      int      // Options.ReaderNice
	sweeper   *sweeper
	malformed atomic.Uint64
	bytes     atomic.Uint64 // record bytes read

	// closeMu lets the counter readers (Stats, Missed, FlowsLive: the
	// progress line, /metrics, SIGUSR1) finish before Close releases the
	// fds they use, and see closed after; closed also makes Close
	// idempotent. Read never takes it.
	closeMu sync.RWMutex
	closed  bool
}

// Open loads and attaches the programs: first the function hooks (unless
// the tracepoint tier is forced), then the tracepoints the resulting mode
// needs. Probes reports what was chosen and why.
func Open(opts Options) (*Tracer, error) {
	switch opts.Attach {
	case event.TierNone, event.TierTracepoint, event.TierKprobe, event.TierFentry:
	default:
		return nil, fmt.Errorf("unknown attach tier %v", opts.Attach)
	}
	l, err := newLoader(opts)
	if err != nil {
		return nil, err
	}
	t := l.t
	ok := false
	defer func() {
		if !ok {
			t.Close()
		}
	}()

	t.mode = ModeTracepoint
	if opts.Attach != event.TierTracepoint {
		// The function hooks' programs are built for the function mode
		// (tracepoint_mode off: their flow lookups also try a key without the
		// source address, which an unconnected socket's send has not got);
		// they are released if the mode falls back.
		t.mode = ModeFunction
		fn := make([]attached, 0, len(functionHooks))
		for _, h := range functionHooks {
			a, err := l.function(h)
			if err != nil {
				return nil, err
			}
			fn = append(fn, a)
		}
		if need := neededForFunctionMode(fn); need == "" {
			for _, a := range fn {
				t.keep(a)
			}
		} else {
			t.mode = ModeTracepoint
			// Without the confirm or delivery hook the function tier
			// cannot tell what happened: everything goes through the
			// tracepoints, so nothing is seen twice.
			for _, a := range fn {
				a.release()
				if a.info.Attached {
					a.info.Attached = false
					a.info.Err = fmt.Errorf("attached, then released: %s did not attach, so the tracepoint tier traces everything", need)
				}
				t.probes = append(t.probes, a.info)
			}
		}
	} else {
		for _, h := range functionHooks {
			t.probes = append(t.probes, ProbeInfo{Hook: h.name, Err: ErrNoTracepoint})
		}
	}

	if t.mode == ModeTracepoint {
		l.netfilter()
	} else {
		t.probes = append(t.probes, ProbeInfo{Hook: HookNetfilter, Err: errNotNeeded})
	}
	for _, h := range tracepointHooks {
		if err := l.tracepoint(h); err != nil {
			return nil, err
		}
	}

	t.rd, err = ringbuf.NewReader(t.maps[bpf.DnsraceMapEvents])
	if err != nil {
		return nil, fmt.Errorf("opening the ring buffer reader: %w", err)
	}
	t.nice = opts.ReaderNice
	if t.sweeper, err = startSweeper(l.sweepProgram(), t.maps[bpf.DnsraceMapFlows], t.maps[bpf.DnsraceMapAnswers], l.cfg.Hz, opts.FlowMaxAge); err != nil {
		return nil, err
	}
	ok = true
	return t, nil
}

// neededForFunctionMode names the hook the function mode lacks, or "".
func neededForFunctionMode(fn []attached) string {
	for _, a := range fn {
		if !a.info.Attached && a.h.essential {
			return a.h.name
		}
	}
	return ""
}

// newLoader reads BTF and the BPF object and applies opts.
func newLoader(opts Options) (*loader, error) {
	ports := opts.Ports
	if len(ports) == 0 {
		ports = []uint16{53}
	}
	if len(ports) > MaxPorts {
		return nil, fmt.Errorf("%d DNS ports: at most %d", len(ports), MaxPorts)
	}
	if opts.RingBufferSize == 0 {
		opts.RingBufferSize = DefaultRingBufferSize
	}
	cache := sharedBTF
	if cache == nil {
		cache = btf.NewCache()
	}
	kspec, err := kernelSpec(opts.KernelBTF, cache)
	if err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("removing the memlock rlimit: %w", err)
	}
	spec, err := bpf.LoadDnsrace()
	if err != nil {
		return nil, fmt.Errorf("loading the embedded BPF object: %w", err)
	}
	spec.Maps[bpf.DnsraceMapEvents].MaxEntries = opts.RingBufferSize
	if opts.FlowEntries == 0 {
		opts.FlowEntries = DefaultFlowEntries
	}
	// answers holds the flows whose answers NAT rewrites: at most as many
	spec.Maps[bpf.DnsraceMapFlows].MaxEntries = opts.FlowEntries
	spec.Maps[bpf.DnsraceMapAnswers].MaxEntries = opts.FlowEntries
	if err := addLRURoom(spec); err != nil {
		return nil, err
	}
	cfg := bpf.DnsraceConfig{Netns: opts.NetNS, WakeupBytes: opts.RingBufferSize / 8}
	for i, p := range ports {
		if p == 0 {
			return nil, errors.New("DNS port 0")
		}
		cfg.Ports[i] = p
	}
	if cfg.Hz, err = tickRate(); err != nil {
		return nil, err
	}
	l := &loader{t: &Tracer{maps: map[string]*ebpf.Map{}}, spec: spec, kspec: kspec, opts: opts, cfg: cfg, cache: cache,
		preempt: detectPreemption()}
	if opts.KernelBTF != "" {
		l.progOpts.KernelTypes = kspec
		// An explicit kernel spec replaces module BTF too: add the
		// modules dnsrace reads types from when they are loaded.
		for _, mod := range []string{"nf_conntrack", "ipv6"} {
			if m, err := cache.Module(mod); err == nil {
				l.progOpts.ExtraRelocationTargets = append(l.progOpts.ExtraRelocationTargets, m)
			}
		}
	}
	return l, nil
}

// kernelSpec is the BTF the programs are relocated against: the file at
// path, or the running kernel's (decoded through cache, which the
// collections' loads then share).
func kernelSpec(path string, cache *btf.Cache) (*btf.Spec, error) {
	if path != "" {
		s, err := btf.LoadSpec(path)
		if err != nil {
			return nil, fmt.Errorf("reading --kernel-btf %s: %w", path, err)
		}
		return s, nil
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); errors.Is(err, fs.ErrNotExist) {
		return nil, errors.New("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): dnsrace needs CONFIG_DEBUG_INFO_BTF=y, or pass --kernel-btf FILE with this kernel's BTF")
	}
	s, err := cache.Kernel()
	if err != nil {
		return nil, fmt.Errorf("reading kernel BTF: %w", err)
	}
	return s, nil
}

// detectPreemption reads the running kernel's preemption model; tests
// replace it to load the programs a preempting kernel gets.
var detectPreemption = func() preemption.Model { return preemption.Detect(os.Open, kconfig.Release()) }

type loader struct {
	t        *Tracer
	spec     *ebpf.CollectionSpec
	kspec    *btf.Spec
	opts     Options
	cfg      bpf.DnsraceConfig
	progOpts ebpf.ProgramOptions
	cache    *btf.Cache // kernel BTF decoded once for every collection
	preempt  preemption.Model
}

// load creates a collection holding only progs. Every map they use is
// created once and shared with the other collections; the read-only
// variables (cfg, tracepoint_mode) are set per collection.
func (l *loader) load(progs ...string) (*ebpf.Collection, error) {
	return l.loadKprobeMulti(false, progs...)
}

// loadKprobeMulti is load, with kprobe programs made for kprobe.multi links
// when multi is set.
func (l *loader) loadKprobeMulti(multi bool, progs ...string) (*ebpf.Collection, error) {
	cs := l.spec.Copy()
	keep := map[string]bool{}
	maps := map[string]bool{}
	for _, p := range progs {
		ps, found := cs.Programs[p]
		if !found {
			return nil, fmt.Errorf("program %s missing from the BPF object", p)
		}
		keep[p] = true
		if multi && ps.Type == ebpf.Kprobe {
			ps.AttachType = ebpf.AttachTraceKprobeMulti
		}
		for _, ins := range ps.Instructions {
			if ins.IsLoadFromMap() {
				if r := ins.Reference(); r != "" {
					maps[r] = true
				}
			}
		}
		if l.opts.EmptyPrograms {
			// The maps are still created (the reader and the counters
			// open them). The first instruction keeps the function's
			// symbol and BTF, not its CO-RE relocation.
			// A netfilter program's 0 is NF_DROP: it accepts instead.
			ret := int32(0)
			if ps.Type == ebpf.Netfilter {
				ret = 1
			}
			first := asm.Mov.Imm(asm.R0, ret).WithSymbol(ps.Instructions[0].Symbol())
			if fn := btf.FuncMetadata(&ps.Instructions[0]); fn != nil {
				first = btf.WithFuncMetadata(first, fn)
			}
			ps.Instructions = asm.Instructions{first, asm.Return()}
		}
	}
	for name := range cs.Programs {
		if !keep[name] {
			delete(cs.Programs, name)
		}
	}
	if err := cs.Variables[bpf.DnsraceVarCfg].Set(l.cfg); err != nil {
		return nil, fmt.Errorf("setting the BPF config: %w", err)
	}
	if err := cs.Variables[bpf.DnsraceVarTracepointMode].Set(l.t.mode == ModeTracepoint); err != nil {
		return nil, fmt.Errorf("setting the BPF mode: %w", err)
	}
	// A task preempted inside confirm may return on another CPU: the
	// kprobe tier pairs confirm's entry and return per task there.
	if err := cs.Variables[bpf.DnsraceVarConfirmByTask].Set(l.preempt.Preempts); err != nil {
		return nil, fmt.Errorf("setting the BPF confirm pairing: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	for name := range cs.Maps {
		if strings.HasPrefix(name, ".") {
			continue // data sections: per collection, variables refer to them
		}
		if !maps[name] {
			delete(cs.Maps, name)
			continue
		}
		m, err := l.sharedMap(name)
		if err != nil {
			return nil, err
		}
		repl[name] = m
	}
	return ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{
		Programs:        l.progOpts,
		MapReplacements: repl,
		Cache:           l.cache,
	})
}

// sweepProgram loads the flow table's sweep program, or returns nil where
// the kernel cannot run it (bpf_for_each_map_elem is Linux 5.13+): the
// sweeper then walks the table with map syscalls. Empty programs fill
// nothing, and a tracer without both tables has nothing for it.
func (l *loader) sweepProgram() *ebpf.Program {
	if l.opts.sweepBySyscalls || l.opts.EmptyPrograms ||
		l.t.maps[bpf.DnsraceMapFlows] == nil || l.t.maps[bpf.DnsraceMapAnswers] == nil {
		return nil
	}
	coll, err := l.load(bpf.DnsraceProgSweepFlows)
	if err != nil {
		return nil
	}
	l.t.colls = append(l.t.colls, coll)
	return coll.Programs[bpf.DnsraceProgSweepFlows]
}

// sharedMap returns map name, creating it on first use.
func (l *loader) sharedMap(name string) (*ebpf.Map, error) {
	if m, ok := l.t.maps[name]; ok {
		return m, nil
	}
	m, err := ebpf.NewMap(l.spec.Maps[name])
	if err != nil {
		return nil, explain(fmt.Errorf("creating map %s: %w", name, err))
	}
	l.t.maps[name] = m
	return m, nil
}

// tracepoint loads and attaches the program of tracepoint hook h, if the
// tracer's mode uses it.
func (l *loader) tracepoint(h tpHook) error {
	info := ProbeInfo{Hook: h.name, Tier: event.TierTracepoint}
	if h.modes&(1<<l.t.mode) == 0 {
		info.Tier, info.Err = event.TierNone, errNotNeeded
		l.t.probes = append(l.t.probes, info)
		return nil
	}
	prog, err := h.variant(l)
	if err != nil {
		if h.required {
			return fmt.Errorf("choosing the %s program: %w", h.name, err)
		}
		info.Tier, info.Err = event.TierNone, err
		l.t.probes = append(l.t.probes, info)
		return nil
	}
	info.Program = prog
	coll, err := l.load(prog)
	if err != nil {
		err = explain(fmt.Errorf("loading %s (%s): %w", l.spec.Programs[prog].SectionName, prog, err))
		if h.required {
			return err
		}
		info.Err = err
		l.t.probes = append(l.t.probes, info)
		return nil
	}
	l.t.colls = append(l.t.colls, coll)
	var lk link.Link
	if ps := l.spec.Programs[prog]; ps.Type == ebpf.RawTracepoint {
		lk, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: ps.AttachTo, Program: coll.Programs[prog]})
	} else if ps.Type == ebpf.TracePoint {
		group, name, _ := strings.Cut(ps.AttachTo, "/")
		lk, err = link.Tracepoint(group, name, coll.Programs[prog], nil)
	} else {
		lk, err = link.AttachTracing(link.TracingOptions{Program: coll.Programs[prog], AttachType: ebpf.AttachTraceRawTp})
	}
	if err != nil {
		err = fmt.Errorf("attaching %s: %w", l.spec.Programs[prog].SectionName, err)
		if h.required {
			return err
		}
		info.Err = err
	} else {
		l.t.links = append(l.t.links, lk)
		info.Attached = true
	}
	l.t.probes = append(l.t.probes, info)
	return nil
}

// attached is a function hook's outcome before the mode is decided.
type attached struct {
	h     fnHook
	info  ProbeInfo
	links []link.Link
	coll  *ebpf.Collection
}

func (a *attached) release() {
	for _, lk := range a.links {
		lk.Close()
	}
	if a.coll != nil {
		a.coll.Close()
	}
	a.links, a.coll = nil, nil
}

// keep hands a's programs to the tracer.
func (t *Tracer) keep(a attached) {
	if a.coll != nil {
		t.colls = append(t.colls, a.coll)
	}
	t.links = append(t.links, a.links...)
	t.probes = append(t.probes, a.info)
}

// function attaches a function hook with the forced tier, or the first of
// fentry, kprobe that loads and attaches. A forced tier that cannot trace
// the hook is an error. A hook that runs in a task takes fentry only where
// the kernel does not preempt kernel code (preemptedError), or, chosen
// automatically, as the last resort, saying that it may skip runs.
func (l *loader) function(h fnHook) (attached, error) {
	a := attached{h: h, info: ProbeInfo{Hook: h.name}}
	tiers := []event.Tier{event.TierFentry, event.TierKprobe}
	if l.opts.Attach != event.TierNone {
		tiers = []event.Tier{l.opts.Attach}
	}
	preempted := h.inTask && l.preempt.Preempts
	var errs []error
	try := func(tier event.Tier) error {
		aps := h.fentry
		if tier == event.TierKprobe {
			aps = h.kprobe
		}
		links, coll, multi, err := l.tryTier(h, tier, aps)
		if err != nil {
			return err
		}
		a.links, a.coll = links, coll
		a.info.Tier, a.info.Attached, a.info.Program = tier, true, progNames(aps)
		if multi {
			a.info.Program += " (kprobe.multi)"
		}
		return nil
	}
	for _, tier := range tiers {
		var err error
		if tier == event.TierFentry && preempted {
			err = &preemptedError{l.preempt}
		} else if err = try(tier); err == nil {
			a.info.Err = errors.Join(errs...)
			return a, nil
		}
		if l.opts.Attach != event.TierNone {
			return a, &TierError{Hook: h.name, Tier: tier, Err: err}
		}
		errs = append(errs, fmt.Errorf("%s: %w", tier, err))
	}
	if preempted && l.opts.Attach == event.TierNone {
		if err := try(event.TierFentry); err != nil {
			errs = append(errs, fmt.Errorf("fentry, as the last resort: %w", err))
		} else {
			errs = append(errs, errors.New("fentry attached anyway: its runs in a preempted task may be skipped (recursion_misses)"))
		}
	}
	a.info.Err = errors.Join(errs...)
	return a, nil
}

// preemptedError is why a hook that runs in a task skips fentry: a fentry
// program runs with migration off but preemption on, and the trampoline
// counts it in a per-CPU recursion guard ("bpf: Add per-program recursion
// prevention mechanism", ca06f55b9002, 5.12). Preempted in a task, it
// keeps the guard, and every run of it on that CPU in the meantime, in any
// task or softirq, is skipped. kprobe programs run with preemption off.
type preemptedError struct{ model preemption.Model }

func (e *preemptedError) Error() string {
	return fmt.Sprintf("this kernel preempts kernel code (%s): a fentry program preempted in a task would make its other runs on that CPU skip until it resumes", e.model)
}

func progNames(aps []attachPoint) string {
	names := make([]string, len(aps))
	for i, ap := range aps {
		names[i] = ap.prog
	}
	return strings.Join(names, "+")
}

// tryTier probes, loads and attaches one tier of h; on error nothing stays
// loaded.
func (l *loader) tryTier(h fnHook, tier event.Tier, aps []attachPoint) (links []link.Link, coll *ebpf.Collection, multi bool, err error) {
	pt := ebpf.Kprobe
	if tier == event.TierFentry {
		pt = ebpf.Tracing
	}
	if err := features.HaveProgramType(pt); err != nil {
		if errors.Is(err, unix.EPERM) && os.Geteuid() == 0 {
			return nil, nil, false, fmt.Errorf("%s programs refused although running as root (lockdown or an LSM forbids them): %w", tier, err)
		}
		return nil, nil, false, fmt.Errorf("%s programs unsupported: %w", tier, err)
	}
	if tier == event.TierKprobe && (l.opts.KprobeMulti || !kprobesAvailable()) {
		if err := features.HaveBPFLinkKprobeMulti(); err != nil {
			why := "kprobe.multi links unsupported (Linux 5.18+ with CONFIG_FPROBE)"
			if !kprobesAvailable() {
				why = "kprobes unavailable (no kprobe PMU at /sys/bus/event_source/devices/kprobe, no kprobe_events in tracefs: the kernel was built without CONFIG_KPROBES), and " + why
			}
			return nil, nil, false, fmt.Errorf("%s: %w", why, err)
		}
		multi = true
	}
	fn, ferr := findFunc(l.kspec, l.cache, h.fn, h.module)
	if ferr != nil && tier == event.TierFentry {
		return nil, nil, false, ferr // fentry needs the BTF id; a kprobe only the symbol
	}
	if fn != nil && h.checkFn != nil {
		if proto, _ := fn.Type.(*btf.FuncProto); proto != nil {
			if err := h.checkFn(proto); err != nil {
				return nil, nil, false, err
			}
		}
	}
	links, coll, err = l.loadAttach(aps, multi)
	return links, coll, multi, err
}

// loadAttach loads aps' programs into one collection and attaches them all
// (kprobes through kprobe.multi links with multi), or leaves nothing
// behind.
func (l *loader) loadAttach(aps []attachPoint, multi bool) ([]link.Link, *ebpf.Collection, error) {
	names := make([]string, len(aps))
	for i, ap := range aps {
		names[i] = ap.prog
	}
	coll, err := l.loadKprobeMulti(multi, names...)
	if err != nil {
		return nil, nil, explain(fmt.Errorf("loading %s: %w", strings.Join(names, ", "), err))
	}
	var links []link.Link
	for _, ap := range aps {
		lk, err := attach(ap, coll.Programs[ap.prog], l.spec.Programs[ap.prog], multi)
		if err != nil {
			for _, lk := range links {
				lk.Close()
			}
			coll.Close()
			return nil, nil, fmt.Errorf("attaching %s: %w", l.spec.Programs[ap.prog].SectionName, explainAttach(l.spec.Programs[ap.prog].Type, err))
		}
		links = append(links, lk)
	}
	return links, coll, nil
}

// kprobesAvailable reports whether a kprobe can be created: through the
// perf kprobe PMU (4.17+), or through tracefs kprobe_events (which
// cilium/ebpf falls back to; it is only checked where tracefs is mounted).
func kprobesAvailable() bool {
	for _, p := range []string{
		"/sys/bus/event_source/devices/kprobe/type",
		"/sys/kernel/tracing/kprobe_events",
		"/sys/kernel/debug/tracing/kprobe_events",
	} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// explain adds what the user can do about common load failures.
func explain(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%w\nverifier log (tail):\n%-40v", err, ve)
	}
	if errors.Is(err, unix.EPERM) {
		if os.Geteuid() != 0 {
			return fmt.Errorf("%w: run as root, or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN", err)
		}
		return fmt.Errorf("%w: refused although running as root (kernel lockdown, an LSM or sysctl kernel.unprivileged_bpf_disabled policy forbids it)", err)
	}
	return err
}

// explainAttach says why a program of type typ may not attach.
func explainAttach(typ ebpf.ProgramType, err error) error {
	if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	switch typ {
	case ebpf.Tracing:
		// fentry needs ftrace direct calls (arm64 has them from 6.4).
		return fmt.Errorf("%w (no fentry trampolines on this kernel, e.g. arm64 before 6.4, or the function is not traceable)", err)
	case ebpf.Kprobe:
		return fmt.Errorf("%w (kernel without CONFIG_KPROBES, or the function is not traceable here)", err)
	}
	return err
}

// TierError is returned by Open when the forced tier (Options.Attach)
// cannot be used for a hook.
type TierError struct {
	Hook string
	Tier event.Tier
	Err  error
}

func (e *TierError) Error() string {
	return fmt.Sprintf("forced %s tier cannot trace hook %s: %v", e.Tier, e.Hook, e.Err)
}

func (e *TierError) Unwrap() error { return e.Err }

// Mode reports how the tracer learns what conntrack did.
func (t *Tracer) Mode() Mode { return t.mode }

// Probes reports, per hook, the tier and programs in use.
func (t *Tracer) Probes() []ProbeInfo {
	return append([]ProbeInfo(nil), t.probes...)
}

// Stats are the kernel side's own counts.
type Stats struct {
	// Lost: records the ring buffer had no room for.
	Lost uint64
	// FlowsNew: queries first seen; FlowsAnswered: flows ended by their
	// answer. The rest ended unanswered (a drop at their server, a resend
	// that took their place, swept), or are still in the table
	// (FlowsLive).
	FlowsNew, FlowsAnswered uint64
	// FlowsRefused: flows and answers entries a full table had no room
	// for (their queries untracked); FlowsSwept: entries the sweeper
	// removed once older than FlowMaxAge; FlowsEvicted: younger ones it
	// removed to make room.
	FlowsRefused, FlowsSwept, FlowsEvicted uint64
}

// Stats sums the kernel side's per-CPU counters (zero once closed).
func (t *Tracer) Stats() Stats {
	var s Stats
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	m := t.maps[bpf.DnsraceMapStats]
	if m == nil || t.closed {
		return s
	}
	if t.sweeper != nil {
		s.FlowsSwept, s.FlowsEvicted = t.sweeper.swept.Load(), t.sweeper.evicted.Load()
	}
	var per []uint64
	for _, c := range []struct {
		index uint32
		dst   *uint64
	}{
		{event.StatRingLost, &s.Lost},
		{event.StatFlowsNew, &s.FlowsNew},
		{event.StatFlowsAnswered, &s.FlowsAnswered},
		{event.StatFlowsRefused, &s.FlowsRefused},
	} {
		if m.Lookup(c.index, &per) != nil {
			continue
		}
		for _, n := range per {
			*c.dst += n
		}
	}
	return s
}

// Lost returns how many records the kernel side could not deliver because
// the ring buffer was full (the sum of the per-CPU counters).
func (t *Tracer) Lost() uint64 { return t.Stats().Lost }

// Missed returns, by program name, the runs the kernel skipped because a
// BPF program was already running on that CPU (the program's
// recursion_misses), and, for kprobes, those their link counts as missed
// (probeMissed): hook calls no record could come from. Every loaded
// program is there, from 0. The kernel counts them for fentry since 5.12, for
// tracepoints since 6.2 and for kprobes since 6.7; before that they stay
// 0. Reading is one bpf(2) call per program, whatever
// kernel.bpf_stats_enabled says. Nil once closed.
func (t *Tracer) Missed() (map[string]uint64, error) {
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	if t.closed {
		return nil, nil
	}
	out := map[string]uint64{}
	byID := map[ebpf.ProgramID]string{}
	for _, c := range t.colls {
		for name, p := range c.Programs {
			st, err := p.Stats()
			if err != nil {
				return nil, fmt.Errorf("reading the statistics of %s: %w", name, err)
			}
			out[name] += st.RecursionMisses
			if info, err := p.Info(); err == nil {
				if id, ok := info.ID(); ok {
					byID[id] = name
				}
			}
		}
	}
	for _, lk := range t.links {
		if n, id := probeMissed(lk); n > 0 && byID[id] != "" {
			out[byID[id]] += n
		}
	}
	return out, nil
}

// probeMissed is what a kprobe's own link counts as missed (6.7+): runs
// its program never saw because the kprobe was reentered, a kretprobe had
// no instance left for the call, or fprobe's recursion guard refused it.
// The program's recursion_misses do not include them. 0 for other links
// and older kernels.
func probeMissed(lk link.Link) (uint64, ebpf.ProgramID) {
	info, err := lk.Info()
	if err != nil {
		return 0, 0
	}
	if km := info.KprobeMulti(); km != nil {
		return km.Missed, info.Program
	}
	if pe := info.PerfEvent(); pe != nil {
		if kp := pe.Kprobe(); kp != nil {
			return kp.Missed, info.Program
		}
	}
	return 0, 0
}

// FlowsLive counts the flows in the kernel's map now: queries not yet
// answered and not yet evicted. It walks the map: call it rarely. Where
// the sweep program loaded, the walk is a run of it (map syscalls would
// make the kprobe and perf tracepoint programs skip, lib/sweep.h).
func (t *Tracer) FlowsLive() uint64 {
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	m := t.maps[bpf.DnsraceMapFlows]
	if m == nil || t.closed {
		return 0
	}
	if t.sweeper != nil {
		if n, ok := t.sweeper.flowsLive(); ok {
			return n
		}
	}
	var n uint64
	var k bpf.DnsraceFlowKey
	var v bpf.DnsraceFlow
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}

// Bytes returns how many bytes of records Read has read (the ring
// buffer's own 8-byte record headers not counted). Safe while Read runs.
func (t *Tracer) Bytes() uint64 { return t.bytes.Load() }

// Malformed returns how many records Read skipped because they did not
// decode (a kernel/user-space mismatch; should stay 0). Safe while Read
// runs.
func (t *Tracer) Malformed() uint64 { return t.malformed.Load() }

// Close detaches and unloads everything; a concurrent Read returns nil.
// Close is idempotent.
func (t *Tracer) Close() error {
	t.closeMu.Lock()
	defer t.closeMu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if t.sweeper != nil {
		t.sweeper.stop()
	}
	var errs []error
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
	}
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	for _, w := range t.watched {
		for _, l := range w.links {
			errs = append(errs, l.Close())
		}
	}
	t.watched = nil
	for _, c := range t.colls {
		c.Close()
	}
	for _, m := range t.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}
