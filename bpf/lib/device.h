/* The tracepoint tier's device hooks: a query first seen at egress, its
 * hops, its answer, and the entries they carry.
 */
#ifndef DNSRACE_LIB_DEVICE_H
#define DNSRACE_LIB_DEVICE_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"
#include "config.h"
#include "conntrack.h"
#include "packet.h"
#include "maps.h"
#include "record.h"
#include "flow.h"
#include "ct_watch.h"

/* device is the body of net_dev_queue (egress: a query may be first seen
 * here) and netif_receive_skb (ingress: never a first sight; answers of
 * NAT in the asking namespace are recognised by a known reply port). A
 * query or answer carrying an entry is where a merge the netfilter program
 * set up shows (check_merge): the query's own egress after confirm, or for
 * a query a local server took (LOCAL_IN), its answer's. */
static __always_inline int device(struct sk_buff *skb, bool egress)
{
	struct seen *s = bpf_map_lookup_elem(&device_seen, &device_seen_key);
	if (!s)
		return 0;
	__builtin_memset(&s->p.t, 0, sizeof(s->p.t)); /* an IPv4 address leaves 12 bytes */
	if (!dns_packet(skb, s, true, !egress))
		return 0;
	s->netns = skb_netns(skb, NULL, true);
	if (!netns_match(s->netns))
		return 0;
	struct flow_key k;
	struct flow *f = NULL;
	if (s->response) {
		if (s->ct && s->ctinfo >= IP_CT_IS_REPLY) {
			/* its query's flow, by the entry's original tuple */
			key_from(&k, &s->orig, s->id, false);
			f = bpf_map_lookup_elem(&flows, &k);
			if (f && f->pre_ct)
				check_merge(s, f, f->qid, &k, 0);
		}
		answer(s, &s->p.t, TIER_TRACEPOINT);
		return 0;
	}
	/* Every hop looks its flow up, even an ingress without an entry: the
	 * flow's last sight, which tells its next hop from a resend, moves
	 * on with it. */
	query_key(&k, s);
	__u32 asker = 0;
	__u64 qid = track_query(s, skb, &k, egress, TIER_TRACEPOINT, 0, 0, &asker, &f);
	if (qid && s->ct && tracepoint_mode) {
		check_merge(s, f, qid, &k, (__u64)skb);
		note_ct(s, qid, asker, TIER_TRACEPOINT);
	}
	return 0;
}

#endif /* DNSRACE_LIB_DEVICE_H */
