package probe

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/dnsrace/dnsrace/internal/bpf"
	"github.com/dnsrace/dnsrace/internal/event"
)

// ErrNoTracepoint is the Err of a function hook (confirm, clash, deliver,
// send) when the tracepoint tier was forced: those hooks have no tracepoint
// and need fentry or kprobe.
var ErrNoTracepoint = errors.New("no tracepoint for this hook: needs the fentry or kprobe tier")

// ProbeInfo says how one hook is traced.
type ProbeInfo struct {
	Hook     string     // e.g. "kfree_skb", "nf_conntrack_confirm"
	Tier     event.Tier // tier of the loaded programs; TierNone if none
	Program  string     // BPF program name(s), "+"-joined for entry/exit pairs
	Attached bool
	// Err says why the hook is not attached, or why a better tier was
	// skipped when it is attached with a lesser one. Nil when the best tier
	// attached.
	Err error
}

func (p ProbeInfo) String() string {
	s := fmt.Sprintf("%-24s %-10s %-50s attached=%v", p.Hook, p.Tier, p.Program, p.Attached)
	if p.Err != nil {
		s += " (" + p.Err.Error() + ")"
	}
	return s
}

// errNotNeeded is the Err of a tracepoint hook the function mode does not
// attach: the confirm, clash and delivery hooks say directly what it would
// infer.
var errNotNeeded = errors.New("not needed: the fentry/kprobe confirm, clash and delivery hooks report this directly")

// errNotNeededNF is the Err of kmem_cache_free where the netfilter program
// loaded: it sees merged losers without a program on every slab free.
var errNotNeededNF = errors.New("not needed: the netfilter program just before confirm sees merged clash losers (Linux 6.4+)")

// attachPoint is one program of a hook and how to attach it.
type attachPoint struct {
	prog   string
	kind   int // attachTracing, attachKprobe, attachKretprobe
	symbol string
}

const (
	attachTracing = iota
	attachKprobe
	attachKretprobe
)

// fnHook is a kernel function hook: fentry/fexit programs, or the kprobe
// equivalents.
type fnHook struct {
	name    string
	fn      string // kernel function, for the BTF lookup
	module  string // kernel module that may hold fn
	checkFn func(proto *btf.FuncProto) error
	fentry  []attachPoint
	kprobe  []attachPoint
	// essential: without it the function mode cannot work, and the
	// tracer falls back to the tracepoint tier.
	essential bool
	// inTask: fn runs in a task, preemptible: a socket's send or read, or
	// confirm at a local socket's POSTROUTING (nf_ct_resolve_clash runs
	// inside confirm's bottom-half-off section). On a kernel that preempts
	// kernel code its fentry program gets preempted there, and the
	// program's other runs on that CPU are skipped until it resumes
	// (preemptedError); kprobe programs run with preemption off.
	inTask bool
}

// tpHook is a tracepoint hook. modes says which tracer modes attach it
// (bit 1<<Mode).
type tpHook struct {
	name     string
	required bool // Open fails without it (in the modes that use it)
	modes    int
	// variant returns the program for this kernel, or why none
	variant func(l *loader) (string, error)
}

const (
	inFunctionMode   = 1 << ModeFunction
	inTracepointMode = 1 << ModeTracepoint
)

func fixedTP(prog string) func(*loader) (string, error) {
	return func(*loader) (string, error) { return prog, nil }
}

