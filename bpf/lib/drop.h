/* Drops of DNS packets, in every tier: skb:kfree_skb, and an answer
 * refused by a full receive buffer.
 */
#ifndef DNSRACE_LIB_DROP_H
#define DNSRACE_LIB_DROP_H

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
#include "ct_watch.h"

/* drop_is_final: a query dropped for this reason was at its destination
 * (its server's socket was full, or there was none), so no answer can
 * follow it. Its flow ends there: when a flooded server drops queries by
 * the thousand, their flows would otherwise fill the map and the LRU would
 * evict flows still waiting for their answers. Other drops may be of one
 * copy among several (a bridge floods a frame to every port, and the
 * copies other hosts get are dropped), so they leave the flow; so does
 * every drop before 5.17, which names no reason. The reasons' values
 * differ between kernels: CO-RE gives this kernel's. */
static __always_inline bool drop_is_final(__u32 reason)
{
	if (!reason)
		return false;
	if (bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_SOCKET_RCVBUFF) &&
	    reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_SOCKET_RCVBUFF))
		return true;
	return bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_NO_SOCKET) &&
	       reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_NO_SOCKET);
}

/* drop_is_deferred: a packet dropped for this reason waited in a
 * neighbour's queue (the address it was sent to did not answer), so the
 * drop comes long after the packet's last hop: it is of the flow the
 * packet belongs to however old, never a resend. */
static __always_inline bool drop_is_deferred(__u32 reason)
{
	if (!reason)
		return false;
#define DEFERRED(r)                                                                                                    \
	(bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_##r) &&                                      \
	 reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_##r))
	if (DEFERRED(NEIGH_FAILED) || DEFERRED(NEIGH_QUEUEFULL) || DEFERRED(NEIGH_DEAD))
		return true;
#undef DEFERRED
	return bpf_core_enum_value_exists(enum skb_drop_reason___dnsrace, SKB_DROP_REASON_QUEUE_PURGE___dnsrace) &&
	       reason == bpf_core_enum_value(enum skb_drop_reason___dnsrace, SKB_DROP_REASON_QUEUE_PURGE___dnsrace);
}

/* drop reports a DNS packet freed by kfree_skb. A query may be first seen
 * here (NAT in its own namespace dropped it before any device did). In the
 * tracepoint tier an unconfirmed entry's drop looks for the entry that
 * holds its reply tuple (another flow got the same mapping) or its original
 * tuple (the same socket's other packet), else waits for it (unresolved).
 * Its records say TIER_TRACEPOINT in every tier: kfree_skb is a tracepoint
 * in all of them. btf: skb and rx_sk are typed pointers (tp_btf), not
 * plain addresses (the perf tracepoint's record). */
static __always_inline int drop(struct sk_buff *skb, __u64 location, __u32 reason, struct sock *rx_sk, bool btf)
{
	struct seen s = {};
	if (!dns_packet(skb, &s, btf, false))
		return 0;
	s.netns = skb_netns(skb, rx_sk, btf);
	if (!netns_match(s.netns))
		return 0;
	__u64 qid = 0;
	__u32 len = 0;
	__u8 flags = 0;
	if (s.response) {
		flags = RF_RESPONSE;
		struct found o;
		if (lookup_answer(&o, s.netns, &s.p.t, s.id)) {
			qid = o.qid;
		} else if (s.ct && s.ctinfo >= IP_CT_IS_REPLY) {
			struct flow_key k;
			key_from(&k, &s.orig, s.id, false);
			struct flow *f = lookup_flow(&k);
			if (f)
				qid = f->qid;
		}
		if (!qid)
			qid = just_answered(&o, s.netns, &s.p.t, s.id);
		if (!qid)
			len = s.p.payload_len; /* user space matches it by question */
	} else {
		struct flow_key k;
		struct flow *f;
		query_key(&k, &s);
		__u32 asker = 0;
		f = drop_is_deferred(reason) ? lookup_flow(&k) : NULL;
		if (f) {
			qid = f->qid;
			asker = f->netns;
		} else {
			qid = track_query(&s, skb, &k, true, TIER_TRACEPOINT,
					  RF_AT_DROP | (tracepoint_mode ? 0 : RF_NO_SOCKET), 0, &asker, &f);
		}
		if (f)
			f->pre_ct = 0; /* if confirm judged it, this drop was its verdict */
		if (tracepoint_mode) {
			__u64 skbp = (__u64)skb;
			bpf_map_delete_elem(&preconfirm, &skbp);
		}
		if (qid && drop_is_final(reason))
			end_flow(&k);
		flags = sender_of(skb);
	}
	if (s.ct)
		announce_netns(s.netns, TIER_TRACEPOINT); /* before b: it uses the scratch */
	struct event_buf *b = new_event();
	if (!b)
		return 0;
	b->r.location = location;
	b->r.reason = reason;
	b->r.pkt = s.p.t;
	b->r.flags = flags;
	if (s.ct) {
		read_ct(&b->r.ct, s.ct);
		if (tracepoint_mode && !s.response && !(b->r.ct.status & IPS_CONFIRMED)) {
			__u64 ctp = (__u64)s.ct;
			struct ctmark m = {.qid = qid, .flags = CTM_DROPPED, .orig = b->r.ct.orig};
			bpf_map_update_elem(&cts, &ctp, &m, BPF_ANY);
			/* The holder of its reply tuple (another flow given the
			 * same mapping) is the winner; it may be confirmed on
			 * another CPU and not have reached a device yet: then it
			 * is awaited, and looked up once more in case it got
			 * there meanwhile. Failing that, the holder of its
			 * original tuple (the same socket's other packet). */
			if (!winner_of(b, s.netns, 1, &b->r.ct.reply, ctp)) {
				await_winner(s.netns, 1, &b->r.ct.reply, qid);
				if (winner_of(b, s.netns, 1, &b->r.ct.reply, ctp)) {
					forget_await(s.netns, 1, &b->r.ct.reply);
				} else if (!winner_of(b, s.netns, 0, &b->r.ct.orig, ctp)) {
					await_winner(s.netns, 0, &b->r.ct.orig, qid);
					if (winner_of(b, s.netns, 0, &b->r.ct.orig, ctp))
						forget_await(s.netns, 0, &b->r.ct.orig);
				}
			}
		}
	}
	emit_event(b, EV_DROP, TIER_TRACEPOINT, qid, s.netns, s.p.payload, len);
	return 0;
}

/* A full receive buffer: the answer is dropped at the asking socket. */
static __always_inline int rcvbuf_full(struct sk_buff *skb, struct sock *sk)
{
	struct seen s = {};
	if (!parse_skb(skb, &s.p, true) || !dns_ports(&s.p.t) || !read_dns_hdr(&s) || !s.response)
		return 0;
	s.netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(s.netns))
		return 0;
	struct found o;
	__u64 qid = lookup_answer(&o, s.netns, &s.p.t, s.id) ? o.qid : just_answered(&o, s.netns, &s.p.t, s.id);
	struct event_buf *b = new_event();
	if (!b)
		return 0;
	b->r.flags = RF_RESPONSE;
	b->r.pkt = s.p.t;
	emit_event(b, EV_RCVBUF_FULL, TIER_TRACEPOINT, qid, s.netns, s.p.payload, qid ? 0 : s.p.payload_len);
	return 0;
}

#endif /* DNSRACE_LIB_DROP_H */
