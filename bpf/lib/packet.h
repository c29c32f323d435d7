/* Parsing an skb: IP and UDP headers, the DNS header, its namespace, and
 * whether it is a DNS packet by the tuple it was first seen with (or, for
 * an answer NAT has not reversed yet, by a known reply port).
 */
#ifndef DNSRACE_LIB_PACKET_H
#define DNSRACE_LIB_PACKET_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_core_read.h"
#include "bpf_endian.h"
#include "dnsrace.h"
#include "config.h"
#include "conntrack.h"
#include "packet_types.h"
#include "maps.h"

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

/* The headers and the first 4 payload bytes, in one read: the DNS id and
 * flags come with the headers (a second helper call saved per DNS packet
 * at every hook). The 4 bytes may lie past a short datagram's end; they
 * are used only when the payload holds a DNS header, and the read stays
 * inside the skb's buffer (skb_shared_info follows the data). */
struct ip4udp {
	struct iphdr ip;
	struct udphdr udp;
	__u16 dns[2];
};

struct ip6udp {
	struct ipv6hdr ip;
	struct udphdr udp;
	__u16 dns[2];
};

/* parse_skb reads the IPv4/IPv6 and UDP headers at skb->head +
 * network_header. The UDP header is located from the IP header length, not
 * transport_header, which is not set yet at netif_receive_skb. IPv6
 * extension headers are not followed (DNS does not use them). Returns false
 * for anything that is not a first-fragment UDP packet.
 *
 * This is the early exit of every packet the system sends or receives, so
 * it is kept short: with btf (tp_btf programs, where skb is a typed BTF
 * pointer) the sk_buff fields are direct loads instead of helper calls, and
 * the IP and UDP headers come in one read (a second one only for IPv4
 * options). */
static __always_inline bool parse_skb(struct sk_buff *skb, struct pkt *p, bool btf)
{
	__u16 proto;
	unsigned char *head;
	__u16 nh;
	if (btf) {
		proto = bpf_ntohs(skb->protocol);
		if (proto != ETH_P_IP && proto != ETH_P_IPV6)
			return false;
		head = skb->head;
		nh = skb->network_header;
	} else {
		proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
		if (proto != ETH_P_IP && proto != ETH_P_IPV6)
			return false;
		head = BPF_CORE_READ(skb, head);
		nh = BPF_CORE_READ(skb, network_header);
	}
	unsigned char *ip = head + nh;
	unsigned char *l4;
	struct udphdr uh;

	if (proto == ETH_P_IP) {
		struct ip4udp h;
		if (bpf_probe_read_kernel(&h, sizeof(h), ip))
			return false;
		if (h.ip.version != 4 || h.ip.protocol != IPPROTO_UDP)
			return false;
		if (h.ip.frag_off & bpf_htons(0x1fff))
			return false;
		l4 = ip + h.ip.ihl * 4;
		uh = h.udp;
		if (h.ip.ihl != 5 && bpf_probe_read_kernel(&uh, sizeof(uh), l4))
			return false;
		p->dns_read = h.ip.ihl == 5;
		__builtin_memcpy(p->dns, h.dns, sizeof(p->dns));
		__builtin_memcpy(p->t.saddr, &h.ip.saddr, 4);
		__builtin_memcpy(p->t.daddr, &h.ip.daddr, 4);
		p->t.family = 4;
	} else {
		struct ip6udp h;
		if (bpf_probe_read_kernel(&h, sizeof(h), ip))
			return false;
		if (h.ip.version != 6 || h.ip.nexthdr != IPPROTO_UDP)
			return false;
		l4 = ip + sizeof(h.ip);
		uh = h.udp;
		p->dns_read = true;
		__builtin_memcpy(p->dns, h.dns, sizeof(p->dns));
		__builtin_memcpy(p->t.saddr, &h.ip.saddr, 16);
		__builtin_memcpy(p->t.daddr, &h.ip.daddr, 16);
		p->t.family = 6;
	}
	p->t.sport = bpf_ntohs(uh.source);
	p->t.dport = bpf_ntohs(uh.dest);
	p->t.proto = IPPROTO_UDP;

	/* Payload: the UDP length, cut at the end of the linear data (DNS
	 * packets are linear; anything in frags is not read). */
	__u32 len = bpf_ntohs(uh.len);
	len = len > sizeof(uh) ? len - sizeof(uh) : 0;
	unsigned char *payload = l4 + sizeof(uh);
	__u32 tail = btf ? skb->tail : BPF_CORE_READ(skb, tail); /* offset from head on 64-bit */
	unsigned char *end = head + tail;
	if (payload >= end)
		len = 0;
	else if (payload + len > end)
		len = end - payload;
	p->payload = (__u64)payload;
	p->payload_len = len;
	return true;
}

/* skb_netns: the namespace of the skb's device, else of its socket or sk.
 * With btf (tp_btf programs: typed pointers) the chain is direct loads
 * (faulting reads the verifier checks): a helper call per pointer would
 * cost more than the rest of a non-DNS packet's early exit. */
static __always_inline __u32 skb_netns(struct sk_buff *skb, struct sock *sk, bool btf)
{
	if (btf) {
		/* nd_net and skc_net are RCU pointers: checked, not assumed */
		struct net *net = NULL;
		struct net_device *dev = skb->dev;
		if (dev)
			net = dev->nd_net.net;
		struct sock *own = skb->sk;
		barrier_var(own); /* one load: the checked pointer is the one used */
		if (!net && own)
			net = own->__sk_common.skc_net.net;
		if (!net && sk)
			net = sk->__sk_common.skc_net.net;
		return net ? net->ns.inum : 0;
	}
	__u32 inum = BPF_CORE_READ(skb, dev, nd_net.net, ns.inum);
	if (!inum)
		inum = BPF_CORE_READ(skb, sk, __sk_common.skc_net.net, ns.inum);
	if (!inum && sk)
		inum = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	return inum;
}

static __always_inline bool read_dns_hdr(struct seen *s)
{
	__u16 h[2] = {s->p.dns[0], s->p.dns[1]};
	if (s->p.payload_len < 12 || (!s->p.dns_read && bpf_probe_read_kernel(h, sizeof(h), (void *)s->p.payload)))
		return false;
	s->id = bpf_ntohs(h[0]);
	s->flags = bpf_ntohs(h[1]);
	s->response = s->flags & 0x8000;
	return true;
}

/* reply_port_known: a header source port answers of tracked flows use
 * (reply_ports). */
static __always_inline bool reply_port_known(__u16 port)
{
	__u32 w = port >> 6;
	__u64 *bits = bpf_map_lookup_elem(&reply_ports, &w);
	return bits && (*bits & (1ULL << (port & 63)));
}

/* dns_packet: is this a DNS packet by its first-sight tuple: the conntrack
 * original tuple when it has an entry (NAT may have rewritten the header),
 * else its header? With reply_ports, a header without an entry may also
 * come from a known reply port (an answer NAT in the asking namespace has
 * not reversed yet). */
static __always_inline bool dns_packet(struct sk_buff *skb, struct seen *s, bool btf, bool reply_ports)
{
	if (!parse_skb(skb, &s->p, btf))
		return false;
	s->ct = skb_ct(skb, btf, &s->ctinfo);
	if (s->ct) {
		read_tuple(&s->orig, s->ct, 0);
		if (s->orig.proto != IPPROTO_UDP || !dns_ports(&s->orig))
			return false;
	} else if (!dns_ports(&s->p.t) && !(reply_ports && reply_port_known(s->p.t.sport))) {
		return false;
	}
	return read_dns_hdr(s);
}

#endif /* DNSRACE_LIB_PACKET_H */
