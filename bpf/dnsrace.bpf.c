//go:build ignore

/* dnsrace kernel side: one raw struct event per hook hit on a DNS packet.
 *
 * Every program filters first: a packet that is not UDP to or from
 * cfg.port leaves after reading the IP and UDP headers, before any map or
 * ring buffer access. Programs come in three tiers (tp_btf, kprobe, fentry);
 * the loader (internal/probe) picks one per hook and only loads those.
 */
#include "vmlinux.h"
#include "bpf_helpers.h"
#include "bpf_tracing.h"
#include "bpf_core_read.h"
#include "bpf_endian.h"

#include "dnsrace.h"
#include "core_fixes.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define AF_INET 2
#define AF_INET6 10
#define NFCT_PTRMASK (~7UL)
#define CONFIRM_DEPTH 4

/* Emit the types bpf2go generates Go code for (-type). */
const struct event *unused_event __attribute__((unused));
const enum kind *unused_kind __attribute__((unused));
const enum tier *unused_tier __attribute__((unused));

volatile const struct config cfg = {
	.port = 53,
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22); /* the loader sets the real size */
} events SEC(".maps");

/* Ring buffer reserve failures, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Address of the nf_conntrack kmem_cache once kmem_cache_free saw it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} ct_cachep SEC(".maps");

/* fentry tier: the event built at fentry/__nf_conntrack_confirm, keyed by
 * skb address, completed at fexit (which sees the same skb argument). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct event);
} confirm_entry SEC(".maps");

/* kprobe tier: a kretprobe does not see the skb argument, so the entry keeps
 * a small per-CPU stack of pending calls. Calls on one CPU return in LIFO
 * order (a softirq confirm can nest inside a process-context one); every
 * entry pushes, even for non-DNS packets (valid = 0), so returns stay
 * paired. */
struct confirm_slot {
	__u64 skb;
	__u32 valid;
	__u32 _pad;
	struct event ev;
};

struct confirm_stack {
	__u32 depth;
	__u32 _pad;
	struct confirm_slot slot[CONFIRM_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct confirm_stack);
} confirm_stack SEC(".maps");

/* Scratch for building an event outside the ring buffer (the stack is too
 * small for it). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event);
} scratch SEC(".maps");

/* What the header parse of an skb found. */
struct pkt {
	struct tuple t;
	__u64 payload; /* kernel address of the UDP payload */
	__u32 payload_len;
};

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lost, &zero);
	if (n)
		*n += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline bool port_match(__u16 sport, __u16 dport)
{
	return sport == cfg.port || dport == cfg.port;
}

/* parse_skb reads the IPv4/IPv6 and UDP headers at skb->head +
 * network_header. The UDP header is located from the IP header length, not
 * transport_header, which is not set yet at netif_receive_skb. IPv6
 * extension headers are not followed (DNS does not use them). Returns false
 * for anything that is not a first-fragment UDP packet to or from cfg.port.
 *
 * This is the early exit of every packet the system sends or receives, so
 * it is kept short: with btf (tp_btf programs, where skb is a typed BTF
 * pointer) the sk_buff fields are direct loads instead of helper calls,
 * and the IP and UDP headers come in one read (a second one only for IPv4
 * options). Measured per call on 6.18 (bpf_stats, non-DNS UDP):
 * net_dev_queue 128 ns and netif_receive_skb 116 ns with five helper reads
 * (docs/performance.md). */
struct ip4udp {
	struct iphdr ip;
	struct udphdr udp;
};

struct ip6udp {
	struct ipv6hdr ip;
	struct udphdr udp;
};

static __always_inline bool parse_skb_tier(struct sk_buff *skb, struct pkt *p, bool btf)
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
		p->t.sport = bpf_ntohs(uh.source);
		p->t.dport = bpf_ntohs(uh.dest);
		if (!port_match(p->t.sport, p->t.dport))
			return false;
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
		p->t.sport = bpf_ntohs(uh.source);
		p->t.dport = bpf_ntohs(uh.dest);
		if (!port_match(p->t.sport, p->t.dport))
			return false;
		__builtin_memcpy(p->t.saddr, &h.ip.saddr, 16);
		__builtin_memcpy(p->t.daddr, &h.ip.daddr, 16);
		p->t.family = 6;
	}
	p->t.proto = IPPROTO_UDP;

	/* Payload: the UDP length, cut at the end of the linear data (DNS
	 * packets are linear; anything in frags is not read). */
	__u32 len = bpf_ntohs(uh.len);
	len = len > sizeof(uh) ? len - sizeof(uh) : 0;
	unsigned char *payload = l4 + sizeof(uh);
	__u32 tail = BPF_CORE_READ(skb, tail); /* offset from head on 64-bit */
	unsigned char *end = head + tail;
	if (payload >= end)
		len = 0;
	else if (payload + len > end)
		len = end - payload;
	p->payload = (__u64)payload;
	p->payload_len = len;
	return true;
}

