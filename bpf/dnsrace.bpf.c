//go:build ignore

/* The BPF programs of dnsrace, one per hook and kernel prototype, in three
 * sections: the tracepoint tier's hooks, the fentry and kprobe tiers'
 * hooks, and the hooks every tier attaches. Their logic is in lib/, by
 * concern, every map in lib/maps.h, the CO-RE flavours in core_fixes.bpf.h,
 * and the records and config shared with user space in dnsrace.h.
 * docs/design.md explains the design: flows, tiers, and how each tier
 * tells a race's loser and winner.
 */
#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_tracing.h"
#include "bpf_core_read.h"
#include "bpf_endian.h"

#include "dnsrace.h"
#include "core_fixes.bpf.h"

#include "lib/config.h"
#include "lib/conntrack.h"
#include "lib/packet.h"
#include "lib/maps.h"
#include "lib/record.h"
#include "lib/flow.h"
#include "lib/ct_watch.h"
#include "lib/drop.h"
#include "lib/device.h"
#include "lib/confirm.h"
#include "lib/socket.h"
#include "lib/sweep.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* ==== tracepoint ======================================================= */

/* ---- devices ---------------------------------------------------------- */

SEC("tp_btf/net_dev_queue")
int BPF_PROG(tp_net_dev_queue, struct sk_buff *skb)
{
	return device(skb, true);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(tp_netif_receive_skb, struct sk_buff *skb)
{
	return device(skb, false);
}

/* ---- just before confirm (netfilter, 6.4+) ---------------------------- */

/* nf_confirm_soon runs at POSTROUTING and LOCAL_IN just before conntrack's
 * confirm (the loader links it at INT_MAX - 1, only in the namespaces that
 * NAT): a DNS query's unconfirmed entry is kept by its skb and in its flow,
 * and the next sight of the query or its answer at a device says whether
 * confirm inserted it or merged it into a winner (check_merge). It starts
 * no flow: a query forwarded from outside starts its flow at the next
 * device, which finds its entry by the skb (and 6.12 does not let a
 * netfilter program read the task's comm, as a QUERY record does). It
 * always accepts. */
SEC("netfilter")
int nf_confirm_soon(struct bpf_nf_ctx___dnsrace *ctx)
{
	struct sk_buff *skb = ctx->skb;
	struct nf_conn *ct = (struct nf_conn *)(skb->_nfct & NFCT_PTRMASK);
	if (!ct || (BPF_CORE_READ(ct, status) & IPS_CONFIRMED))
		return NF_ACCEPT;
	struct seen s = {};
	if (!dns_packet(skb, &s, true, false) || s.response)
		return NF_ACCEPT;
	s.netns = ctx->state->net->ns.inum;
	if (!netns_match(s.netns))
		return NF_ACCEPT;
	struct flow_key k;
	struct flow *f;
	__u32 asker;
	query_key(&k, &s);
	track_query(&s, skb, &k, false, TIER_TRACEPOINT, 0, (__u64)ct, &asker, &f);
	if (ctx->state->hook == NF_INET_LOCAL_IN)
		return NF_ACCEPT; /* its answer compares the flow's pre_ct */
	struct preconfirm p = {.ct = (__u64)ct, .ts = bpf_jiffies64(), .netns = s.netns};
	__u64 skbp = (__u64)skb;
	bpf_map_update_elem(&preconfirm, &skbp, &p, BPF_ANY);
	return NF_ACCEPT;
}

/* ---- unconfirmed entries freed ---------------------------------------- */

/* kmem:kmem_cache_free with the cache argument (v6.1, "mm/sl[au]b:
 * generalize kmalloc subsystem" series). A raw tracepoint, not tp_btf: 6.1's
 * verifier refuses tp_btf reads of the "const void *ptr" argument. Runs on
 * every slab free in the system, so the common path is one array lookup and
 * one compare. */
SEC("raw_tp/kmem_cache_free")
int BPF_PROG(tp_kmem_cache_free, unsigned long call_site, const void *ptr, struct kmem_cache *s)
{
	__u32 zero = 0;
	__u64 *cachep = bpf_map_lookup_elem(&ct_cachep, &zero);
	if (!cachep)
		return 0;
	if (*cachep) {
		if (*cachep != (__u64)s)
			return 0;
	} else {
		/* Not found yet: size first, then the name. */
		if (BPF_CORE_READ(s, object_size) != bpf_core_type_size(struct nf_conn))
			return 0;
		char name[16] = {};
		bpf_probe_read_kernel_str(name, sizeof(name), BPF_CORE_READ(s, name));
		const char want[] = "nf_conntrack";
		for (int i = 0; i < sizeof(want); i++)
			if (name[i] != want[i])
				return 0;
		*cachep = (__u64)s;
	}
	return ct_freed((struct nf_conn *)ptr);
}

/* Before v6.1 the tracepoint has no cache argument: frees called from the
 * nf_conntrack module's text (cfg.ct_free_lo/hi, from /sys/module) are its
 * entries (and, rarely, its expectations, which ct_freed's checks reject). */
SEC("raw_tp/kmem_cache_free")
int BPF_PROG(tp_kmem_cache_free_site, unsigned long call_site, const void *ptr)
{
	if (call_site - cfg.ct_free_lo >= cfg.ct_free_hi - cfg.ct_free_lo)
		return 0;
	return ct_freed((struct nf_conn *)ptr);
}


/* ==== fentry and kprobe ================================================ */

/* ---- __nf_conntrack_confirm ------------------------------------------- */

SEC("kprobe/__nf_conntrack_confirm")
int BPF_KPROBE(kp_nf_conntrack_confirm, struct sk_buff *skb)
{
	__u64 key = 0;
	struct confirm_stack *st = confirm_stack_of(&key, true);
	if (!st)
		return 0;
	__u32 d = st->depth;
	/* Calls nest at most process + softirq deep on one CPU: a full stack
	 * means returns were missed (kretprobe maxactive exhausted, or the
	 * kretprobe attached after an entry): start over. */
	if (d >= CONFIRM_DEPTH)
		d = 0;
	st->depth = d + 1;
	struct confirm_slot *s = &st->slot[d];
	s->skb = (__u64)skb;
	s->valid = confirm_enter(&s->pc, skb, TIER_KPROBE);
	return 0;
}

SEC("kretprobe/__nf_conntrack_confirm")
int BPF_KRETPROBE(krp_nf_conntrack_confirm, int ret)
{
	__u64 key = 0;
	struct confirm_stack *st = confirm_stack_of(&key, false);
	if (!st || st->depth == 0)
		return 0;
	__u32 d = st->depth - 1;
	st->depth = d;
	/* Bound d itself: the compiler would test depth instead, and verifiers
	 * before about 6.11 do not carry that bound over to depth - 1. */
	barrier_var(d);
	if (d < CONFIRM_DEPTH) {
		struct confirm_slot *s = &st->slot[d];
		if (s->valid) {
			s->valid = 0;
			confirm_exit(&s->pc, (struct sk_buff *)s->skb, ret, TIER_KPROBE);
		}
	}
	if (confirm_by_task && d == 0)
		bpf_map_delete_elem(&confirm_stacks, &key);
	return 0;
}

SEC("fentry/__nf_conntrack_confirm")
int BPF_PROG(fe_nf_conntrack_confirm, struct sk_buff *skb)
{
	__u32 zero = 0;
	struct pending_confirm *pc = bpf_map_lookup_elem(&confirm_scratch, &zero);
	if (!pc || !confirm_enter(pc, skb, TIER_FENTRY))
		return 0;
	__u64 key = (__u64)skb;
	bpf_map_update_elem(&confirm_entry, &key, pc, BPF_ANY);
	return 0;
}

SEC("fexit/__nf_conntrack_confirm")
int BPF_PROG(fx_nf_conntrack_confirm, struct sk_buff *skb, int ret)
{
	__u64 key = (__u64)skb;
	struct pending_confirm *pc = bpf_map_lookup_elem(&confirm_entry, &key);
	if (!pc)
		return 0;
	confirm_exit(pc, skb, ret, TIER_FENTRY);
	bpf_map_delete_elem(&confirm_entry, &key);
	return 0;
}

/* ---- nf_ct_resolve_clash ---------------------------------------------- */

SEC("kprobe/nf_ct_resolve_clash")
int BPF_KPROBE(kp_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h);
}

