/* The flow table: a DNS query's flow from first sight to its answer, by
 * the asking socket's 5-tuple and DNS id (struct flow_key); answers found
 * by the key reversed or by an answers entry; the askers marks that let
 * namespaces nobody asks from skip the lookups.
 */
#ifndef DNSRACE_LIB_FLOW_H
#define DNSRACE_LIB_FLOW_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"
#include "config.h"
#include "packet.h"
#include "maps.h"
#include "record.h"

/* A packet crosses a node in far less; a later query with the same socket
 * and DNS id is a resend (glibc 5 s, musl 2.5 s). */
#define RESEND_GAP_MS 400

static __always_inline __u64 new_qid(void)
{
	__u32 zero = 0;
	__u64 *seq = bpf_map_lookup_elem(&qid_seq, &zero);
	if (!seq)
		return 0;
	*seq += 1;
	return ((__u64)bpf_get_smp_processor_id() << 48) | (*seq & 0xffffffffffffULL);
}

/* key_from: the flow key of tuple t with DNS id id; reversed, the key of
 * the flow a response with tuple t answers. */
static __always_inline void key_from(struct flow_key *k, const struct tuple *t, __u16 id, bool reversed)
{
	__builtin_memcpy(k->saddr, reversed ? t->daddr : t->saddr, 16);
	__builtin_memcpy(k->daddr, reversed ? t->saddr : t->daddr, 16);
	k->sport = reversed ? t->dport : t->sport;
	k->dport = reversed ? t->sport : t->dport;
	k->id = id;
	k->family = t->family;
	k->_pad = 0;
}

/* query_key: the flow key of a query packet: its entry's original tuple,
 * else its header. */
static __always_inline void query_key(struct flow_key *k, const struct seen *s)
{
	key_from(k, s->ct ? &s->orig : &s->p.t, s->id, false);
}

/* lookup_flow finds the flow of k, or of k without a source address (a
 * socket that had none at send: only the send hooks of the fentry and
 * kprobe tiers start such flows, so in tracepoint_mode none pays the
 * second lookup). */
static __always_inline struct flow *lookup_flow(struct flow_key *k)
{
	struct flow *f = bpf_map_lookup_elem(&flows, k);
	if (f || tracepoint_mode)
		return f;
	struct flow_key z = *k;
	__builtin_memset(z.saddr, 0, 16);
	return bpf_map_lookup_elem(&flows, &z);
}

static __always_inline __u32 *askers_of(__u32 netns)
{
	__u32 i = netns & (ASKER_SLOTS - 1);
	return bpf_map_lookup_elem(&askers, &i);
}

/* mark_asker marks netns's askers slot before an entry is made there (a
 * response seen meanwhile finds no entry either way). The slot is read
 * first: written only once, it stays in every CPU's cache. */
static __always_inline void mark_asker(__u32 netns)
{
	__u32 *n = askers_of(netns);
	if (n && !*n)
		*n = 1;
}

/* expect_answer makes an answers entry; false: the table is full (counted). */
static __always_inline bool expect_answer(struct ans_key *ak, struct ans *a)
{
	mark_asker(ak->netns);
	a->ts = bpf_jiffies64();
	if (!bpf_map_update_elem(&answers, ak, a, BPF_ANY))
		return true;
	stat_inc(STAT_FLOWS_REFUSED);
	return false;
}

static __always_inline void forget_answer(struct ans_key *ak)
{
	bpf_map_delete_elem(&answers, ak);
}

/* delete_flow deletes the flow of k; false if it was not there. */
static __always_inline bool delete_flow(struct flow_key *k)
{
	return !bpf_map_delete_elem(&flows, k);
}

/* new_flow starts a flow (marking its asking namespace an asker) and
 * sends the QUERY record. pre_ct is the entry the netfilter program saw
 * just before confirm (0 elsewhere). Its answer is found by its key
 * reversed. A full table keeps no flow for it: the record says so
 * (RF_UNTRACKED), so its answer, which nothing will match, is not taken
 * for a loss. */
static __always_inline __u64 new_flow(struct flow_key *k, __u32 netns, __u64 payload, __u32 len, bool user,
				      __u8 tier, __u8 flags, __u64 pre_ct)
{
	__u64 qid = new_qid();
	struct flow f = {.qid = qid, .ts = bpf_jiffies64(), .pre_ct = pre_ct, .netns = netns};
	mark_asker(netns);
	if (bpf_map_update_elem(&flows, k, &f, BPF_ANY)) {
		stat_inc(STAT_FLOWS_REFUSED);
		flags |= RF_UNTRACKED;
	}
	stat_inc(STAT_FLOWS_NEW);
	struct tuple t = {.sport = k->sport, .dport = k->dport, .family = k->family, .proto = IPPROTO_UDP};
	__builtin_memcpy(t.saddr, k->saddr, 16);
	__builtin_memcpy(t.daddr, k->daddr, 16);
	emit_query(qid, netns, &t, payload, len, user, tier, flags);
	return qid;
}

/* sender_of is RF_SENDER when skb still belongs to the socket that sent it
 * (skb->sk: the receive path of another namespace orphans it), so the hook
 * runs inside that send. */
