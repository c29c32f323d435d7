//go:build ignore

/* dnsrace kernel side: the kernel owns every DNS flow.
 *
 * A DNS query is recognised by port only at first sight: its send
 * (fentry/kprobe tiers) or the first device or drop hook that sees it
 * (tracepoint tier). From then on it is a flow in the `flows` map, keyed by
 * the asking socket's 5-tuple and the DNS id, and every later hook finds it
 * through the packet's conntrack *original* tuple (which NAT never
 * rewrites), never by the rewritten header. Its answer is found by the
 * flow's key reversed, in the namespace that asked (and where NAT ran in
 * that namespace itself, by the entry's reply tuple in the `answers` map);
 * namespaces nobody asks from are passed by on one array load (`askers`).
 * User space gets a QUERY record at first sight, an ANSWER
 * record when the answer arrives, and an EVENT record only when something
 * happens that it must explain (a drop, a confirm verdict, a clash, a freed
 * unconfirmed entry). Hops that change nothing send nothing.
 *
 * Two modes, chosen by the loader (cfg is read-only, so the verifier prunes
 * the other): with the conntrack confirm and clash hooks (fentry or kprobe)
 * the verdicts say what happened; in the tracepoint tier the device hooks
 * watch entries get confirmed and keep per-namespace maps of confirmed
 * entries by tuple, which name the winner of a race at the loser's drop,
 * and a netfilter program just before confirm (6.4+, linked only in the
 * namespaces that NAT) remembers each query's unconfirmed entry: a later
 * sight of the query or its answer carrying another entry shows the loser
 * merged into it (before 6.4: its unconfirmed entry freed, kmem_cache_free).
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
#define NFCT_INFOMASK 7
#define IP_CT_IS_REPLY 3
#define IPS_CONFIRMED (1 << 3)
/* kernel-only alias of IPS_UNTRACKED: nf_ct_resolve_clash_harder's loser
 * inserted reply-only (6a757c07e51f, v5.6) */
#define IPS_NAT_CLASH (1 << 12)
#define NF_DROP 0
#define CONFIRM_DEPTH 4
/* A packet crosses a node in far less; a later query with the same socket
 * and DNS id is a resend (glibc 5 s, musl 2.5 s). */
#define RESEND_GAP_MS 400

/* Emit the types bpf2go generates Go code for (-type). */
const struct rec_hdr *unused_hdr __attribute__((unused));
const struct rec_query *unused_query __attribute__((unused));
const struct rec_answer *unused_answer __attribute__((unused));
const struct rec_event *unused_event __attribute__((unused));
const enum rec_type *unused_rec_type __attribute__((unused));
const enum ev_kind *unused_ev_kind __attribute__((unused));
const enum tier *unused_tier __attribute__((unused));
const enum rec_flags *unused_rec_flags __attribute__((unused));
const enum dnsrace_stat *unused_stat __attribute__((unused));

volatile const struct config cfg = {
	.ports = {53},
	.wakeup_bytes = 1 << 20,
	.hz = 250,
};

/* Windows (a hop or a resend, a copy of an answer, a late winner) are
 * timed in jiffies: bpf_jiffies64 reads a variable where bpf_ktime_get_ns
 * reads the clock source (32 ns a call on a VM; docs/performance.md), and
 * the tracepoint tier times every hop. Their ends are off by up to a tick
 * (1 to 10 ms), nothing next to the windows' 100 ms to 1 s. */
static __always_inline bool within_ms(__u64 then, __u64 now, __u64 ms)
{
	return (now - then) * 1000 < ms * cfg.hz;
}

/* Set by the loader: the tracepoint tier watches entries get confirmed on
 * devices (the confirm hook is missing). */
volatile const bool track_cts = false;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22); /* the loader sets the real size */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} qid_seq SEC(".maps");

/* ---- flows ----------------------------------------------------------- */

/* A query's identity: the asking socket's 5-tuple (original direction,
 * what NAT never rewrites in the conntrack entry) and the DNS id, which a
 * resolver keeps distinct for the queries it has in flight on one socket.
 * saddr is zero when the socket had no source address at send (an
 * unconnected socket): lookups retry with it zeroed. */
struct flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u16 id;
	__u8 family;
	__u8 _pad;
};

struct flow {
	__u64 qid;
	__u64 ts;     /* last seen, in jiffies */
	__u64 pre_ct; /* its entry just before confirm, until a later sight (netfilter program) */
	__u32 netns;  /* the asking namespace */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768); /* the loader may resize */
	__type(key, struct flow_key);
	__type(value, struct flow);
} flows SEC(".maps");

