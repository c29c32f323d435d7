/* The tracepoint tier's watch on conntrack entries, which stands in for
 * the confirm and clash hooks it has not got: entries seen confirmed, by
 * tuple (the winner of a later race for that tuple); losers awaiting their
 * winner; the entry each query had just before confirm (a merge shows as
 * another entry later); unconfirmed entries freed.
 */
#ifndef DNSRACE_LIB_CT_WATCH_H
#define DNSRACE_LIB_CT_WATCH_H

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

/* ---- entries confirmed ------------------------------------------------ */

/* A winner confirmed this long after its loser's drop is another flow
 * that got the same tuple later. */
#define AWAIT_MS 1000

static __always_inline void tuple_key(struct ct_tuple_key *k, __u32 netns, __u32 dir, const struct tuple *t)
{
	k->netns = netns;
	k->dir = dir;
	k->t = *t;
}

/* winner_of: a confirmed entry other than loser holding tuple t of the
 * given direction in netns, checked against the entry itself (the map may
 * remember one that has gone since). */
static __always_inline bool winner_of(struct event_buf *b, __u32 netns, __u32 dir, const struct tuple *t,
				      __u64 loser)
{
	struct ct_tuple_key k = {};
	tuple_key(&k, netns, dir, t);
	struct ct_ref *r = bpf_map_lookup_elem(&ct_tuples, &k);
	if (!r || r->ct == loser)
		return false;
	__u64 wqid = r->qid;
	read_ct(&b->r.winner, (struct nf_conn *)r->ct);
	struct tuple *held = dir ? &b->r.winner.reply : &b->r.winner.orig;
	if (!(b->r.winner.status & IPS_CONFIRMED) || __builtin_memcmp(held, t, sizeof(*t))) {
		__builtin_memset(&b->r.winner, 0, sizeof(b->r.winner));
		return false;
	}
	b->r.winner_qid = wqid;
	b->r.flags |= RF_WINNER;
	return true;
}

static __always_inline void await_winner(__u32 netns, __u32 dir, const struct tuple *t, __u64 qid)
{
	struct ct_tuple_key k = {};
	tuple_key(&k, netns, dir, t);
	struct awaited a = {.qid = qid, .ts = bpf_jiffies64()};
	bpf_map_update_elem(&unresolved, &k, &a, BPF_ANY);
}

static __always_inline void forget_await(__u32 netns, __u32 dir, const struct tuple *t)
{
	struct ct_tuple_key k = {};
	tuple_key(&k, netns, dir, t);
	bpf_map_delete_elem(&unresolved, &k);
}

/* resolve_late: a loser dropped moments before this entry (t, dir) was
 * seen confirmed lost the race to it. */
static __always_inline void resolve_late(__u32 netns, __u32 dir, const struct tuple *t, struct nf_conn *ct,
					 __u64 qid, __u8 tier)
{
	struct ct_tuple_key k = {};
	tuple_key(&k, netns, dir, t);
	struct awaited *a = bpf_map_lookup_elem(&unresolved, &k);
	if (!a)
		return;
	__u64 lq = a->qid;
	bool recent = within_ms(a->ts, bpf_jiffies64(), AWAIT_MS);
	bpf_map_delete_elem(&unresolved, &k);
	if (!recent)
		return;
	struct event_buf *b = new_event();
	if (!b)
		return;
	read_ct(&b->r.winner, ct);
	b->r.winner_qid = qid;
	b->r.flags = RF_WINNER;
	emit_event(b, EV_WINNER, tier, lq, netns, 0, 0);
}

/* expect_at_reply: NAT ran in the asking namespace itself, so the answer
 * arrives there with the entry's reply tuple, before that namespace
 * reverses it. A reply source port that is not a DNS port is remembered
 * for the receive hook's filter. A full answers table is said
 * (EV_UNTRACKED): the answer will not be matched. */
static __always_inline void expect_at_reply(struct seen *s, __u64 qid, const struct tuple *reply, __u8 tier)
{
	struct ans_key ak = {.netns = s->netns};
	key_from(&ak.k, reply, s->id, false);
	struct ans a = {.qid = qid};
	query_key(&a.fk, s);
	if (!expect_answer(&ak, &a)) {
		struct event_buf *b = new_event();
		if (b)
			emit_event(b, EV_UNTRACKED, tier, qid, s->netns, 0, 0);
	}
	if (!port_in(reply->sport)) {
		__u32 w = reply->sport >> 6;
		__u64 *bits = bpf_map_lookup_elem(&reply_ports, &w);
		if (bits)
			*bits |= 1ULL << (reply->sport & 63);
	}
}

