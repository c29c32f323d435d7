package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
)

// DefaultRingBufferSize is the ring buffer size when Options leaves it 0.
// 32 MiB holds about half a second of events at 25,000 DNS queries/s (10
// events a query): the reader loses the CPUs in bursts to the traffic it
// traces, and with 4 MiB (70 ms) it lost events above 10,000 queries/s
// (docs/performance.md).
const DefaultRingBufferSize = 32 << 20

// Options configure Open.
type Options struct {
	// Port is the DNS port filtered on in the kernel; 0 means 53.
	Port uint16
	// NetNS keeps only events of the network namespace with this inode;
	// 0 keeps every namespace.
	NetNS uint32
	// Attach forces one tier for every hook: TierFentry or TierKprobe for
	// the confirm, clash and send hooks (an error if one of them cannot use
	// it), TierTracepoint to attach only the tracepoints. TierNone chooses
	// the best tier per hook (fentry, then kprobe).
	Attach event.Tier
	// KernelBTF is a BTF file to use instead of /sys/kernel/btf/vmlinux
	// (for CO-RE and for choosing program variants), e.g. from btfhub.
	KernelBTF string
	// RingBufferSize in bytes: a power of two multiple of the page size;
	// 0 means DefaultRingBufferSize.
	RingBufferSize uint32
}

// Tracer is a loaded and attached set of dnsrace programs.
type Tracer struct {
	probes []ProbeInfo
	colls  []*ebpf.Collection
	links  []link.Link
	events *ebpf.Map
	lost   *ebpf.Map
	cachep *ebpf.Map
	rd     *ringbuf.Reader

	readMu    sync.Mutex // one Read at a time; guards rec and ev
	rec       ringbuf.Record
	ev        event.Event
	malformed atomic.Uint64

	closeOnce sync.Once
}

// shared maps: created once, handed to every per-hook collection.
var sharedMaps = []string{bpf.DnsraceMapEvents, bpf.DnsraceMapLost, bpf.DnsraceMapCtCachep}

// Open loads and attaches the programs. The tracepoint hooks are always
// attached (a failure there is an error); the confirm, clash and send hooks
// use the tier opts.Attach forces, or else the best that loads and attaches
// here. Probes reports what was chosen and why.
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

	for _, h := range hooks {
		var err error
		if h.tp != nil {
			err = l.tracepoint(h)
		} else {
			err = l.function(h)
		}
		if err != nil {
			return nil, err
		}
	}

	t.rd, err = ringbuf.NewReader(t.events)
	if err != nil {
		return nil, fmt.Errorf("opening the ring buffer reader: %w", err)
	}
	ok = true
	return t, nil
}

// newLoader reads BTF and the BPF object, applies opts and creates the
// shared maps. On error nothing stays open; on success l.t owns the maps.
func newLoader(opts Options) (*loader, error) {
	if opts.Port == 0 {
		opts.Port = 53
	}
	if opts.RingBufferSize == 0 {
		opts.RingBufferSize = DefaultRingBufferSize
	}
	kspec, err := kernelSpec(opts.KernelBTF)
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
	cfg := bpf.DnsraceConfig{Port: opts.Port, Netns: opts.NetNS}
	if err := spec.Variables[bpf.DnsraceVarCfg].Set(cfg); err != nil {
		return nil, fmt.Errorf("setting the BPF config: %w", err)
	}

	t := &Tracer{}

	repl := map[string]*ebpf.Map{}
	for _, name := range sharedMaps {
		m, err := ebpf.NewMap(spec.Maps[name])
		if err != nil {
			for _, m := range repl {
				m.Close()
			}
			return nil, explain(fmt.Errorf("creating map %s: %w", name, err))
		}
		repl[name] = m
	}
	t.events, t.lost, t.cachep = repl[bpf.DnsraceMapEvents], repl[bpf.DnsraceMapLost], repl[bpf.DnsraceMapCtCachep]

	l := &loader{t: t, spec: spec, kspec: kspec, opts: opts, repl: repl, cache: btf.NewCache()}
	if opts.KernelBTF != "" {
		l.progOpts.KernelTypes = kspec
		// An explicit kernel spec replaces module BTF too: add the
		// modules dnsrace reads types from when they are loaded.
		for _, mod := range []string{"nf_conntrack", "ipv6"} {
			if m, err := btf.LoadKernelModuleSpec(mod); err == nil {
				l.progOpts.ExtraRelocationTargets = append(l.progOpts.ExtraRelocationTargets, m)
			}
		}
	}

	return l, nil
}

