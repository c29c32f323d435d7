// Package probe loads dnsrace's BPF programs (internal/bpf), attaches them
// and reads their events.
//
// Contract:
//
//   - Open chooses a tier per hook at run time. The tracepoint hooks
//     (net_dev_queue, netif_receive_skb, skb_copy_datagram_iovec, kfree_skb;
//     kmem_cache_free and udp_fail_queue_rcv_skb when the kernel's prototype
//     allows) are always attached with tp_btf programs (kmem_cache_free: a
//     raw tracepoint, see bpf/dnsrace.bpf.c); the program variant is picked
//     from the tracepoint's BTF prototype (kfree_skb gained reason in 5.17
//     and rx_sk in 6.11). The function hooks (nf_conntrack_confirm,
//     nf_ct_resolve_clash, skb_consume_udp, udp_sendmsg, udpv6_sendmsg) use
//     fentry/fexit, else kprobe/kretprobe, whichever loads and attaches first
//     (probed with features.HaveProgramType, a BTF lookup of the function in
//     vmlinux or module BTF, a real load and a real attach). Options.Attach
//     forces one tier; a forced tier that cannot trace a hook makes Open fail
//     with a *TierError naming the hook and the reason, never a silent
//     fallback.
//   - Probes reports the outcome per hook, including why better tiers were
//     skipped.
//   - Filtering happens in the kernel (Options.Port, Options.NetNS): a
//     non-DNS packet never reaches the ring buffer.
//   - Read decodes records with event.Decode into one reused event.Event
//     and does not allocate per event; Lost counts records the kernel could
//     not reserve (ring buffer full), per CPU, summed.
//   - Deliveries: skb_copy_datagram_iovec only sees non-linear datagrams;
//     skb_consume_udp (fentry/kprobe only) sees all, and a datagram seen by
//     both is reported once.
//   - DropReasonName resolves enum skb_drop_reason values from the running
//     kernel's BTF; values are never hard-coded.
//
// Open needs root (or CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN) and kernel BTF
// (/sys/kernel/btf/vmlinux, or Options.KernelBTF). No tracefs or bpffs mount
// is needed: tp_btf and fentry attach through BPF links and kprobes through
// the perf kprobe PMU.
package probe