/* tuple_reversed: a is b the other way round, so no NAT changed the
 * entry. When NAT did, in the asking namespace itself, the answers arrive
 * there with the entry's reply tuple rather than the flow's key reversed. */
static __always_inline bool tuple_reversed(const struct tuple *a, const struct tuple *b)
{
	return !__builtin_memcmp(a->saddr, b->daddr, 16) && !__builtin_memcmp(a->daddr, b->saddr, 16) &&
	       a->sport == b->dport && a->dport == b->sport;
}

/* seen_marked: the entry is already known (seen confirmed, or reported as
 * a NAT_CLASH loser) under this original tuple; *m is its mark. */
static __always_inline struct ctmark *seen_marked(struct seen *s)
{
	__u64 ctp = (__u64)s->ct;
	struct ctmark *m = bpf_map_lookup_elem(&cts, &ctp);
	if (m && (m->flags & (CTM_CONFIRMED | CTM_NAT_CLASH)) && !__builtin_memcmp(&m->orig, &s->orig, sizeof(s->orig)))
		return m;
	return NULL;
}

/* mark_is_its_own: a mark found by seen_marked speaks for this entry, not
 * for an earlier one at the same address with the same original tuple: the
 * same socket's earlier flow, freed (it expired) and its memory handed to
 * the socket's next flow. Marks outlive their entries where no slab-free
 * program runs (6.4+), and the slab may hand a CPU's next entry the one it
 * freed last, far more often since 7.0 (e47c897a2949, "slab: add sheaves
 * to most caches").
 * The earlier one's NAT mapping was another: the entry the mark is of is
 * the one ct_tuples knows by the reply tuple. Without NAT, then or now, the
 * two hold the same tuples at the same address, and the maps are right for
 * both. */
static __always_inline bool mark_is_its_own(const struct ctmark *m, const struct seen *s, const struct tuple *reply,
					    struct ct_tuple_key *k)
{
	if (!(m->flags & CTM_NAT) && tuple_reversed(reply, &s->orig))
		return true;
	tuple_key(k, s->netns, 1, reply);
	struct ct_ref *r = bpf_map_lookup_elem(&ct_tuples, k);
	return r && r->ct == (__u64)s->ct;
}

/* note_ct runs where a tracked query's packet carries an entry (device
 * hooks): the first time an entry is seen confirmed it is remembered by
 * both tuples and losers waiting for it are resolved; a loser inserted
 * reply-only (NAT_CLASH) is reported once. Where NAT ran in the asking
 * namespace, every query's answer is also expected by the reply tuple
 * (elsewhere the flow's key reversed finds it: no entry needed). */
static __always_inline void note_ct(struct seen *s, __u64 qid, __u32 asker, __u8 tier)
{
	__u64 ctp = (__u64)s->ct;
	struct tuple reply = {};
	struct ct_tuple_key k = {};
	read_tuple(&reply, s->ct, 1);
	__u32 nat = tuple_reversed(&reply, &s->orig) ? 0 : CTM_NAT;
	struct ctmark *m = seen_marked(s);
	if (m && mark_is_its_own(m, s, &reply, &k)) {
		if (nat && s->netns == asker)
			expect_at_reply(s, qid, &reply, tier);
		return;
	}
	struct nf_conn *ct = s->ct; /* a plain local: CO-RE must not relocate seen */
	__u32 status = BPF_CORE_READ(ct, status);
	if (!(status & (IPS_CONFIRMED | IPS_NAT_CLASH)))
		return;
	announce_netns(s->netns, tier);
	if (nat && s->netns == asker)
		expect_at_reply(s, qid, &reply, tier);
	struct ct_ref ref = {.ct = ctp, .qid = qid};
	if (status & IPS_NAT_CLASH) {
		/* Inserted in the reply direction only: it holds its reply
		 * tuple; the original one belongs to the winner. */
		struct ctmark nm = {.qid = qid, .flags = CTM_NAT_CLASH | nat, .orig = s->orig};
		bpf_map_update_elem(&cts, &ctp, &nm, BPF_ANY);
		tuple_key(&k, s->netns, 1, &reply);
		bpf_map_update_elem(&ct_tuples, &k, &ref, BPF_ANY);
		struct event_buf *b = new_event();
		if (!b)
			return;
		read_ct(&b->r.ct, s->ct);
		b->r.pkt = s->p.t;
		winner_of(b, s->netns, 0, &b->r.ct.orig, ctp);
		emit_event(b, EV_NAT_CLASH, tier, qid, s->netns, 0, 0);
		return;
	}
	struct ctmark nm = {.qid = qid, .flags = CTM_CONFIRMED | nat, .orig = s->orig};
	bpf_map_update_elem(&cts, &ctp, &nm, BPF_ANY);
	tuple_key(&k, s->netns, 0, &s->orig);
	bpf_map_update_elem(&ct_tuples, &k, &ref, BPF_ANY);
	tuple_key(&k, s->netns, 1, &reply);
	bpf_map_update_elem(&ct_tuples, &k, &ref, BPF_ANY);
	resolve_late(s->netns, 1, &reply, s->ct, qid, tier);
	resolve_late(s->netns, 0, &s->orig, s->ct, qid, tier);
}