/* Where an answer will be seen when that is not by its own flow's key
 * reversed in the asking namespace: where NAT ran in the asking namespace
 * itself, the answer arrives there with the entry's reply tuple. */
struct ans_key {
	__u32 netns;
	struct flow_key k;
};

struct ans {
	__u64 qid;
	struct flow_key fk;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct ans_key);
	__type(value, struct ans);
} answers SEC(".maps");

/* askers counts, per slot of namespace inode, the flows asked from the
 * namespaces of that slot and the answers entries made there; deletes count
 * down. LRU evictions are not seen, so a count may stay above the truth but
 * never falls below it: a response in a namespace whose slot is 0 expects
 * no answer, and the hops an answer crosses on its way back (the DNS
 * server's namespace, the node) cost one array load instead of hash
 * lookups. A slot left above 0 by evicted flows only costs that namespace
 * the lookups every namespace paid before. */
#define ASKER_SLOTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ASKER_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} askers SEC(".maps");

/* ---- conntrack entries (tracepoint tier) ------------------------------ */

enum ctmark_flags {
	CTM_CONFIRMED = 1, /* seen confirmed: in ct_tuples */
	CTM_NAT_CLASH = 2, /* reported as a NAT_CLASH loser */
	CTM_DROPPED = 4,   /* its packet was dropped: its free is no rescue (kmem_cache_free) */
	CTM_NAT = 8,       /* NAT changed its tuple: answers come by its reply tuple */
};

/* A mark holds the entry's original tuple too: the slab hands a freed
 * entry's address to the next entry at once, and a mark left by the old one
 * must not speak for the new one. */
struct ctmark {
	__u64 qid;
	__u32 flags;
	__u32 _pad;
	struct tuple orig;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct ctmark);
} cts SEC(".maps");

/* Confirmed DNS entries by (namespace, direction, tuple): the entry that
 * holds a tuple is the winner of a race for it. */
struct ct_tuple_key {
	__u32 netns;
	__u32 dir; /* 0 original, 1 reply */
	struct tuple t;
};

struct ct_ref {
	__u64 ct;
	__u64 qid;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct ct_tuple_key);
	__type(value, struct ct_ref);
} ct_tuples SEC(".maps");

/* Losers dropped before their winner reached a device, by the tuple the
 * winner will hold. */
struct awaited {
	__u64 qid; /* the loser's */
	__u64 ts;  /* when it was dropped, in jiffies */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct ct_tuple_key);
	__type(value, struct awaited);
} unresolved SEC(".maps");

/* A winner confirmed this long after its loser's drop is another flow
 * that got the same tuple later. */
#define AWAIT_MS 1000

/* Namespaces where a DNS entry was seen, so each is announced once. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} ct_netns SEC(".maps");

/* Source ports of answers that reach an asking namespace before its own
 * NAT reverses them (DNAT in the sender's namespace to a backend on another
 * port): the receive hook looks those up too. One bit per port. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} reply_ports SEC(".maps");

/* Address of the nf_conntrack kmem_cache once kmem_cache_free saw it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} ct_cachep SEC(".maps");

/* ---- confirm (fentry/kprobe tiers) ------------------------------------ */

/* What confirm's entry knew, for its exit: the loser's entry is read at
 * entry, because after a merge it may already be freed and reused. */
struct pending_confirm {
	__u64 qid;
	__u32 netns;
	__u32 _pad;
	struct tuple pkt;
	struct ct ct;
};

/* fentry: keyed by skb, completed at fexit (same skb argument). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct pending_confirm);
} confirm_entry SEC(".maps");

/* kprobe: a kretprobe does not see the skb argument, so the entry keeps a
 * small per-CPU stack of pending calls. Calls on one CPU return in LIFO
 * order (a softirq confirm can nest inside a process-context one); every
 * entry pushes, even for non-DNS packets (valid = 0), so returns stay
 * paired. */
struct confirm_slot {
	__u64 skb;
	__u32 valid;
	__u32 _pad;
	struct pending_confirm pc;
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

/* The winner nf_ct_resolve_clash saw, for the confirm it runs inside (same
 * CPU, same skb). */
struct clash_slot {
	__u64 skb;
	struct ct winner;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct clash_slot);
} clash_slot SEC(".maps");

/* ---- records ---------------------------------------------------------- */

struct query_buf {
	struct rec_query r;
	__u8 dns[DNS_ROOM];
};

struct event_buf {
	struct rec_event r;
	__u8 dns[DNS_ROOM];
};

/* Records are built here (too big for the stack), then copied out with
 * bpf_ringbuf_output, which takes a variable length. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct query_buf);
} query_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event_buf);
} event_scratch SEC(".maps");

static __always_inline void stat_inc(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&stats, &i);
	if (n)
		*n += 1; /* per-CPU slot: no atomics needed */
}