func kernelSpec(path string) (*btf.Spec, error) {
	if path != "" {
		s, err := btf.LoadSpec(path)
		if err != nil {
			return nil, fmt.Errorf("reading --kernel-btf %s: %w", path, err)
		}
		return s, nil
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return nil, fmt.Errorf("this kernel exposes no BTF (/sys/kernel/btf/vmlinux: %w): dnsrace needs CONFIG_DEBUG_INFO_BTF=y, or a BTF file for this kernel passed with --kernel-btf", err)
	}
	s, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("reading kernel BTF: %w", err)
	}
	return s, nil
}

type loader struct {
	t        *Tracer
	spec     *ebpf.CollectionSpec
	kspec    *btf.Spec
	opts     Options
	repl     map[string]*ebpf.Map
	progOpts ebpf.ProgramOptions
	cache    *btf.Cache // kernel BTF decoded once for every collection
}

// load creates a collection holding only progs (and the maps they use,
// with the shared ones replaced).
func (l *loader) load(progs ...string) (*ebpf.Collection, error) {
	cs := l.spec.Copy()
	keep := map[string]bool{}
	for name := range cs.Programs {
		keep[name] = false
	}
	maps := map[string]bool{}
	for _, p := range progs {
		ps, found := cs.Programs[p]
		if !found {
			return nil, fmt.Errorf("program %s missing from the BPF object", p)
		}
		keep[p] = true
		for _, ins := range ps.Instructions {
			if ins.IsLoadFromMap() {
				if r := ins.Reference(); r != "" {
					maps[r] = true
				}
			}
		}
	}
	for name, k := range keep {
		if !k {
			delete(cs.Programs, name)
		}
	}
	for name := range cs.Maps {
		// data sections (.rodata, .bss) stay: variables refer to them
		if !maps[name] && !strings.HasPrefix(name, ".") {
			delete(cs.Maps, name)
		}
	}
	repl := map[string]*ebpf.Map{}
	for name, m := range l.repl {
		if maps[name] {
			repl[name] = m
		}
	}
	return ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{
		Programs:        l.progOpts,
		MapReplacements: repl,
		Cache:           l.cache,
	})
}