/* ---- merges: the entry just before confirm and after (6.4+) ----------- */

/* A packet reaches its device this soon after confirm (a neighbour
 * resolution may hold it for a while). */
#define PRECONFIRM_MS 1000

/* check_merge compares the entry a query's packet (skb, at its next device;
 * f is NULL when the flow starts there) or its answer (skb 0: a query a
 * local server took at LOCAL_IN shows only by its answer) carries with the
 * one the netfilter program saw on the query just before confirm: another
 * one means confirm merged the query, a clash loser, into the winner it
 * carries now (__nf_ct_resolve_clash: the loser's entry is freed, the skb
 * takes the winner's). The flow's pre_ct (the last of its packets the
 * program saw) serves the answer; after a verdict it is forgotten. Not
 * inlined: device() has no stack left for it. */
static __noinline void check_merge(struct seen *s, struct flow *f, __u64 qid, const struct flow_key *fk, __u64 skb)
{
	__u64 pre;
	if (skb) {
		/* this very packet's entry: a copy of the flow racing it has
		 * its own */
		struct preconfirm *p = bpf_map_lookup_elem(&preconfirm, &skb);
		if (!p)
			return;
		pre = p->netns == s->netns && within_ms(p->ts, bpf_jiffies64(), PRECONFIRM_MS) ? p->ct : 0;
		bpf_map_delete_elem(&preconfirm, &skb);
	} else {
		pre = f ? f->pre_ct : 0;
	}
	if (f)
		f->pre_ct = 0;
	if (!pre || pre == (__u64)s->ct)
		return;
	struct event_buf *b = new_event();
	if (!b)
		return;
	/* The loser is freed: a merge needs its tuples to be the winner's,
	 * and its address is all that is left of it. */
	read_ct(&b->r.winner, s->ct);
	b->r.ct = b->r.winner;
	b->r.ct.ptr = pre;
	b->r.ct.status = 0;
	b->r.flags = RF_WINNER;
	b->r.pkt.sport = fk->sport;
	b->r.pkt.dport = fk->dport;
	b->r.pkt.family = fk->family;
	b->r.pkt.proto = IPPROTO_UDP;
	__builtin_memcpy(b->r.pkt.saddr, fk->saddr, 16);
	__builtin_memcpy(b->r.pkt.daddr, fk->daddr, 16);
	emit_event(b, EV_MERGED, TIER_TRACEPOINT, qid, s->netns, 0, 0); /* where confirm ran */
}

/* ---- unconfirmed entries freed (before 6.4) --------------------------- */

/* ct_freed reports an unconfirmed DNS entry freed without its packet being
 * dropped: the loser of a clash the kernel merged into the winner (its
 * packet left with the winner's entry, so no device saw the loser's). */
static __always_inline int ct_freed(struct nf_conn *ct)
{
	__u32 status = BPF_CORE_READ(ct, status);
	struct tuple orig = {};
	read_tuple(&orig, ct, 0);
	if (orig.proto != IPPROTO_UDP || !dns_ports(&orig))
		return 0;
	__u64 ctp = (__u64)ct;
	if (status & (IPS_CONFIRMED | IPS_NAT_CLASH)) {
		/* Its mark must not outlive it: the next entry at this
		 * address may be the same socket's next flow. */
		bpf_map_delete_elem(&cts, &ctp);
		return 0;
	}
	__u32 netns = BPF_CORE_READ(ct, ct_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;
	struct ctmark *m = bpf_map_lookup_elem(&cts, &ctp);
	bool dropped = m && (m->flags & CTM_DROPPED) && !__builtin_memcmp(&m->orig, &orig, sizeof(orig));
	if (m)
		bpf_map_delete_elem(&cts, &ctp);
	if (dropped)
		return 0;
	struct event_buf *b = new_event();
	if (!b)
		return 0;
	read_ct(&b->r.ct, ct);
	emit_event(b, EV_CT_FREED, TIER_TRACEPOINT, 0, netns, 0, 0);
	return 0;
}

#endif /* DNSRACE_LIB_CT_WATCH_H */