/* parse_skb: the helper-read variant (kprobe and fentry callers). */
static __always_inline bool parse_skb(struct sk_buff *skb, struct pkt *p)
{
	return parse_skb_tier(skb, p, false);
}

static __always_inline __u32 skb_netns(struct sk_buff *skb)
{
	__u32 inum = BPF_CORE_READ(skb, dev, nd_net.net, ns.inum);
	if (!inum)
		inum = BPF_CORE_READ(skb, sk, __sk_common.skc_net.net, ns.inum);
	return inum;
}

static __always_inline bool netns_match(__u32 inum)
{
	return cfg.netns == 0 || cfg.netns == inum;
}

static __always_inline void read_tuple(struct tuple *t, struct nf_conntrack_tuple *kt)
{
	__u16 l3 = BPF_CORE_READ(kt, src.l3num);
	t->family = l3 == AF_INET ? 4 : (l3 == AF_INET6 ? 6 : 0);
	t->proto = BPF_CORE_READ(kt, dst.protonum);
	bpf_core_read(t->saddr, sizeof(t->saddr), &kt->src.u3);
	bpf_core_read(t->daddr, sizeof(t->daddr), &kt->dst.u3);
	t->sport = bpf_ntohs(BPF_CORE_READ(kt, src.u.all));
	t->dport = bpf_ntohs(BPF_CORE_READ(kt, dst.u.all));
}

static __always_inline void read_ct(struct ct *c, struct nf_conn *ct)
{
	c->ptr = (__u64)ct;
	if (!ct)
		return;
	c->status = BPF_CORE_READ(ct, status);
	read_tuple(&c->orig, &ct->tuplehash[0].tuple);
	read_tuple(&c->reply, &ct->tuplehash[1].tuple);
}

static __always_inline struct nf_conn *skb_ct(struct sk_buff *skb)
{
	if (!bpf_core_field_exists(skb->_nfct))
		return NULL;
	return (struct nf_conn *)(BPF_CORE_READ(skb, _nfct) & NFCT_PTRMASK);
}

static __always_inline void copy_payload_kernel(struct event *e, const struct pkt *p)
{
	__u32 n = p->payload_len;
	if (n > DNS_CAP)
		n = DNS_CAP;
	e->dns_len = n;
	bpf_probe_read_kernel(e->dns, n & 0x1ff, (void *)p->payload);
}

/* fill_common sets the fields every event has. The ring buffer memory is
 * not zeroed, so it clears the rest explicitly. */
static __always_inline void fill_common(struct event *e, __u8 kind, __u8 tier)
{
	__builtin_memset(e, 0, sizeof(*e) - DNS_CAP);
	e->ts = bpf_ktime_get_ns();
	e->kind = kind;
	e->tier = tier;
	e->cpu = bpf_get_smp_processor_id();
	e->verdict = -1;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
}

static __always_inline void fill_skb(struct event *e, struct sk_buff *skb, const struct pkt *p,
				     __u32 netns)
{
	e->skb = (__u64)skb;
	e->netns = netns;
	e->ifindex = BPF_CORE_READ(skb, dev, ifindex);
	if (!e->ifindex) /* dev cleared after receive: the arrival device */
		e->ifindex = BPF_CORE_READ(skb, skb_iif);
	e->pkt = p->t;
	read_ct(&e->ct, skb_ct(skb));
	copy_payload_kernel(e, p);
}

/* emit_skb is the whole body of the simple skb hooks. Returns 1 when the
 * skb was a DNS packet of the filtered netns (even if the ring buffer was
 * full), else 0. */
static __always_inline int emit_skb_tier(struct sk_buff *skb, __u8 kind, __u64 location,
					 __u32 reason, struct sock *rx_sk, __u8 tier)
{
	struct pkt p = {};
	if (!parse_skb_tier(skb, &p, tier == TIER_TRACEPOINT))
		return 0;
	__u32 netns = skb_netns(skb);
	if (!netns && rx_sk)
		netns = BPF_CORE_READ(rx_sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 1;
	}
	fill_common(e, kind, tier);
	fill_skb(e, skb, &p, netns);
	e->location = location;
	e->reason = reason;
	bpf_ringbuf_submit(e, 0);
	return 1;
}

