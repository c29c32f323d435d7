/* UDP sockets in the fentry and kprobe tiers: a query sent (udp_sendmsg,
 * udpv6_sendmsg) and an answer delivered (skb_consume_udp).
 */
#ifndef DNSRACE_LIB_SOCKET_H
#define DNSRACE_LIB_SOCKET_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_core_read.h"
#include "bpf_endian.h"
#include "dnsrace.h"
#include "core_fixes.bpf.h"
#include "config.h"
#include "packet.h"
#include "flow.h"

/* skb_consume_udp(sk, skb, len): called by udp(v6)_recvmsg after copying a
 * datagram to the socket's reader (exported, so never inlined away): the
 * answer reached the asking socket. UDP clears skb->dev: the netns is the
 * socket's. */
static __always_inline int deliver(struct sk_buff *skb, struct sock *sk, __u8 tier)
{
	struct seen s = {};
	if (!parse_skb(skb, &s.p, false) || !dns_ports(&s.p.t) || !read_dns_hdr(&s) || !s.response)
		return 0;
	s.netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (netns_match(s.netns))
		answer(&s, &s.p.t, tier);
	return 0;
}

/* user_payload finds the start of the message in the msghdr's iov_iter:
 * ITER_UBUF (v6.0, one user buffer), ITER_IOVEC (first iovec), or before
 * v5.14 the "type" bitmask with ITER_IOVEC. */
static __always_inline bool user_payload(struct msghdr *msg, __u64 *base, __u64 *avail)
{
	struct iov_iter *it = &msg->msg_iter;
	const struct iovec *iov;
	__u64 off;
	if (bpf_core_field_exists(it->iter_type)) {
		__u8 type = BPF_CORE_READ(it, iter_type);
		off = BPF_CORE_READ(it, iov_offset);
		if (bpf_core_enum_value_exists(enum iter_type, ITER_UBUF) &&
		    type == bpf_core_enum_value(enum iter_type, ITER_UBUF)) {
			*base = (__u64)BPF_CORE_READ(it, ubuf) + off;
			*avail = BPF_CORE_READ(it, count);
			return true;
		}
		if (type != bpf_core_enum_value(enum iter_type, ITER_IOVEC))
			return false;
		struct iov_iter___v64 *it64 = (void *)it;
		if (bpf_core_field_exists(it64->__iov))
			iov = BPF_CORE_READ(it64, __iov);
		else
			iov = BPF_CORE_READ((struct iov_iter___pre64 *)it, iov);
	} else {
		struct iov_iter___pre514 *old = (void *)it;
		if (!(BPF_CORE_READ(old, type) & bpf_core_enum_value(enum iter_type, ITER_IOVEC)))
			return false;
		off = BPF_CORE_READ(old, iov_offset);
		iov = BPF_CORE_READ(old, iov);
	}
	__u64 len = BPF_CORE_READ(iov, iov_len);
	*base = (__u64)BPF_CORE_READ(iov, iov_base) + off;
	*avail = len > off ? len - off : 0;
	return true;
}

static __always_inline bool v4mapped(const __u8 *a)
{
	for (int i = 0; i < 10; i++)
		if (a[i])
			return false;
	return a[10] == 0xff && a[11] == 0xff;
}

/* send starts a flow for a DNS query handed to udp_sendmsg or
 * udpv6_sendmsg: every send is a new query. udpv6_sendmsg passes a
 * v4-mapped destination on to udp_sendmsg, which reports it, so the v6 hook
 * skips those (v6 = true). */
static __always_inline int send(struct sock *sk, struct msghdr *msg, __u8 tier, bool v6)
{
	struct tuple t = {};
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	void *name = BPF_CORE_READ(msg, msg_name);

	t.sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	if (name) {
		/* unconnected socket: the destination is msg_name */
		struct sockaddr_in6 sa = {};
		bpf_probe_read_kernel(&sa, sizeof(sa), name);
		t.dport = bpf_ntohs(sa.sin6_port);
		if (!port_in(t.sport) && !port_in(t.dport))
			return 0;
		if (sa.sin6_family == AF_INET6) {
			t.family = 6;
			__builtin_memcpy(t.daddr, &sa.sin6_addr, 16);
		} else {
			t.family = 4;
			__builtin_memcpy(t.daddr, &((struct sockaddr_in *)&sa)->sin_addr, 4);
		}
	} else {
		t.dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
		if (!port_in(t.sport) && !port_in(t.dport))
			return 0;
		if (family == AF_INET6) {
			t.family = 6;
			bpf_core_read(t.daddr, 16, &sk->__sk_common.skc_v6_daddr);
		} else {
			t.family = 4;
			bpf_core_read(t.daddr, 4, &sk->__sk_common.skc_daddr);
		}
	}
	if (family == AF_INET6)
		bpf_core_read(t.saddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
	else
		bpf_core_read(t.saddr, 4, &sk->__sk_common.skc_rcv_saddr);
	if (t.family == 4 && family == AF_INET6) {
		/* v4 destination on a v6 socket: keep the source in v4 form
		 * when it is v4-mapped (::ffff:a.b.c.d), else leave it zero */
		__u8 src[16];
		__builtin_memcpy(src, t.saddr, 16);
		__builtin_memset(t.saddr, 0, 16);
		if (src[10] == 0xff && src[11] == 0xff)
			__builtin_memcpy(t.saddr, &src[12], 4);
	}
	if (v6 && t.family == 6 && v4mapped(t.daddr))
		return 0;
	t.proto = IPPROTO_UDP;

	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;
	__u64 base = 0, avail = 0;
	if (!user_payload(msg, &base, &avail) || avail < 12)
		return 0;
	__u16 h[2];
	if (bpf_probe_read_user(h, sizeof(h), (void *)base))
		return 0;
	if (bpf_ntohs(h[1]) & 0x8000)
		return 0; /* a response (a DNS server's send) */
	struct flow_key k;
	key_from(&k, &t, bpf_ntohs(h[0]), false);
	new_flow(&k, netns, base, avail > DNS_CAP ? DNS_CAP : avail, true, tier, RF_SENDER, 0);
	return 0;
}

#endif /* DNSRACE_LIB_SOCKET_H */