// functionHooks, in the order they are attached.
var functionHooks = []fnHook{
	{
		name: "nf_conntrack_confirm", fn: "__nf_conntrack_confirm", module: "nf_conntrack", essential: true, inTask: true,
		fentry: []attachPoint{
			{prog: bpf.DnsraceProgFeNfConntrackConfirm, kind: attachTracing},
			{prog: bpf.DnsraceProgFxNfConntrackConfirm, kind: attachTracing},
		},
		kprobe: []attachPoint{
			{prog: bpf.DnsraceProgKpNfConntrackConfirm, kind: attachKprobe, symbol: "__nf_conntrack_confirm"},
			{prog: bpf.DnsraceProgKrpNfConntrackConfirm, kind: attachKretprobe, symbol: "__nf_conntrack_confirm"},
		},
	},
	{
		name: "nf_ct_resolve_clash", fn: "nf_ct_resolve_clash", module: "nf_conntrack",
		checkFn: checkResolveClash,
		fentry:  []attachPoint{{prog: bpf.DnsraceProgFeNfCtResolveClash, kind: attachTracing}},
		kprobe:  []attachPoint{{prog: bpf.DnsraceProgKpNfCtResolveClash, kind: attachKprobe, symbol: "nf_ct_resolve_clash"}},
	},
	{
		// Answers reaching the asking socket.
		name: "skb_consume_udp", fn: "skb_consume_udp", essential: true, inTask: true,
		fentry: []attachPoint{{prog: bpf.DnsraceProgFeSkbConsumeUdp, kind: attachTracing}},
		kprobe: []attachPoint{{prog: bpf.DnsraceProgKpSkbConsumeUdp, kind: attachKprobe, symbol: "skb_consume_udp"}},
	},
	{
		name: "udp_sendmsg", fn: "udp_sendmsg", inTask: true,
		fentry: []attachPoint{{prog: bpf.DnsraceProgFeUdpSendmsg, kind: attachTracing}},
		kprobe: []attachPoint{{prog: bpf.DnsraceProgKpUdpSendmsg, kind: attachKprobe, symbol: "udp_sendmsg"}},
	},
	{
		name: "udpv6_sendmsg", fn: "udpv6_sendmsg", module: "ipv6", inTask: true,
		fentry: []attachPoint{{prog: bpf.DnsraceProgFeUdpv6Sendmsg, kind: attachTracing}},
		kprobe: []attachPoint{{prog: bpf.DnsraceProgKpUdpv6Sendmsg, kind: attachKprobe, symbol: "udpv6_sendmsg"}},
	},
}

// tracepointHooks, attached after the function hooks decided the mode.
var tracepointHooks = []tpHook{
	{name: "net_dev_queue", required: true, modes: inTracepointMode, variant: fixedTP(bpf.DnsraceProgTpNetDevQueue)},
	{name: "netif_receive_skb", required: true, modes: inTracepointMode, variant: fixedTP(bpf.DnsraceProgTpNetifReceiveSkb)},
	{name: "kfree_skb", required: true, modes: inFunctionMode | inTracepointMode, variant: kfreeSkbVariant},
	{name: "kmem_cache_free", modes: inTracepointMode, variant: kmemCacheFreeVariant},
	{name: "udp_fail_queue_rcv_skb", modes: inFunctionMode | inTracepointMode, variant: udpFailVariant},
}

// tracepointArgs returns the argument types of tracepoint tp (without the
// leading context pointer) from the btf_trace_<tp> typedef.
func tracepointArgs(k *btf.Spec, tp string) ([]btf.FuncParam, error) {
	var td *btf.Typedef
	if err := k.TypeByName("btf_trace_"+tp, &td); err != nil {
		return nil, fmt.Errorf("tracepoint %s not in kernel BTF: %w", tp, err)
	}
	ptr, ok := btf.UnderlyingType(td.Type).(*btf.Pointer)
	if !ok {
		return nil, fmt.Errorf("btf_trace_%s is %T, not a function pointer", tp, td.Type)
	}
	proto, ok := btf.UnderlyingType(ptr.Target).(*btf.FuncProto)
	if !ok || len(proto.Params) == 0 {
		return nil, fmt.Errorf("btf_trace_%s does not point to a function prototype", tp)
	}
	return proto.Params[1:], nil
}

// kfreeSkbVariant picks the kfree_skb program by the tracepoint's arity:
// (skb, location) before 5.17, + reason in 5.17, + rx_sk in 6.11. Where
// the kernel preempts kernel code it takes the perf tracepoint, whose
// program runs with preemption off: a tp_btf program preempted in a task
// makes every other run on its CPU skip (docs/kernel.md §13).
func kfreeSkbVariant(l *loader) (string, error) {
	args, err := tracepointArgs(l.kspec, "kfree_skb")
	if err != nil {
		return "", err
	}
	switch {
	case l.preempt.Preempts:
		return bpf.DnsraceProgTpKfreeSkbPerf, nil
	case len(args) >= 4:
		return bpf.DnsraceProgTpKfreeSkbRxSk, nil
	case len(args) == 3:
		return bpf.DnsraceProgTpKfreeSkbReason, nil
	case len(args) == 2:
		return bpf.DnsraceProgTpKfreeSkbNoreason, nil
	}
	return "", fmt.Errorf("kfree_skb tracepoint has %d arguments, want 2 to 4", len(args))
}