static __always_inline int emit_skb(struct sk_buff *skb, __u8 kind, __u64 location,
				    __u32 reason, struct sock *rx_sk)
{
	emit_skb_tier(skb, kind, location, reason, rx_sk, TIER_TRACEPOINT);
	return 0;
}

/* The skb skb_copy_datagram_iovec last reported, per CPU: recvmsg copies
 * and then consumes a datagram on the same CPU, so the deliver hooks below
 * skip it instead of reporting the same delivery twice. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} last_copied SEC(".maps");

/* ---- tracepoint tier (tp_btf) ---------------------------------------- */

SEC("tp_btf/net_dev_queue")
int BPF_PROG(tp_net_dev_queue, struct sk_buff *skb)
{
	return emit_skb(skb, KIND_XMIT, 0, 0, NULL);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(tp_netif_receive_skb, struct sk_buff *skb)
{
	return emit_skb(skb, KIND_RECV, 0, 0, NULL);
}

/* UDP copies a linear skb with copy_linear_skb(), which does not pass
 * this tracepoint: it only sees non-linear datagrams (typically those that
 * came from a NIC with page-based receive buffers). The skb_consume_udp hook
 * below (fentry/kprobe tiers) covers the rest. There is no tracepoint for
 * those: consume_skb is not reliable on this path (6.18 frees the datagram
 * through skb_attempt_defer_free and the NAPI cache without it). */
SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(tp_skb_copy_datagram_iovec, struct sk_buff *skb, int len)
{
	if (emit_skb_tier(skb, KIND_DELIVER, 0, 0, NULL, TIER_TRACEPOINT)) {
		__u32 zero = 0;
		__u64 *last = bpf_map_lookup_elem(&last_copied, &zero);
		if (last)
			*last = (__u64)skb;
	}
	return 0;
}

/* deliver reports a DNS datagram consumed by udp(v6)_recvmsg, unless
 * skb_copy_datagram_iovec just reported it on this CPU. */
static __always_inline int deliver(struct sk_buff *skb, struct sock *sk, __u8 tier)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(&last_copied, &zero);
	if (last && *last == (__u64)skb) {
		*last = 0;
		return 0;
	}
	/* UDP clears skb->dev and never sets skb->sk: the netns is sk's */
	emit_skb_tier(skb, KIND_DELIVER, 0, 0, sk, tier);
	return 0;
}

/* skb_consume_udp(sk, skb, len): called by udp(v6)_recvmsg after copying a
 * datagram (exported, so never inlined away). */
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

/* skb:kfree_skb changed its arguments twice; tp_btf arguments are
 * positional and the verifier refuses a read past the last one, so there is
 * one program per prototype and the loader picks by the parameter count of
 * btf_trace_kfree_skb:
 *   (skb, location)                  before v5.17
 *   (skb, location, reason)          c504e5c2f964, v5.17
 *   (skb, location, reason, rx_sk)   "net: add rx_sk to trace_kfree_skb", v6.11
 */
SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_rx_sk, struct sk_buff *skb, void *location, int reason,
	     struct sock *rx_sk)
{
	return emit_skb(skb, KIND_DROP, (__u64)location, reason, rx_sk);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_reason, struct sk_buff *skb, void *location, int reason)
{
	return emit_skb(skb, KIND_DROP, (__u64)location, reason, NULL);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_noreason, struct sk_buff *skb, void *location)
{
	return emit_skb(skb, KIND_DROP, (__u64)location, 0, NULL);
}

/* udp:udp_fail_queue_rcv_skb gained the skb argument in v6.10 ("net: udp:
 * add IP/port data to the tracepoint udp/udp_fail_queue_rcv_skb"). */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb, int rc, struct sock *sk, struct sk_buff *skb)
{
	return emit_skb(skb, KIND_RCVBUF_FULL, 0, 0, sk);
}