/* Records a CPU sends between two looks at how full the ring is. */
#define RING_CHECK_EVERY 32

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ring_sends SEC(".maps");

/* The slot's key lives in .rodata: the callers' stacks are full. */
static const __u32 ring_sends_key = 0;

/* output sends one record. The reader is woken only once a good part of
 * the ring is queued; otherwise it drains the ring on its own deadline, so
 * a busy node does not pay a wakeup per record. How full the ring is is
 * asked only every RING_CHECK_EVERY records a CPU sends: the answer reads
 * the reader's position, a cache line the reader keeps writing, and that
 * read cost a quarter of a microsecond per record when a flood's two ends
 * and the reader shared two CPUs (--prog-stats). A wakeup is then late by
 * at most that many records per CPU, against a threshold of 1/8 of the
 * ring. */
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

static __always_inline __u64 new_qid(void)
{
	__u32 zero = 0;
	__u64 *seq = bpf_map_lookup_elem(&qid_seq, &zero);
	if (!seq)
		return 0;
	*seq += 1;
	return ((__u64)bpf_get_smp_processor_id() << 48) | (*seq & 0xffffffffffffULL);
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

/* ---- packets ---------------------------------------------------------- */

static __always_inline bool port_in(__u16 port)
{
#pragma unroll
	for (int i = 0; i < MAX_PORTS; i++) {
		if (cfg.ports[i] == 0)
			return false;
		if (cfg.ports[i] == port)
			return true;
	}
	return false;
}

static __always_inline bool dns_ports(const struct tuple *t)
{
	return port_in(t->sport) || port_in(t->dport);
}

/* What the header parse of an skb found. */
struct pkt {
	struct tuple t;
	__u64 payload; /* kernel address of the UDP payload */
	__u32 payload_len;
	__u16 dns[2]; /* the payload's first 4 bytes (DNS id, flags), network order */
	bool dns_read; /* dns holds them (read with the headers) */
};

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
 * (faulting reads the verifier checks): the helper reads they replace cost
 * more than a non-DNS packet's whole early exit (kernel.bpf_stats_enabled). */
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

static __always_inline bool netns_match(__u32 inum)
{
	return cfg.netns == 0 || cfg.netns == inum;
}

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

/* A DNS packet at a packet hook. */
struct seen {
	struct pkt p;
	struct nf_conn *ct; /* its conntrack entry, or NULL */
	struct tuple orig;  /* the entry's original tuple */
	__u32 netns;
	__u16 id;
	__u16 flags;  /* DNS header flags */
	__u8 ctinfo;
	bool response;
};

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

/* dns_packet: is this a DNS packet by its first-sight tuple: the conntrack
 * original tuple when it has an entry (NAT may have rewritten the header),
 * else its header? */
static __always_inline bool dns_packet(struct sk_buff *skb, struct seen *s, bool btf)
{
	if (!parse_skb(skb, &s->p, btf))
		return false;
	s->ct = skb_ct(skb, btf, &s->ctinfo);
	if (s->ct) {
		read_tuple(&s->orig, s->ct, 0);
		if (s->orig.proto != IPPROTO_UDP || !dns_ports(&s->orig))
			return false;
	} else if (!dns_ports(&s->p.t)) {
		return false;
	}
	return read_dns_hdr(s);
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
 * kprobe tiers start such flows, so the tracepoint tier, track_cts, never
 * pays the second lookup). */
static __always_inline struct flow *lookup_flow(struct flow_key *k)
{
	struct flow *f = bpf_map_lookup_elem(&flows, k);
	if (f || track_cts)
		return f;
	struct flow_key z = *k;
	__builtin_memset(z.saddr, 0, 16);
	return bpf_map_lookup_elem(&flows, &z);
}

/* ---- QUERY, ANSWER ---------------------------------------------------- */

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

static __always_inline __u32 *askers_of(__u32 netns)
{
	__u32 i = netns & (ASKER_SLOTS - 1);
	return bpf_map_lookup_elem(&askers, &i);
}

/* count_asker adds d to netns's askers slot: +1 before an entry is made (a
 * response seen meanwhile finds no entry either way), -1 only after this
 * program deleted one. */
static __always_inline void count_asker(__u32 netns, __s32 d)
{
	__u32 *n = askers_of(netns);
	if (n)
		__sync_fetch_and_add(n, d);
}

static __always_inline void expect_answer(struct ans_key *ak, struct ans *a)
{
	count_asker(ak->netns, 1);
	bpf_map_update_elem(&answers, ak, a, BPF_ANY);
}

static __always_inline void forget_answer(struct ans_key *ak)
{
	if (!bpf_map_delete_elem(&answers, ak))
		count_asker(ak->netns, -1);
}

/* delete_flow deletes the flow of k asked from netns, and counts it down
 * if it was there. */
static __always_inline bool delete_flow(struct flow_key *k, __u32 netns)
{
	if (bpf_map_delete_elem(&flows, k))
		return false;
	count_asker(netns, -1);
	return true;
}

/* new_flow starts a flow (counted in its asking namespace's askers slot)
 * and sends the QUERY record. pre_ct is the entry the netfilter program saw
 * just before confirm (0 elsewhere). Its answer is found by its key
 * reversed. */
static __always_inline __u64 new_flow(struct flow_key *k, __u32 netns, __u64 payload, __u32 len, bool user,
				      __u8 tier, __u8 flags, __u64 pre_ct)
{
	__u64 qid = new_qid();
	struct flow f = {.qid = qid, .ts = bpf_jiffies64(), .pre_ct = pre_ct, .netns = netns};
	count_asker(netns, 1);
	bpf_map_update_elem(&flows, k, &f, BPF_ANY);
	/* A lookup sets the entry's reference bit (an insert does not), and
	 * a full LRU map evicts unreferenced entries first. In the tracepoint
	 * tier every later hop looks the flow up; in the others nothing does
	 * before its answer, while the drop hook looks up the flows of
	 * queries a rule dropped, which stay (only a drop at the server ends
	 * a flow): with the map full of those, the fresh flows went first and
	 * their answers found nothing (TestFreshFlowsSurviveFullMap). */
	if (!track_cts)
		bpf_map_lookup_elem(&flows, k);
	stat_inc(STAT_FLOWS_NEW);
	struct tuple t = {.sport = k->sport, .dport = k->dport, .family = k->family, .proto = IPPROTO_UDP};
	__builtin_memcpy(t.saddr, k->saddr, 16);
	__builtin_memcpy(t.daddr, k->daddr, 16);
	emit_query(qid, netns, &t, payload, len, user, tier, flags);
	return qid;
}

/* track_query returns the qid of the query a packet carries: a flow seen
 * moments ago is a hop of it (*fp is the flow); otherwise, where the hook
 * may (create), a new query starts here (*fp stays NULL). pre_ct, when not
 * 0, is the packet's unconfirmed entry just before confirm, kept in the
 * flow for its next sight to compare (check_merge). */
static __always_inline __u64 track_query(struct seen *s, struct flow_key *k, bool create, __u8 tier, __u8 flags,
					 __u64 pre_ct, __u32 *asker, struct flow **fp)
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
	if (!f && !track_cts) {
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

/* The last answer each CPU matched, for a drop of that answer moments
 * later: the tracepoint tier matches an answer at the asking namespace's
 * device, before the socket can still drop it (a full receive buffer), and
 * the flow is gone by then. The socket's receive runs on the CPU that
 * matched it, within the same softirq (or the loopback send's), so one slot
 * per CPU finds it; a per-CPU write instead of an LRU insert per answer. */
struct answered {
	struct flow_key fk;
	__u64 qid;
	__u64 ts; /* jiffies */
	__u32 netns;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct answered);
} last_answered SEC(".maps");

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
	delete_flow(&o.fk, s->netns); /* o.f->netns: lookup_answer checked */
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

/* ---- EVENT ------------------------------------------------------------ */

static __always_inline struct event_buf *event_buf(void)
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
	struct event_buf *b = event_buf();
	if (b)
		emit_event(b, EV_CT_NETNS, tier, 0, netns, 0, 0);
}

