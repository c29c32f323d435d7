// Package probe loads dnsrace's BPF programs (internal/bpf), attaches them
// and reads their records.
//
// Contract:
//
//   - Open decides the mode first. The function hooks (nf_conntrack_confirm,
//     nf_ct_resolve_clash, skb_consume_udp, udp_sendmsg, udpv6_sendmsg) are
//     attached with fentry/fexit, else kprobe/kretprobe, else kprobe.multi
//     where legacy kprobes are not built in (CONFIG_KPROBES off, fprobe on),
//     whichever loads and attaches first (probed with
//     features.HaveProgramType, a BTF lookup of the function in vmlinux or
//     module BTF, a real load and a real attach). Where the kernel preempts
//     kernel code (internal/preemption), the hooks that run in a task
//     (confirm, skb_consume_udp, the sends) skip fentry: a fentry program
//     preempted there makes its other runs on that CPU skip
//     (docs/kernel.md §12); fentry is then their last resort, said so. When the confirm and
//     delivery hooks attach, the tracer runs in ModeFunction: queries are
//     first seen at their send, verdicts and winners come from confirm and
//     clash, answers from skb_consume_udp, and of the tracepoints only
//     kfree_skb and udp_fail_queue_rcv_skb are attached. Otherwise every
//     function hook is released and the tracer runs in ModeTracepoint:
//     net_dev_queue, netif_receive_skb, kfree_skb and udp_fail_queue_rcv_skb
//     (tp_btf), the program variant picked from each tracepoint's BTF
//     prototype (kfree_skb gained reason in 5.17 and rx_sk in 6.11). A
//     netfilter program (6.4+, BPF_PROG_TYPE_NETFILTER) sees a merged
//     loser's entry just before confirm, in each namespace given to
//     WatchNetNS; only where it cannot load does the raw tracepoint
//     kmem_cache_free stand in, seeing the loser's entry freed (by its
//     cache from 6.1, before that by nf_conntrack's text range from
//     /proc/modules). No program runs per slab free where the netfilter
//     program loads.
//   - Options.Attach forces one tier; a forced fentry or kprobe tier that
//     cannot trace a hook makes Open fail with a *TierError naming the hook
//     and the reason, never a silent fallback. Probes reports the outcome per
//     hook, including why better tiers were skipped or a hook is not needed.
//   - Filtering happens in the kernel (Options.Ports, Options.NetNS): a
//     non-DNS packet never reaches the ring buffer. A query is recognised by
//     its port at first sight only; later hooks find it by its conntrack
//     entry's original tuple (see bpf/lib/flow.h).
//   - Every map is created once and shared by every program that uses it;
//     the read-only config (cfg, tracepoint_mode) is set per load.
//   - The programs time their windows (a hop or a resend, a late winner)
//     in jiffies, cheaper to read than a nanosecond clock; records carry
//     nanoseconds. TickRate measures the kernel's HZ for cfg, once per
//     process (100 ms of the first Open): no kernel config file needed.
//   - Read drains the ring on a goroutine of its own into a few reused
//     batches, and decodes them with event.Decode into one reused
//     event.Event on the calling goroutine: it does not allocate per
//     record, and the ring empties at the rate of a copy, not at the rate of
//     the caller's work. It calls its idle function from the calling
//     goroutine when the ring has been empty for IdleEvery (the kernel side
//     wakes the reader only when an eighth of the ring is queued). Stats
//     sums the kernel side's per-CPU counters: records lost to a full ring
//     buffer, flows started, answered and refused, and the sweeper's.
//   - The flow table (flows, answers) is a plain hash that the programs
//     insert into and delete from; a goroutine sweeps what nobody will
//     delete (sweep.go: unanswered past Options.FlowMaxAge, and the oldest
//     when the table fills), and Read reports each query whose flow was
//     evicted young as event.KindUntracked. The design, and why:
//     docs/design.md, "The flow table".
//   - DropReasonName resolves enum skb_drop_reason values from the running
//     kernel's BTF; values are never hard-coded.
//
// Open needs root (or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN) and kernel BTF
// (/sys/kernel/btf/vmlinux, or Options.KernelBTF); without either it fails
// before loading anything, with an error that names both (callers do not
// check BTF themselves). No tracefs or bpffs mount is needed: tp_btf,
// fentry, kprobe.multi and netfilter programs attach through BPF links and
// kprobes through the perf kprobe PMU.
package probe
