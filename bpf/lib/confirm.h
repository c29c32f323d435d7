/* __nf_conntrack_confirm and nf_ct_resolve_clash in the fentry and kprobe
 * tiers: the kernel's own verdict on each DNS entry.
 */
#ifndef DNSRACE_LIB_CONFIRM_H
#define DNSRACE_LIB_CONFIRM_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_core_read.h"
#include "dnsrace.h"
#include "config.h"
#include "conntrack.h"
#include "packet.h"
#include "maps.h"
#include "record.h"
#include "flow.h"

/* confirm_enter: the query of a DNS skb entering confirm (first seen here
 * if no send was seen: forwarded from outside) and its entry, read now. */
static __always_inline bool confirm_enter(struct pending_confirm *pc, struct sk_buff *skb, __u8 tier)
{
	struct seen s = {};
	if (!dns_packet(skb, &s, false, false) || !s.ct || s.response)
		return false;
	s.netns = skb_netns(skb, NULL, false);
	if (!netns_match(s.netns))
		return false;
	announce_netns(s.netns, tier);
	struct flow_key k;
	struct flow *f;
	query_key(&k, &s);
	__u32 asker = 0;
	pc->qid = track_query(&s, skb, &k, true, tier, RF_NO_SOCKET, 0, &asker, &f);
	pc->netns = s.netns;
	pc->pkt = s.p.t;
	pc->clashed = 0;
	read_ct(&pc->ct, s.ct);
	return true;
}

/* confirm_exit reports what user space must explain: NF_DROP, a merge
 * (the skb now carries the winner's entry), or a NAT_CLASH insert. A plain
 * insert sends nothing. */
static __always_inline void confirm_exit(struct pending_confirm *pc, struct sk_buff *skb, int ret, __u8 tier)
{
	__u8 nothing = 0;
	struct nf_conn *after = skb_ct(skb, false, &nothing);
	__u8 kind;
	if (ret == NF_DROP)
		kind = EV_CONFIRM_DROP;
	else if ((__u64)after != pc->ct.ptr)
		kind = EV_MERGED;
	else if (BPF_CORE_READ(after, status) & IPS_NAT_CLASH)
		kind = EV_NAT_CLASH;
	else
		return;
	struct event_buf *b = new_event();
	if (!b)
		return;
	b->r.pkt = pc->pkt;
	b->r.ct = pc->ct;
	if (kind == EV_MERGED) {
		read_ct(&b->r.winner, after);
		b->r.flags = RF_WINNER;
	} else if (pc->clashed) {
		b->r.winner = pc->winner;
		b->r.flags = RF_WINNER;
	}
	emit_event(b, kind, tier, pc->qid, pc->netns, 0, 0);
}

/* confirm_task_key keys the calling task's confirm stack: its thread id,
 * or for an idle task (id 0 on every CPU) the CPU, above any id. */
static __always_inline __u64 confirm_task_key(void)
{
	__u64 tid = (__u32)bpf_get_current_pid_tgid();
	return tid ? tid : (1ULL << 32) | bpf_get_smp_processor_id();
}

/* confirm_stack_of is the stack confirm's entries and returns pair on: the
 * CPU's, or where a task can move between them (confirm_by_task) the
 * task's, made at its first entry when create. */
static __always_inline struct confirm_stack *confirm_stack_of(__u64 *key, bool create)
{
	__u32 zero = 0;
	struct confirm_stack *cpu = bpf_map_lookup_elem(&confirm_stack, &zero);
	if (!confirm_by_task || !cpu)
		return cpu;
	*key = confirm_task_key();
	struct confirm_stack *st = bpf_map_lookup_elem(&confirm_stacks, key);
	if (st || !create)
		return st;
	/* The CPU's own stack is unused in this mode: an empty value to copy. */
	cpu->depth = 0;
	bpf_map_update_elem(&confirm_stacks, key, cpu, BPF_NOEXIST);
	return bpf_map_lookup_elem(&confirm_stacks, key);
}

/* ptr_value returns p's address as a plain number. In fentry programs p
 * is a typed BTF pointer, and the verifier refuses arithmetic on it with a
 * variable offset (6.1: "value ... makes ptr_ pointer be out of bounds");
 * reading the spilled value back through a helper launders it. */
static __always_inline __u64 ptr_value(const void *p)
{
	__u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), &p);
	return v;
}

/* pending_of finds the pending confirm of skb, which nf_ct_resolve_clash
 * runs inside: fentry keeps it by skb, kprobe on the stack of the CPU or
 * task (the innermost call, as clash runs under local_bh_disable). The
 * confirm hook's tier need not be clash's (where the kernel preempts, the
 * confirm hook takes kprobes and clash fentry), so both are looked at. A
 * per-CPU slot would not do: a preempted task can return from confirm on
 * another CPU, and a softirq's confirm can run in between on this one. */
static __always_inline struct pending_confirm *pending_of(struct sk_buff *skb)
{
	__u64 key = (__u64)skb;
	struct pending_confirm *pc = bpf_map_lookup_elem(&confirm_entry, &key);
	if (pc)
		return pc;
	struct confirm_stack *st = confirm_stack_of(&key, false);
	if (!st)
		return NULL;
	__u32 d = st->depth - 1;
	barrier_var(d);
	if (d >= CONFIRM_DEPTH)
		return NULL;
	struct confirm_slot *s = &st->slot[d];
	if (!s->valid || s->skb != (__u64)skb)
		return NULL;
	return &s->pc;
}

/* Signature since v5.6 (6a757c07e51f series): (skb, h, reply_hash); h is a
 * tuplehash of the entry already in the table: the winner. Earlier kernels
 * are not supported (the loader checks the BTF prototype). */
static __always_inline int clash(struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	__u8 ctinfo;
	struct nf_conn *loser = skb_ct(skb, false, &ctinfo);
	if (!loser)
		return 0;
	struct tuple orig = {};
	read_tuple(&orig, loser, 0);
	if (orig.proto != IPPROTO_UDP || !dns_ports(&orig))
		return 0;
	struct pending_confirm *pc = pending_of(skb);
	if (!pc)
		return 0;
	/* nf_ct_tuplehash_to_ctrack: container_of(h, struct nf_conn,
	 * tuplehash[h->tuple.dst.dir]) */
	__u8 dir = BPF_CORE_READ(h, tuple.dst.dir) & 1;
	__u64 winner = ptr_value(h) - bpf_core_field_offset(struct nf_conn, tuplehash) -
		       dir * bpf_core_type_size(struct nf_conntrack_tuple_hash);
	read_ct(&pc->winner, (struct nf_conn *)winner);
	pc->clashed = 1;
	return 0;
}

#endif /* DNSRACE_LIB_CONFIRM_H */