/* ---- tracepoint tier: entries confirmed ------------------------------- */

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
	struct event_buf *b = event_buf();
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
 * for the receive hook's filter. */
static __always_inline void expect_at_reply(struct seen *s, __u64 qid, const struct tuple *reply)
{
	struct ans_key ak = {.netns = s->netns};
	key_from(&ak.k, reply, s->id, false);
	struct ans a = {.qid = qid};
	query_key(&a.fk, s);
	expect_answer(&ak, &a);
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
	struct ctmark *m = seen_marked(s);
	if (m) {
		if ((m->flags & CTM_NAT) && s->netns == asker) {
			read_tuple(&reply, s->ct, 1);
			expect_at_reply(s, qid, &reply);
		}
		return;
	}
	struct nf_conn *ct = s->ct; /* a plain local: CO-RE must not relocate seen */
	__u32 status = BPF_CORE_READ(ct, status);
	if (!(status & (IPS_CONFIRMED | IPS_NAT_CLASH)))
		return;
	announce_netns(s->netns, tier);
	read_tuple(&reply, s->ct, 1);
	__u32 nat = tuple_reversed(&reply, &s->orig) ? 0 : CTM_NAT;
	if (nat && s->netns == asker)
		expect_at_reply(s, qid, &reply);
	struct ct_ref ref = {.ct = ctp, .qid = qid};
	struct ct_tuple_key k = {};
	if (status & IPS_NAT_CLASH) {
		/* Inserted in the reply direction only: it holds its reply
		 * tuple; the original one belongs to the winner. */
		struct ctmark nm = {.qid = qid, .flags = CTM_NAT_CLASH | nat, .orig = s->orig};
		bpf_map_update_elem(&cts, &ctp, &nm, BPF_ANY);
		tuple_key(&k, s->netns, 1, &reply);
		bpf_map_update_elem(&ct_tuples, &k, &ref, BPF_ANY);
		struct event_buf *b = event_buf();
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

/* The entry each DNS query packet had just before confirm at POSTROUTING,
 * by the skb's address, until the packet's next device: copies of one flow
 * racing (the same socket and DNS id) each have their own. A packet a local
 * socket takes (LOCAL_IN) meets no device, so it leaves none: its freed
 * skb's address is soon another packet's, and a copy that joins a
 * confirmed entry writes no record of its own to replace it. An entry of
 * another namespace, or older than PRECONFIRM_MS (a packet dropped where
 * no hook saw it), belongs to another packet. */
struct preconfirm {
	__u64 ct;
	__u64 ts; /* jiffies */
	__u32 netns;
	__u32 pad;
};

/* A packet reaches its device this soon after confirm (a neighbour
 * resolution may hold it for a while). */
#define PRECONFIRM_MS 1000

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct preconfirm);
} preconfirm SEC(".maps");

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
	struct event_buf *b = event_buf();
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

