/* Records to user space (bpf/dnsrace.h) and the ring buffer they go
 * through: QUERY records are built in query_scratch, EVENT records in
 * event_scratch (too big for the stack; new_event, then emit_event), and
 * ANSWER records on the stack (answer() in flow.h).
 */
#ifndef DNSRACE_LIB_RECORD_H
#define DNSRACE_LIB_RECORD_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"
#include "config.h"
#include "maps.h"

/* Emit the types bpf2go generates Go code for (-type). */
const struct rec_hdr *unused_hdr __attribute__((unused));
const struct rec_query *unused_query __attribute__((unused));
const struct rec_answer *unused_answer __attribute__((unused));
const struct rec_event *unused_event __attribute__((unused));
const enum rec_type *unused_rec_type __attribute__((unused));
const enum ev_kind *unused_ev_kind __attribute__((unused));
const enum tier *unused_tier __attribute__((unused));
const enum rec_flags *unused_rec_flags __attribute__((unused));
const enum stat_index *unused_stat __attribute__((unused));

/* Records a CPU sends between two looks at how full the ring is. */
#define RING_CHECK_EVERY 32

static __always_inline void stat_inc(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&stats, &i);
	if (n)
		*n += 1; /* per-CPU slot: no atomics needed */
}

/* output sends one record. The reader is woken only once a good part of
 * the ring is queued; otherwise it drains the ring on its own deadline, so
 * a busy node does not pay a wakeup per record. How full the ring is is
 * asked only every RING_CHECK_EVERY records a CPU sends: the answer reads
 * the reader's position, a cache line the reader keeps writing, so every
 * read would miss the cache while the reader keeps up. A wakeup is then
 * late by at most that many records per CPU, against a threshold of 1/8 of
 * the ring. */
static __always_inline __u64 output_flags(void)
{
	__u32 *sent = bpf_map_lookup_elem(&ring_sends, &ring_sends_key);
	if (sent && (++*sent & (RING_CHECK_EVERY - 1)) == 0 &&
	    bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= cfg.wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void ring_send(void *rec, __u64 size, __u64 flags)
{
	if (bpf_ringbuf_output(&events, rec, size, flags))
		stat_inc(STAT_RING_LOST);
}

static __always_inline void output(void *rec, __u64 size)
{
	ring_send(rec, size, output_flags());
}

static __always_inline void fill_hdr(struct rec_hdr *h, __u8 type, __u8 tier, __u64 qid, __u32 netns)
{
	h->ts = bpf_ktime_get_ns();
	h->qid = qid;
	h->netns = netns;
	h->cpu = bpf_get_smp_processor_id();
	h->type = type;
	h->tier = tier;
}

/* ---- QUERY ------------------------------------------------------------ */

/* emit_query sends the QUERY record of a new flow; the DNS message comes
 * from kernel memory (an skb) or, for a send, from user memory. */
static __always_inline void emit_query(__u64 qid, __u32 netns, const struct tuple *t, __u64 payload,
				       __u32 len, bool user, __u8 tier, __u8 flags)
{
	__u32 zero = 0;
	struct query_buf *b = bpf_map_lookup_elem(&query_scratch, &zero);
	if (!b)
		return;
	fill_hdr(&b->r.h, REC_QUERY, tier, qid, netns);
	b->r.cgroup = bpf_get_current_cgroup_id();
	b->r.pid = bpf_get_current_pid_tgid() >> 32;
	b->r.flags = flags;
	b->r._pad = 0;
	bpf_get_current_comm(b->r.comm, sizeof(b->r.comm));
	b->r.t = *t;
	if (len > DNS_CAP)
		len = DNS_CAP;
	len &= DNS_ROOM - 1;
	if (user)
		bpf_probe_read_user(b->dns, len, (void *)payload);
	else
		bpf_probe_read_kernel(b->dns, len, (void *)payload);
	b->r.dns_len = len;
	output(b, sizeof(b->r) + len);
}

/* ---- EVENT ------------------------------------------------------------ */

/* new_event starts an EVENT record in this CPU's event_scratch, zeroed:
 * the caller fills in what the event knows, then emit_event sends it. */
static __always_inline struct event_buf *new_event(void)
{
	__u32 zero = 0;
	struct event_buf *b = bpf_map_lookup_elem(&event_scratch, &zero);
	if (b)
		__builtin_memset(&b->r, 0, sizeof(b->r));
	return b;
}

/* event_size is how much of r to send. With no DNS message after them,
 * the parts a record left zero are not sent: the winner's entry (unless
 * RF_WINNER), then the packet's own entry (when it had none). A drop at a
 * full receive buffer, one per refused query in a flood, is then 192 bytes
 * instead of 288. Decode in internal/event takes all three sizes. */
static __always_inline __u64 event_size(const struct rec_event *r, __u32 len)
{
	__u64 size = sizeof(*r) + len;
	if (!len && !(r->flags & RF_WINNER))
		size -= r->ct.ptr ? sizeof(r->winner) : sizeof(r->winner) + sizeof(r->ct);
	return size;
}

/* emit_event sends b, with len bytes of the DNS message at payload (kernel
 * memory) when len > 0. */
static __always_inline void emit_event(struct event_buf *b, __u8 kind, __u8 tier, __u64 qid, __u32 netns,
				       __u64 payload, __u32 len)
{
	fill_hdr(&b->r.h, REC_EVENT, tier, qid, netns);
	b->r.kind = kind;
	if (len > DNS_CAP)
		len = DNS_CAP;
	len &= DNS_ROOM - 1;
	if (len)
		bpf_probe_read_kernel(b->dns, len, (void *)payload);
	b->r.dns_len = len;
	/* The size is worked out after output_flags' calls: live across
	 * them it would take a stack slot, and device() has none left. */
	__u64 flags = output_flags();
	ring_send(b, event_size(&b->r, len), flags);
}

/* announce_netns sends EV_CT_NETNS the first time a DNS entry is seen in
 * netns: from then on user space reconciles that namespace's counters. */
static __always_inline void announce_netns(__u32 netns, __u8 tier)
{
	if (bpf_map_lookup_elem(&ct_netns, &netns))
		return;
	__u8 one = 1;
	bpf_map_update_elem(&ct_netns, &netns, &one, BPF_ANY);
	struct event_buf *b = new_event();
	if (b)
		emit_event(b, EV_CT_NETNS, tier, 0, netns, 0, 0);
}

#endif /* DNSRACE_LIB_RECORD_H */