SEC("fentry/nf_ct_resolve_clash")
int BPF_PROG(fe_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h);
}

/* ---- skb_consume_udp -------------------------------------------------- */

SEC("fentry/skb_consume_udp")
int BPF_PROG(fe_skb_consume_udp, struct sock *sk, struct sk_buff *skb, int len)
{
	return deliver(skb, sk, TIER_FENTRY);
}

SEC("kprobe/skb_consume_udp")
int BPF_KPROBE(kp_skb_consume_udp, struct sock *sk, struct sk_buff *skb)
{
	return deliver(skb, sk, TIER_KPROBE);
}

/* ---- udp_sendmsg / udpv6_sendmsg -------------------------------------- */

SEC("kprobe/udp_sendmsg")
int BPF_KPROBE(kp_udp_sendmsg, struct sock *sk, struct msghdr *msg)
{
	return send(sk, msg, TIER_KPROBE, false);
}

SEC("kprobe/udpv6_sendmsg")
int BPF_KPROBE(kp_udpv6_sendmsg, struct sock *sk, struct msghdr *msg)
{
	return send(sk, msg, TIER_KPROBE, true);
}

SEC("fentry/udp_sendmsg")
int BPF_PROG(fe_udp_sendmsg, struct sock *sk, struct msghdr *msg)
{
	return send(sk, msg, TIER_FENTRY, false);
}

