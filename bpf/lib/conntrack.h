/* Reading conntrack entries (struct nf_conn) and the entry an skb carries,
 * and the kernel's conntrack constants vmlinux.h has no macros for.
 */
#ifndef DNSRACE_LIB_CONNTRACK_H
#define DNSRACE_LIB_CONNTRACK_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_core_read.h"
#include "bpf_endian.h"
#include "dnsrace.h"

#define AF_INET 2
#define AF_INET6 10
#define NFCT_PTRMASK (~7UL)
#define NFCT_INFOMASK 7
#define IP_CT_IS_REPLY 3
#define IPS_CONFIRMED (1 << 3)
/* kernel-only alias of IPS_UNTRACKED: nf_ct_resolve_clash_harder's loser
 * inserted reply-only (6a757c07e51f, v5.6) */
#define IPS_NAT_CLASH (1 << 12)
#define NF_DROP 0
#define NF_ACCEPT 1

/* nf_conntrack_tuple has kept its layout since long before 5.10: one read
 * of the whole tuple, relocated at the tuplehash it lives in. */
static __always_inline void read_tuple(struct tuple *t, struct nf_conn *ct, int dir)
{
	struct nf_conntrack_tuple kt;
	/* constant indexes: CO-RE relocates each access on its own */
	void *src = dir ? (void *)&ct->tuplehash[1].tuple : (void *)&ct->tuplehash[0].tuple;
	if (bpf_probe_read_kernel(&kt, sizeof(kt), src)) {
		t->family = 0;
		return;
	}
	__u16 l3 = kt.src.l3num;
	t->family = l3 == AF_INET ? 4 : (l3 == AF_INET6 ? 6 : 0);
	t->proto = kt.dst.protonum;
	__builtin_memcpy(t->saddr, &kt.src.u3, 16);
	__builtin_memcpy(t->daddr, &kt.dst.u3, 16);
	if (t->family == 4) {
		__builtin_memset(t->saddr + 4, 0, 12);
		__builtin_memset(t->daddr + 4, 0, 12);
	}
	t->sport = bpf_ntohs(kt.src.u.all);
	t->dport = bpf_ntohs(kt.dst.u.all);
}

static __always_inline void read_ct(struct ct *c, struct nf_conn *ct)
{
	c->ptr = (__u64)ct;
	if (!ct)
		return;
	c->status = BPF_CORE_READ(ct, status);
	read_tuple(&c->orig, ct, 0);
	read_tuple(&c->reply, ct, 1);
}

static __always_inline struct nf_conn *skb_ct(struct sk_buff *skb, bool btf, __u8 *ctinfo)
{
	if (!bpf_core_field_exists(skb->_nfct))
		return NULL;
	__u64 nfct = btf ? skb->_nfct : BPF_CORE_READ(skb, _nfct);
	*ctinfo = nfct & NFCT_INFOMASK;
	return (struct nf_conn *)(nfct & NFCT_PTRMASK);
}

#endif /* DNSRACE_LIB_CONNTRACK_H */