/* reply_port_known: a header source port answers of tracked flows use
 * (reply_ports). */
static __always_inline bool reply_port_known(__u16 port)
{
	__u32 w = port >> 6;
	__u64 *bits = bpf_map_lookup_elem(&reply_ports, &w);
	return bits && (*bits & (1ULL << (port & 63)));
}

/* ---- tracepoint tier: devices ---------------------------------------- */

/* device is the body of net_dev_queue (egress: a query may be first seen
 * here) and netif_receive_skb (ingress: never a first sight; answers of
 * NAT in the asking namespace are recognised by a known reply port). A
 * query or answer carrying an entry is where a merge the netfilter program
 * set up shows (check_merge): the query's own egress after confirm, or for
 * a query a local server took (LOCAL_IN), its answer's. */
/* device's struct seen: on its stack it left no room for the calls it
 * makes (check_merge). The device hooks do not nest on a CPU: they run
 * with bottom halves off, and a hardirq never reaches them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct seen)); /* no BTF type: it holds a kernel pointer */
} device_seen SEC(".maps");

static const __u32 device_seen_key = 0;

static __always_inline int device(struct sk_buff *skb, bool egress)
{
	struct seen *s = bpf_map_lookup_elem(&device_seen, &device_seen_key);
	if (!s)
		return 0;
	__builtin_memset(&s->p.t, 0, sizeof(s->p.t)); /* an IPv4 address leaves 12 bytes */
	if (!parse_skb(skb, &s->p, true))
		return 0;
	s->ct = skb_ct(skb, true, &s->ctinfo);
	if (s->ct) {
		read_tuple(&s->orig, s->ct, 0);
		if (s->orig.proto != IPPROTO_UDP || !dns_ports(&s->orig))
			return 0;
	} else if (!dns_ports(&s->p.t) && (egress || !reply_port_known(s->p.t.sport))) {
		return 0;
	}
	if (!read_dns_hdr(s))
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
	/* Every hop looks its flow up, even where that changes nothing (an
	 * ingress without an entry): the lookup sets the entry's reference
	 * bit, and when the map is full (queries nobody answers pile up) the
	 * LRU evicts entries nothing looked up first. Without the ingress
	 * lookups the unpaced loopback flood of dnsrace bench (its responder
	 * drops queries, and the drop hook looks their flows up) lost three
	 * answers in four; a lookup right after the insert instead still lost
	 * 0.3-1.1% of them. TestFreshFlowsSurviveFullMap guards it. */
	query_key(&k, s);
	__u32 asker = 0;
	__u64 qid = track_query(s, &k, egress, TIER_TRACEPOINT, 0, 0, &asker, &f);
	if (qid && s->ct && track_cts) {
		check_merge(s, f, qid, &k, (__u64)skb);
		note_ct(s, qid, asker, TIER_TRACEPOINT);
	}
	return 0;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(tp_net_dev_queue, struct sk_buff *skb)
{
	return device(skb, true);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(tp_netif_receive_skb, struct sk_buff *skb)
{
	return device(skb, false);
}

/* ---- tracepoint tier: just before confirm (netfilter, 6.4+) ----------- */

/* struct bpf_nf_ctx (v6.4, "bpf: add bpf_link support for BPF_NETFILTER
 * programs"), as a flavour: the object builds against a vmlinux.h of an
 * older kernel, and the program loads only on 6.4+. */
struct bpf_nf_ctx___dnsrace {
	const struct nf_hook_state *state;
	struct sk_buff *skb;
} __attribute__((preserve_access_index));

#define NF_ACCEPT 1

/* nf_confirm_soon runs at POSTROUTING and LOCAL_IN just before conntrack's
 * confirm (the loader links it at INT_MAX - 1, only in the namespaces that
 * NAT): a DNS query's unconfirmed entry is kept by its skb and in its flow,
 * and the next sight of the query or its answer at a device says whether
 * confirm inserted it or merged it into a winner (check_merge). It starts
 * no flow: a query forwarded from outside starts its flow at the next
 * device, which finds its entry by the skb (and 6.12 does not let a
 * netfilter program read the task's comm, as a QUERY record does). It
 * always accepts. */
SEC("netfilter")
int nf_confirm_soon(struct bpf_nf_ctx___dnsrace *ctx)
{
	struct sk_buff *skb = ctx->skb;
	struct nf_conn *ct = (struct nf_conn *)(skb->_nfct & NFCT_PTRMASK);
	if (!ct || (BPF_CORE_READ(ct, status) & IPS_CONFIRMED))
		return NF_ACCEPT;
	struct seen s = {};
	if (!dns_packet(skb, &s, true) || s.response)
		return NF_ACCEPT;
	s.netns = ctx->state->net->ns.inum;
	if (!netns_match(s.netns))
		return NF_ACCEPT;
	struct flow_key k;
	struct flow *f;
	__u32 asker;
	query_key(&k, &s);
	track_query(&s, &k, false, TIER_TRACEPOINT, 0, (__u64)ct, &asker, &f);
	if (ctx->state->hook == NF_INET_LOCAL_IN)
		return NF_ACCEPT; /* its answer compares the flow's pre_ct */
	struct preconfirm p = {.ct = (__u64)ct, .ts = bpf_jiffies64(), .netns = s.netns};
	__u64 skbp = (__u64)skb;
	bpf_map_update_elem(&preconfirm, &skbp, &p, BPF_ANY);
	return NF_ACCEPT;
}

/* ---- drops (every tier) ----------------------------------------------- */

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

/* end_flow deletes the flow of k (or of k without a source address, as
 * lookup_flow finds it) asked from netns. */
static __always_inline void end_flow(struct flow_key *k, __u32 netns)
{
	if (delete_flow(k, netns) || track_cts)
		return;
	__builtin_memset(k->saddr, 0, 16);
	delete_flow(k, netns);
}

/* drop reports a DNS packet freed by kfree_skb. A query may be first seen
 * here (NAT in its own namespace dropped it before any device did). In the
 * tracepoint tier an unconfirmed entry's drop looks for the entry that
 * holds its reply tuple (another flow got the same mapping) or its original
 * tuple (the same socket's other packet), else waits for it (unresolved). */
static __always_inline int drop(struct sk_buff *skb, __u64 location, __u32 reason, struct sock *rx_sk,
				__u8 tier)
{
	struct seen s = {};
	if (!dns_packet(skb, &s, true))
		return 0;
	s.netns = skb_netns(skb, rx_sk, true);
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
		qid = track_query(&s, &k, true, tier, track_cts ? 0 : RF_NO_SOCKET, 0, &asker, &f);
		if (f)
			f->pre_ct = 0; /* if confirm judged it, this drop was its verdict */
		if (track_cts) {
			__u64 skbp = (__u64)skb;
			bpf_map_delete_elem(&preconfirm, &skbp);
		}
		if (qid && drop_is_final(reason))
			end_flow(&k, asker);
	}
	if (s.ct)
		announce_netns(s.netns, tier); /* before b: it uses the scratch */
	struct event_buf *b = event_buf();
	if (!b)
		return 0;
	b->r.location = location;
	b->r.reason = reason;
	b->r.pkt = s.p.t;
	b->r.flags = flags;
	if (s.ct) {
		read_ct(&b->r.ct, s.ct);
		if (track_cts && !s.response && !(b->r.ct.status & IPS_CONFIRMED)) {
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
	emit_event(b, EV_DROP, tier, qid, s.netns, s.p.payload, len);
	return 0;
}

/* skb:kfree_skb changed its arguments twice; tp_btf arguments are
 * positional and the verifier refuses a read past the last one, so there is
 * one program per prototype and the loader picks by the parameter count of
 * btf_trace_kfree_skb:
 *   (skb, location)                  before v5.17
 *   (skb, location, reason)          c504e5c2f964, v5.17
 *   (skb, location, reason, rx_sk)   "net: add rx_sk to trace_kfree_skb", v6.11
 * The tier argument only labels the records: kfree_skb is a tracepoint in
 * every tier. */
SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_rx_sk, struct sk_buff *skb, void *location, int reason, struct sock *rx_sk)
{
	return drop(skb, (__u64)location, reason, rx_sk, TIER_TRACEPOINT);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_reason, struct sk_buff *skb, void *location, int reason)
{
	return drop(skb, (__u64)location, reason, NULL, TIER_TRACEPOINT);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(tp_kfree_skb_noreason, struct sk_buff *skb, void *location)
{
	return drop(skb, (__u64)location, 0, NULL, TIER_TRACEPOINT);
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
	struct event_buf *b = event_buf();
	if (!b)
		return 0;
	b->r.flags = RF_RESPONSE;
	b->r.pkt = s.p.t;
	emit_event(b, EV_RCVBUF_FULL, TIER_TRACEPOINT, qid, s.netns, s.p.payload, qid ? 0 : s.p.payload_len);
	return 0;
}

/* udp:udp_fail_queue_rcv_skb gained the skb argument in v6.10 ("net: udp:
 * add IP/port data to the tracepoint udp/udp_fail_queue_rcv_skb"). */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb, int rc, struct sock *sk, struct sk_buff *skb)
{
	return rcvbuf_full(skb, sk);
}

/* Before v6.10 only the socket is known: its tuple goes to user space,
 * which blames the socket's unanswered queries. */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(tp_udp_fail_queue_rcv_skb_sk, int rc, struct sock *sk)
{
	struct tuple t = {.proto = IPPROTO_UDP};
	t.dport = BPF_CORE_READ(sk, __sk_common.skc_num);
	t.sport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (!dns_ports(&t))
		return 0;
	__u32 netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (!netns_match(netns))
		return 0;
	if (BPF_CORE_READ(sk, __sk_common.skc_family) == AF_INET6) {
		t.family = 6;
		bpf_core_read(t.saddr, 16, &sk->__sk_common.skc_v6_daddr);
		bpf_core_read(t.daddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
	} else {
		t.family = 4;
		bpf_core_read(t.saddr, 4, &sk->__sk_common.skc_daddr);
		bpf_core_read(t.daddr, 4, &sk->__sk_common.skc_rcv_saddr);
	}
	struct event_buf *b = event_buf();
	if (!b)
		return 0;
	b->r.flags = RF_RESPONSE;
	b->r.pkt = t;
	emit_event(b, EV_RCVBUF_FULL, TIER_TRACEPOINT, 0, netns, 0, 0);
	return 0;
}

/* ---- tracepoint tier: unconfirmed entries freed ----------------------- */

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
	struct event_buf *b = event_buf();
	if (!b)
		return 0;
	read_ct(&b->r.ct, ct);
	emit_event(b, EV_CT_FREED, TIER_TRACEPOINT, 0, netns, 0, 0);
	return 0;
}

/* kmem:kmem_cache_free with the cache argument (v6.1, "mm/sl[au]b:
 * generalize kmalloc subsystem" series). A raw tracepoint, not tp_btf: 6.1's
 * verifier refuses tp_btf reads of the "const void *ptr" argument. Runs on
 * every slab free in the system, so the common path is one array lookup and
 * one compare. */
SEC("raw_tp/kmem_cache_free")
int BPF_PROG(tp_kmem_cache_free, unsigned long call_site, const void *ptr, struct kmem_cache *s)
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
	return ct_freed((struct nf_conn *)ptr);
}

/* Before v6.1 the tracepoint has no cache argument: frees called from the
 * nf_conntrack module's text (cfg.ct_free_lo/hi, from /sys/module) are its
 * entries (and, rarely, its expectations, which ct_freed's checks reject). */
SEC("raw_tp/kmem_cache_free")
int BPF_PROG(tp_kmem_cache_free_site, unsigned long call_site, const void *ptr)
{
	if (call_site - cfg.ct_free_lo >= cfg.ct_free_hi - cfg.ct_free_lo)
		return 0;
	return ct_freed((struct nf_conn *)ptr);
}

/* ---- __nf_conntrack_confirm (kprobe and fentry tiers) ----------------- */

/* confirm_enter: the query of a DNS skb entering confirm (first seen here
 * if no send was seen: forwarded from outside) and its entry, read now. */
static __always_inline bool confirm_enter(struct pending_confirm *pc, struct sk_buff *skb, __u8 tier)
{
	struct seen s = {};
	if (!dns_packet(skb, &s, false) || !s.ct || s.response)
		return false;
	s.netns = skb_netns(skb, NULL, false);
	if (!netns_match(s.netns))
		return false;
	announce_netns(s.netns, tier);
	struct flow_key k;
	struct flow *f;
	query_key(&k, &s);
	__u32 asker = 0;
	pc->qid = track_query(&s, &k, true, tier, RF_NO_SOCKET, 0, &asker, &f);
	pc->netns = s.netns;
	pc->pkt = s.p.t;
	read_ct(&pc->ct, s.ct);
	return true;
}

/* confirm_exit reports what user space must explain: NF_DROP, a merge
 * (the skb now carries the winner's entry), or a NAT_CLASH insert. A plain
 * insert sends nothing. */
static __always_inline void confirm_exit(struct pending_confirm *pc, struct sk_buff *skb, int ret, __u8 tier)
{
	__u32 zero = 0;
	struct clash_slot *cs = bpf_map_lookup_elem(&clash_slot, &zero);
	bool clashed = cs && cs->skb == (__u64)skb;
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
		goto out;
	struct event_buf *b = event_buf();
	if (!b)
		goto out;
	b->r.pkt = pc->pkt;
	b->r.ct = pc->ct;
	if (kind == EV_MERGED) {
		read_ct(&b->r.winner, after);
		b->r.flags = RF_WINNER;
	} else if (clashed) {
		b->r.winner = cs->winner;
		b->r.flags = RF_WINNER;
	}
	emit_event(b, kind, tier, pc->qid, pc->netns, 0, 0);
out:
	if (clashed)
		cs->skb = 0;
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
	s->valid = confirm_enter(&s->pc, skb, TIER_KPROBE);
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
	confirm_exit(&s->pc, (struct sk_buff *)s->skb, ret, TIER_KPROBE);
	return 0;
}

/* Scratch for fentry's entry (the stack is too small for it). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pending_confirm);
} confirm_scratch SEC(".maps");

SEC("fentry/__nf_conntrack_confirm")
int BPF_PROG(fe_nf_conntrack_confirm, struct sk_buff *skb)
{
	__u32 zero = 0;
	struct pending_confirm *pc = bpf_map_lookup_elem(&confirm_scratch, &zero);
	if (!pc || !confirm_enter(pc, skb, TIER_FENTRY))
		return 0;
	__u64 key = (__u64)skb;
	bpf_map_update_elem(&confirm_entry, &key, pc, BPF_ANY);
	return 0;
}

SEC("fexit/__nf_conntrack_confirm")
int BPF_PROG(fx_nf_conntrack_confirm, struct sk_buff *skb, int ret)
{
	__u64 key = (__u64)skb;
	struct pending_confirm *pc = bpf_map_lookup_elem(&confirm_entry, &key);
	if (!pc)
		return 0;
	confirm_exit(pc, skb, ret, TIER_FENTRY);
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
	__u32 zero = 0;
	struct clash_slot *cs = bpf_map_lookup_elem(&clash_slot, &zero);
	if (!cs)
		return 0;
	/* nf_ct_tuplehash_to_ctrack: container_of(h, struct nf_conn,
	 * tuplehash[h->tuple.dst.dir]) */
	__u8 dir = BPF_CORE_READ(h, tuple.dst.dir) & 1;
	__u64 winner = ptr_value(h) - bpf_core_field_offset(struct nf_conn, tuplehash) -
		       dir * bpf_core_type_size(struct nf_conntrack_tuple_hash);
	cs->skb = (__u64)skb;
	read_ct(&cs->winner, (struct nf_conn *)winner);
	return 0;
}

SEC("kprobe/nf_ct_resolve_clash")
int BPF_KPROBE(kp_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h);
}

SEC("fentry/nf_ct_resolve_clash")
int BPF_PROG(fe_nf_ct_resolve_clash, struct sk_buff *skb, struct nf_conntrack_tuple_hash *h)
{
	return clash(skb, h);
}

/* ---- skb_consume_udp (kprobe and fentry tiers) ------------------------- */

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

/* ---- udp_sendmsg / udpv6_sendmsg (kprobe and fentry tiers) ------------ */

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
	new_flow(&k, netns, base, avail > DNS_CAP ? DNS_CAP : avail, true, tier, 0, 0);
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