// tracepoint loads and attaches the tp_btf program of h.
func (l *loader) tracepoint(h hookDef) error {
	info := ProbeInfo{Hook: h.name, Tier: event.TierTracepoint}
	prog, err := h.tp(l.kspec)
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

// function attaches a confirm/clash/send hook with the forced tier, or the
// first of fentry, kprobe that loads and attaches.
func (l *loader) function(h hookDef) error {
	info := ProbeInfo{Hook: h.name}
	var tiers []event.Tier
	switch l.opts.Attach {
	case event.TierTracepoint:
		info.Err = ErrNoTracepoint
		l.t.probes = append(l.t.probes, info)
		return nil
	case event.TierNone:
		tiers = []event.Tier{event.TierFentry, event.TierKprobe}
	default:
		tiers = []event.Tier{l.opts.Attach}
	}

	var errs []error
	for _, tier := range tiers {
		aps := h.fentry
		if tier == event.TierKprobe {
			aps = h.kprobe
		}
		links, coll, err := l.tryTier(h, tier, aps)
		if err != nil {
			if l.opts.Attach != event.TierNone {
				return &TierError{Hook: h.name, Tier: tier, Err: err}
			}
			errs = append(errs, fmt.Errorf("%s: %w", tier, err))
			continue
		}
		l.t.colls = append(l.t.colls, coll)
		l.t.links = append(l.t.links, links...)
		info.Tier, info.Attached, info.Program = tier, true, progNames(aps)
		info.Err = errors.Join(errs...)
		l.t.probes = append(l.t.probes, info)
		return nil
	}
	info.Err = errors.Join(errs...)
	l.t.probes = append(l.t.probes, info)
	return nil
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
func (l *loader) tryTier(h hookDef, tier event.Tier, aps []attachPoint) ([]link.Link, *ebpf.Collection, error) {
	pt := ebpf.Kprobe
	if tier == event.TierFentry {
		pt = ebpf.Tracing
	}
	if err := features.HaveProgramType(pt); err != nil {
		if errors.Is(err, unix.EPERM) && os.Geteuid() == 0 {
			return nil, nil, fmt.Errorf("%s programs refused although running as root (lockdown or an LSM forbids them): %w", tier, err)
		}
		return nil, nil, fmt.Errorf("%s programs unsupported: %w", tier, err)
	}
	if tier == event.TierKprobe && !kprobesAvailable() {
		return nil, nil, errors.New("kprobes unavailable: no kprobe PMU (/sys/bus/event_source/devices/kprobe) and no kprobe_events in tracefs; the kernel was built without CONFIG_KPROBES")
	}
	fn, err := findFunc(l.kspec, h.fn, h.module)
	if err != nil && tier == event.TierFentry {
		return nil, nil, err // fentry needs the BTF id; a kprobe only the symbol
	}
	if fn != nil && h.checkFn != nil {
		proto, _ := fn.Type.(*btf.FuncProto)
		if proto != nil {
			if err := h.checkFn(proto); err != nil {
				return nil, nil, err
			}
		}
	}

	return l.loadAttach(aps)
}

// loadAttach loads aps' programs into one collection and attaches them all,
// or leaves nothing behind.
func (l *loader) loadAttach(aps []attachPoint) ([]link.Link, *ebpf.Collection, error) {
	names := make([]string, len(aps))
	for i, ap := range aps {
		names[i] = ap.prog
	}
	coll, err := l.load(names...)
	if err != nil {
		return nil, nil, explain(fmt.Errorf("loading %s: %w", strings.Join(names, ", "), err))
	}
	var links []link.Link
	for _, ap := range aps {
		lk, err := attach(ap, coll.Programs[ap.prog], l.spec.Programs[ap.prog])
		if err != nil {
			for _, lk := range links {
				lk.Close()
			}
			coll.Close()
			return nil, nil, fmt.Errorf("attaching %s: %w", l.spec.Programs[ap.prog].SectionName, explainAttach(err))
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

func explainAttach(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EOPNOTSUPP):
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

// Probes reports, per hook, the tier and programs in use.
func (t *Tracer) Probes() []ProbeInfo {
	return append([]ProbeInfo(nil), t.probes...)
}

// IdleEvery is how often Read calls its idle function while the ring
// buffer is empty.
const IdleEvery = 100 * time.Millisecond

// Read calls fn for each event until ctx is done or the Tracer is closed,
// then returns nil. fn gets the same *event.Event every time: it must copy
// what it keeps. Read does not allocate per event. Records that do not
// decode are counted (Malformed) and skipped. idle, if not nil, is called
// from the same goroutine whenever the ring buffer has been empty for
// IdleEvery, so a caller can keep all its state on the reading goroutine
// and never share a lock with it.
func (t *Tracer) Read(ctx context.Context, fn func(*event.Event), idle func()) error {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	if t.rd == nil {
		return errors.New("tracer is closed")
	}
	// ctx done: Flush wakes a blocked ReadInto, which returns the records
	// still in the ring and then ErrFlushed.
	stop := context.AfterFunc(ctx, func() { t.rd.Flush() })
	defer stop()
	// The deadline is only ever set here, between reads, so SetDeadline
	// (which takes the reader's lock) never waits for a blocked read.
	t.rd.SetDeadline(time.Now().Add(IdleEvery))
	for {
		if err := t.rd.ReadInto(&t.rec); err != nil {
			switch {
			case errors.Is(err, ringbuf.ErrClosed):
				return nil
			case errors.Is(err, ringbuf.ErrFlushed):
				if ctx.Err() != nil {
					return nil
				}
				continue
			case errors.Is(err, os.ErrDeadlineExceeded):
				if idle != nil {
					idle()
				}
				t.rd.SetDeadline(time.Now().Add(IdleEvery))
				continue
			}
			return fmt.Errorf("reading the ring buffer: %w", err)
		}
		if err := event.Decode(t.rec.RawSample, &t.ev); err != nil {
			t.malformed.Add(1)
			continue
		}
		fn(&t.ev)
	}
}

// Lost returns how many events the kernel side dropped because the ring
// buffer was full (the sum of the per-CPU counters).
func (t *Tracer) Lost() uint64 {
	var per []uint64
	if t.lost == nil || t.lost.Lookup(uint32(0), &per) != nil {
		return 0
	}
	var sum uint64
	for _, n := range per {
		sum += n
	}
	return sum
}

// Malformed returns how many records Read skipped because they did not
// decode (a kernel/user-space mismatch; should stay 0). Safe while Read
// runs.
func (t *Tracer) Malformed() uint64 { return t.malformed.Load() }

// Close detaches and unloads everything; a concurrent Read returns nil.
// Close is idempotent.
func (t *Tracer) Close() error {
	var errs []error
	t.closeOnce.Do(func() {
		if t.rd != nil {
			errs = append(errs, t.rd.Close())
		}
		for _, l := range t.links {
			errs = append(errs, l.Close())
		}
		for _, c := range t.colls {
			c.Close()
		}
		for _, m := range []*ebpf.Map{t.events, t.lost, t.cachep} {
			if m != nil {
				errs = append(errs, m.Close())
			}
		}
	})
	return errors.Join(errs...)
}