SEC("fentry/udpv6_sendmsg")
int BPF_PROG(fe_udpv6_sendmsg, struct sock *sk, struct msghdr *msg)
{
	return send(sk, msg, TIER_FENTRY, true);
}


/* ==== every tier ======================================================= */

/* ---- drops ------------------------------------------------------------ */

/* skb:kfree_skb changed its arguments twice; tp_btf arguments are
 * positional and the verifier refuses a read past the last one, so there is
 * one program per prototype and the loader picks by the parameter count of
 * btf_trace_kfree_skb:
 *   (skb, location)                  before v5.17
 *   (skb, location, reason)          c504e5c2f964, v5.17
 *   (skb, location, reason, rx_sk)   "net: add rx_sk to trace_kfree_skb", v6.11
 */
SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_rx_sk, struct sk_buff *skb, void *location, int reason, struct sock *rx_sk)
{
	return drop(skb, (__u64)location, reason, rx_sk, true);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_reason, struct sk_buff *skb, void *location, int reason)
{
	return drop(skb, (__u64)location, reason, NULL, true);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_noreason, struct sk_buff *skb, void *location)
{
	return drop(skb, (__u64)location, 0, NULL, true);
}

/* Where the kernel preempts kernel code, the loader takes the perf
 * tracepoint instead. Linux 7.2 calls a tracepoint's probes under
 * SRCU-fast, not with preemption off ("tracing: Guard __DECLARE_TRACE() use
 * of __DO_TRACE_CALL() with SRCU-fast"); a tp_btf program running in a task
 * can so be preempted holding its per-CPU recursion guard, and every other
 * run of it on that CPU is skipped until the task resumes. A drop at a local
 * socket's LOCAL_OUT runs in its task. Perf tracepoints still turn
 * preemption off (perf_trace_##call), so their program is never preempted;
 * it shares bpf_prog_active with the kprobe programs and map syscalls, and
 * skips a run only when it lands inside one of those on its CPU
 * (docs/kernel.md §13). */
SEC("tracepoint/skb/kfree_skb")
int tp_kfree_skb_perf(struct trace_event_raw_kfree_skb___dnsrace *ctx)
{
	__u32 reason = 0;
	struct sock *rx_sk = NULL;
	if (bpf_core_field_exists(ctx->reason))
		reason = ctx->reason;
	if (bpf_core_field_exists(ctx->rx_sk))
		rx_sk = ctx->rx_sk;
	return drop(ctx->skbaddr, (__u64)ctx->location, reason, rx_sk, false);
}

/* ---- full receive buffers --------------------------------------------- */

/* udp:udp_fail_queue_rcv_skb gained the skb argument in v6.10 ("net: udp:
 * add IP/port data to the tracepoint udp/udp_fail_queue_rcv_skb"). */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb, int rc, struct sock *sk, struct sk_buff *skb)
{
	return rcvbuf_full(skb, sk);
}

/* Before v6.10 only the socket is known: its tuple goes to user space,
 * which blames the socket's unanswered queries. */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb_sk, int rc, struct sock *sk)
{
	struct tuple t = {.proto = IPPROTO_UDP};
	t.dport = BPF_CORE_READ(sk, __sk_common.skc_num);
	t.sport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (!dns_ports(&t))
		return 0;
	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;
	if (BPF_CORE_READ(sk, __sk_common.skc_family) == AF_INET6) {
		t.family = 6;
		bpf_core_read(t.saddr, 16, &sk->__sk_common.skc_v6_daddr);
		bpf_core_read(t.daddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
	} else {
		t.family = 4;
		bpf_core_read(t.saddr, 4, &sk->__sk_common.skc_daddr);
		bpf_core_read(t.daddr, 4, &sk->__sk_common.skc_rcv_saddr);
	}
	struct event_buf *b = new_event();
	if (!b)
		return 0;
	b->r.flags = RF_RESPONSE;
	b->r.pkt = t;
	emit_event(b, EV_RCVBUF_FULL, TIER_TRACEPOINT, 0, netns, 0, 0);
	return 0;
}

/* ==== run by the loader ================================================= */

/* The flow table's sweep (lib/sweep.h): a test run, never attached. */
SEC("xdp")
int sweep_flows(struct xdp_md *ctx)
{
	return sweep(ctx);
}