/* Before v6.10 only the socket is known: filter on its ports. */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb_sk, int rc, struct sock *sk)
{
	__u16 lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	__u16 rport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (!port_match(lport, rport))
		return 0;
	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill_common(e, KIND_RCVBUF_FULL, TIER_TRACEPOINT);
	e->netns = netns;
	e->dns_len = 0;
	e->pkt.proto = IPPROTO_UDP;
	e->pkt.sport = rport; /* the datagram's direction: remote -> local */
	e->pkt.dport = lport;
	if (BPF_CORE_READ(sk, __sk_common.skc_family) == AF_INET6) {
		e->pkt.family = 6;
		bpf_core_read(e->pkt.saddr, 16, &sk->__sk_common.skc_v6_daddr);
		bpf_core_read(e->pkt.daddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
	} else {
		e->pkt.family = 4;
		bpf_core_read(e->pkt.saddr, 4, &sk->__sk_common.skc_daddr);
		bpf_core_read(e->pkt.daddr, 4, &sk->__sk_common.skc_rcv_saddr);
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* kmem:kmem_cache_free with the cache argument (v6.1, "mm/sl[au]b:
 * generalize kmalloc subsystem" series; earlier kernels passed the name or
 * nothing and are not supported: the loader checks the prototype). A raw
 * tracepoint, not tp_btf: 6.1's verifier refuses tp_btf reads of the
 * "const void *ptr" argument ("arg1 type UNKNOWN is not a struct"). Runs on
 * every slab free in the system, so the common path is one array lookup and
 * one compare. */
SEC("raw_tp/kmem_cache_free")
int BPF_PROG(tp_kmem_cache_free, unsigned long call_site, const void *ptr,
	     struct kmem_cache *s)
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

	struct nf_conn *ct = (struct nf_conn *)ptr;
	__u64 status = BPF_CORE_READ(ct, status);
	if (status & (1 << 3)) /* IPS_CONFIRMED */
		return 0;
	if (BPF_CORE_READ(ct, tuplehash[0].tuple.dst.protonum) != IPPROTO_UDP)
		return 0;
	__u16 sport = bpf_ntohs(BPF_CORE_READ(ct, tuplehash[0].tuple.src.u.all));
	__u16 dport = bpf_ntohs(BPF_CORE_READ(ct, tuplehash[0].tuple.dst.u.all));
	if (!port_match(sport, dport))
		return 0;
	__u32 netns = BPF_CORE_READ(ct, ct_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill_common(e, KIND_CT_FREE, TIER_TRACEPOINT);
	e->netns = netns;
	e->dns_len = 0;
	read_ct(&e->ct, ct);
	e->pkt = e->ct.orig;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* ---- __nf_conntrack_confirm (kprobe and fentry tiers) ----------------- */

/* confirm_enter builds the event of a DNS skb entering confirm into e.
 * Returns false for anything else. */
static __always_inline bool confirm_enter(struct event *e, struct sk_buff *skb, __u8 tier)
{
	struct pkt p = {};
	if (!parse_skb(skb, &p))
		return false;
	__u32 netns = skb_netns(skb);
	if (!netns_match(netns))
		return false;
	fill_common(e, KIND_CONFIRM, tier);
	fill_skb(e, skb, &p, netns);
	return true;
}

static __always_inline void confirm_exit(struct event *stash, struct sk_buff *skb, int ret)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return;
	}
	bpf_probe_read_kernel(e, sizeof(*e), stash);
	e->verdict = ret;
	e->ct_after = skb_ct(skb) ? (__u64)skb_ct(skb) : 0;
	bpf_ringbuf_submit(e, 0);
}

SEC("kprobe/__nf_conntrack_confirm")
int BPF_KPROBE(kp_nf_conntrack_confirm, struct sk_buff *skb)
{
	__u32 zero = 0;
	struct confirm_stack *st = bpf_map_lookup_elem(&confirm_stack, &zero);
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
	s->valid = confirm_enter(&s->ev, skb, TIER_KPROBE);
	return 0;
}

SEC("kretprobe/__nf_conntrack_confirm")
int BPF_KRETPROBE(krp_nf_conntrack_confirm, int ret)
{
	__u32 zero = 0;
	struct confirm_stack *st = bpf_map_lookup_elem(&confirm_stack, &zero);
	if (!st || st->depth == 0)
		return 0;
	__u32 d = st->depth - 1;
	st->depth = d;
	if (d >= CONFIRM_DEPTH)
		return 0;
	struct confirm_slot *s = &st->slot[d];
	if (!s->valid)
		return 0;
	s->valid = 0;
	confirm_exit(&s->ev, (struct sk_buff *)s->skb, ret);
	return 0;
}

SEC("fentry/__nf_conntrack_confirm")
int BPF_PROG(fe_nf_conntrack_confirm, struct sk_buff *skb)
{
	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	if (!confirm_enter(e, skb, TIER_FENTRY))
		return 0;
	__u64 key = (__u64)skb;
	bpf_map_update_elem(&confirm_entry, &key, e, BPF_ANY);
	return 0;
}

SEC("fexit/__nf_conntrack_confirm")
int BPF_PROG(fx_nf_conntrack_confirm, struct sk_buff *skb, int ret)
{
	__u64 key = (__u64)skb;
	struct event *stash = bpf_map_lookup_elem(&confirm_entry, &key);
	if (!stash)
		return 0;
	confirm_exit(stash, skb, ret);
	bpf_map_delete_elem(&confirm_entry, &key);
	return 0;
}

/* ---- nf_ct_resolve_clash (kprobe and fentry tiers) -------------------- */

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

/* Signature since v5.6 (6a757c07e51f series): (skb, h, reply_hash); h is a
 * tuplehash of the entry already in the table. Earlier kernels are not
 * supported (the loader checks the BTF prototype). */
static __always_inline int clash(struct sk_buff *skb, struct nf_conntrack_tuple_hash *h, __u8 tier)
{
	struct pkt p = {};
	if (!parse_skb(skb, &p))
		return 0;
	__u32 netns = skb_netns(skb);
	if (!netns_match(netns))
		return 0;

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill_common(e, KIND_CLASH, tier);
	fill_skb(e, skb, &p, netns);
	/* nf_ct_tuplehash_to_ctrack: container_of(h, struct nf_conn,
	 * tuplehash[h->tuple.dst.dir]) */
	__u8 dir = BPF_CORE_READ(h, tuple.dst.dir) & 1;
	__u64 winner = ptr_value(h) - bpf_core_field_offset(struct nf_conn, tuplehash) -
		       dir * bpf_core_type_size(struct nf_conntrack_tuple_hash);
	read_ct(&e->winner, (struct nf_conn *)winner);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("kprobe/nf_ct_resolve_clash")
int BPF_KPROBE(kp_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h, TIER_KPROBE);
}

SEC("fentry/nf_ct_resolve_clash")
int BPF_PROG(fe_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h, TIER_FENTRY);
}

/* ---- udp_sendmsg / udpv6_sendmsg (kprobe and fentry tiers) ------------ */

/* copy_payload_user copies the start of the message from the msghdr's
 * iov_iter: ITER_UBUF (v6.0, one user buffer) or ITER_IOVEC (first iovec). */
static __always_inline void copy_payload_user(struct event *e, struct msghdr *msg)
{
	struct iov_iter *it = &msg->msg_iter;
	e->dns_len = 0;
	if (!bpf_core_field_exists(it->iter_type))
		return;
	__u8 type = BPF_CORE_READ(it, iter_type);
	__u64 off = BPF_CORE_READ(it, iov_offset);
	__u64 base = 0, avail = 0;

	if (bpf_core_enum_value_exists(enum iter_type, ITER_UBUF) &&
	    type == bpf_core_enum_value(enum iter_type, ITER_UBUF)) {
		base = (__u64)BPF_CORE_READ(it, ubuf) + off;
		avail = BPF_CORE_READ(it, count);
	} else if (type == bpf_core_enum_value(enum iter_type, ITER_IOVEC)) {
		const struct iovec *iov;
		struct iov_iter___v64 *it64 = (void *)it;
		if (bpf_core_field_exists(it64->__iov))
			iov = BPF_CORE_READ(it64, __iov);
		else
			iov = BPF_CORE_READ((struct iov_iter___pre64 *)it, iov);
		__u64 len = BPF_CORE_READ(iov, iov_len);
		base = (__u64)BPF_CORE_READ(iov, iov_base) + off;
		avail = len > off ? len - off : 0;
	} else {
		return;
	}
	__u32 n = avail > DNS_CAP ? DNS_CAP : avail;
	e->dns_len = n;
	bpf_probe_read_user(e->dns, n & 0x1ff, (void *)base);
}

static __always_inline bool v4mapped(const __u8 *a)
{
	for (int i = 0; i < 10; i++)
		if (a[i])
			return false;
	return a[10] == 0xff && a[11] == 0xff;
}

/* send reports a DNS datagram handed to udp_sendmsg or udpv6_sendmsg.
 * udpv6_sendmsg passes a v4-mapped destination on to udp_sendmsg, which
 * reports it, so the v6 hook skips those (v6 = true). */
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
		if (!port_match(t.sport, t.dport))
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
		if (!port_match(t.sport, t.dport))
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

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill_common(e, KIND_SEND, tier);
	e->netns = netns;
	e->ifindex = BPF_CORE_READ(sk, __sk_common.skc_bound_dev_if);
	e->pkt = t;
	copy_payload_user(e, msg);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

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