// udpFailVariant: (rc, sk) before 6.10, (rc, sk, skb) since.
func udpFailVariant(l *loader) (string, error) {
	args, err := tracepointArgs(l.kspec, "udp_fail_queue_rcv_skb")
	if err != nil {
		return "", err
	}
	if len(args) >= 3 {
		return bpf.DnsraceProgTpUdpFailQueueRcvSkb, nil
	}
	return bpf.DnsraceProgTpUdpFailQueueRcvSkbSk, nil
}

// kmemCacheFreeVariant: the (call_site, ptr, struct kmem_cache *)
// prototype of 6.1 and later names the nf_conntrack cache; before it, the
// frees are told apart by their call site in the nf_conntrack module's text
// (its range goes into cfg).
func kmemCacheFreeVariant(l *loader) (string, error) {
	if l.t.nfProg != nil {
		return "", errNotNeededNF
	}
	args, err := tracepointArgs(l.kspec, "kmem_cache_free")
	if err != nil {
		return "", err
	}
	if len(args) == 3 {
		if p, ok := btf.UnderlyingType(args[2].Type).(*btf.Pointer); ok {
			if s, ok := btf.UnderlyingType(p.Target).(*btf.Struct); ok && s.Name == "kmem_cache" {
				return bpf.DnsraceProgTpKmemCacheFree, nil
			}
		}
	}
	if len(args) != 2 {
		return "", fmt.Errorf("kmem_cache_free tracepoint has %d arguments, want 2 or 3", len(args))
	}
	lo, hi, err := moduleText(l.opts.ProcRoot, "nf_conntrack")
	if err != nil {
		return "", fmt.Errorf("kmem_cache_free has no cache argument before 6.1, and nf_conntrack's text was not found (merged clash losers are not traced): %w", err)
	}
	l.cfg.CtFreeLo, l.cfg.CtFreeHi = lo, hi
	return bpf.DnsraceProgTpKmemCacheFreeSite, nil
}

// checkResolveClash refuses the pre-5.6 prototype (net, skb, ctinfo, h).
func checkResolveClash(proto *btf.FuncProto) error {
	if len(proto.Params) != 3 {
		return fmt.Errorf("nf_ct_resolve_clash has %d parameters; only the 5.6+ (skb, h, reply_hash) form is supported", len(proto.Params))
	}
	return nil
}

// findFunc looks fn up in vmlinux BTF, then in module's BTF.
func findFunc(k *btf.Spec, cache *btf.Cache, fn, module string) (*btf.Func, error) {
	var f *btf.Func
	err := k.TypeByName(fn, &f)
	if err == nil {
		return f, nil
	}
	if module != "" {
		if m, merr := cache.Module(module); merr == nil {
			if merr = m.TypeByName(fn, &f); merr == nil {
				return f, nil
			}
		}
	}
	return nil, fmt.Errorf("function %s not in kernel BTF: %w", fn, err)
}

func attach(ap attachPoint, p *ebpf.Program, spec *ebpf.ProgramSpec, multi bool) (link.Link, error) {
	switch {
	case ap.kind == attachKprobe && multi:
		return link.KprobeMulti(p, link.KprobeMultiOptions{Symbols: []string{ap.symbol}})
	case ap.kind == attachKretprobe && multi:
		return link.KretprobeMulti(p, link.KprobeMultiOptions{Symbols: []string{ap.symbol}})
	case ap.kind == attachKprobe:
		return link.Kprobe(ap.symbol, p, nil)
	case ap.kind == attachKretprobe:
		return link.Kretprobe(ap.symbol, p, nil)
	default:
		return link.AttachTracing(link.TracingOptions{Program: p, AttachType: spec.AttachType})
	}
}