static __always_inline __u8 sender_of(struct sk_buff *skb)
{
	return BPF_CORE_READ(skb, sk) ? RF_SENDER : 0;
}

/* track_query returns the qid of the query a packet carries: a flow seen
 * moments ago is a hop of it (*fp is the flow); otherwise, where the hook
 * may (create), a new query starts here (*fp stays NULL). pre_ct, when not
 * 0, is the packet's unconfirmed entry just before confirm, kept in the
 * flow for its next sight to compare (check_merge). */
static __always_inline __u64 track_query(struct seen *s, struct sk_buff *skb, struct flow_key *k, bool create,
					 __u8 tier, __u8 flags, __u64 pre_ct, __u32 *asker, struct flow **fp)
{
	struct flow *f = lookup_flow(k);
	__u64 now = bpf_jiffies64();
	*fp = NULL;
	/* A resend reuses the socket and the DNS id: only time tells it from
	 * a hop. */
	if (f && within_ms(f->ts, now, RESEND_GAP_MS)) {
		f->ts = now;
		if (pre_ct)
			f->pre_ct = pre_ct;
		*asker = f->netns;
		*fp = f;
		return f->qid;
	}
	if (!create)
		return 0;
	*asker = s->netns;
	/* read only for a new flow: every hop would pay for it otherwise */
	flags |= sender_of(skb);
	return new_flow(k, s->netns, s->p.payload, s->p.payload_len, false, tier, flags, pre_ct);
}

/* What lookup_answer found: the query a response answers and its flow;
 * by_entry: found by an answers entry (keyed by the response's tuple). */
struct found {
	__u64 qid;
	struct flow *f;
	struct flow_key fk;
	bool by_entry;
};

/* lookup_answer finds the query a response with tuple t and DNS id in
 * netns answers: the flow asked from netns whose key is t reversed (or
 * that key without a source address: a socket that had none at send, only
 * in the tiers with send hooks), else an answers entry for t. */
static __always_inline bool lookup_answer(struct found *o, __u32 netns, const struct tuple *t, __u16 id)
{
	__u32 *n = askers_of(netns);
	if (n && !*n)
		return false; /* nobody asks in this namespace */
	struct flow_key *k = &o->fk;
	key_from(k, t, id, true);
	struct flow *f = bpf_map_lookup_elem(&flows, k);
	if (!f && !tracepoint_mode) {
		__builtin_memset(k->saddr, 0, 16);
		f = bpf_map_lookup_elem(&flows, k);
	}
	if (f && f->netns == netns) {
		o->qid = f->qid;
		o->f = f;
		o->by_entry = false;
		return true;
	}
	struct ans_key ak = {.netns = netns};
	key_from(&ak.k, t, id, false);
	struct ans *a = bpf_map_lookup_elem(&answers, &ak);
	if (!a)
		return false;
	o->qid = a->qid;
	o->fk = a->fk;
	o->f = bpf_map_lookup_elem(&flows, &o->fk);
	o->by_entry = true;
	return true;
}

/* A drop of a matched answer later than this is of another copy of it. */
#define ANSWERED_MS 100

/* just_answered: the query whose answer with tuple t and DNS id this CPU
 * matched moments ago in netns, or 0. o->fk is scratch. */
static __always_inline __u64 just_answered(struct found *o, __u32 netns, const struct tuple *t, __u16 id)
{
	__u32 zero = 0;
	struct answered *a = bpf_map_lookup_elem(&last_answered, &zero);
	if (!a || !a->qid || a->netns != netns || !within_ms(a->ts, bpf_jiffies64(), ANSWERED_MS))
		return 0;
	key_from(&o->fk, t, id, true);
	if (!__builtin_memcmp(&o->fk, &a->fk, sizeof(o->fk)))
		return a->qid;
	return 0;
}

/* answer sends the ANSWER record when a response is where its query's
 * asker will see it, and ends the flow. */
static __always_inline bool answer(struct seen *s, const struct tuple *t, __u8 tier)
{
	struct found o;
	if (!lookup_answer(&o, s->netns, t, s->id))
		return false;
	if (o.by_entry) {
		struct ans_key ak = {.netns = s->netns};
		key_from(&ak.k, t, s->id, false);
		forget_answer(&ak);
	}
	if (!o.f || o.f->qid != o.qid)
		return false; /* answered already, through its other key */
	delete_flow(&o.fk);
	stat_inc(STAT_FLOWS_ANSWERED);
	__u32 zero = 0;
	struct answered *last = bpf_map_lookup_elem(&last_answered, &zero);
	if (last) {
		last->fk = o.fk;
		last->qid = o.qid;
		last->ts = bpf_jiffies64();
		last->netns = s->netns;
	}
	struct rec_answer r = {};
	fill_hdr(&r.h, REC_ANSWER, tier, o.qid, s->netns);
	r.dns_flags = s->flags;
	output(&r, sizeof(r));
	return true;
}

/* end_flow deletes the flow of k (or of k without a source address, as
 * lookup_flow finds it). */
static __always_inline void end_flow(struct flow_key *k)
{
	if (delete_flow(k) || tracepoint_mode)
		return;
	__builtin_memset(k->saddr, 0, 16);
	delete_flow(k);
}

#endif /* DNSRACE_LIB_FLOW_H */
