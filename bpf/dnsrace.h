/* Shared between the BPF programs (bpf/dnsrace.bpf.c, bpf/lib/) and user space.
 *
 * The kernel side owns each DNS flow and sends user space only what changes
 * its mind: one QUERY record when a query is first seen, one EVENT record
 * when something happens to it that user space must explain (a drop, a
 * confirm verdict, a clash and its winner, an unconfirmed entry freed), one
 * ANSWER record when its answer reaches the asking namespace. Hops that
 * change nothing update the maps and send nothing.
 *
 * User space never mirrors these by hand: bpf2go generates Go types (-type)
 * and internal/event decodes records at the offsets this header defines;
 * its tests build records from the generated types, so a layout change here
 * that the decoder does not follow fails them.
 *
 * Byte order: every multi-byte integer is in host order (ports converted
 * with bpf_ntohs); addresses are in network order, IPv4 in the first 4
 * bytes. Records are variable length: QUERY and EVENT end with dns_len bytes
 * of the DNS message.
 */
#ifndef DNSRACE_H
#define DNSRACE_H

/* Bytes of a DNS message kept: the 12-byte header, a question name of up to
 * 255 wire bytes and QTYPE/QCLASS. */
#define DNS_CAP 272
/* Room for a DNS copy in a scratch record: a power of two above DNS_CAP, so
 * a length masked with DNS_ROOM - 1 is provably inside it. */
#define DNS_ROOM 512
/* DNS ports a tracer can recognise queries by (--port takes a list). */
#define MAX_PORTS 8

/* internal/event decodes these (recQuery, recAnswer, recEvent; TestEnumValues). */
enum rec_type {
	REC_INVALID = 0,
	REC_QUERY = 1,  /* struct rec_query: a query first seen */
	REC_ANSWER = 2, /* struct rec_answer: its answer reached the asker */
	REC_EVENT = 3,  /* struct rec_event: evidence about a query or answer */
};

/* Kinds of REC_EVENT: event.Kind from KindDrop on, in this order (TestEnumValues). */
enum ev_kind {
	EV_INVALID = 0,
	/* skb:kfree_skb of a DNS packet: reason, location, its entry and, in
	 * the tracepoint tier, the winner the maps knew */
	EV_DROP = 1,
	/* __nf_conntrack_confirm returned NF_DROP (fentry/kprobe) */
	EV_CONFIRM_DROP = 2,
	/* the loser of a clash merged into the winner: confirm returned with
	 * the skb on another entry (fentry/kprobe), or a later sight carries
	 * another entry than the netfilter program saw just before confirm
	 * (tracepoint tier, 6.4+); ct.ptr is the loser's freed entry */
	EV_MERGED = 3,
	/* the loser inserted reply-only with IPS_NAT_CLASH (5.6+) */
	EV_NAT_CLASH = 4,
	/* an unconfirmed DNS entry freed without its packet being dropped: a
	 * merged loser (tracepoint tier before 6.4: kmem_cache_free) */
	EV_CT_FREED = 5,
	/* the winner of an earlier dropped race, confirmed after the drop
	 * (tracepoint tier: it reached a device after its loser was freed) */
	EV_WINNER = 6,
	/* udp:udp_fail_queue_rcv_skb: an answer hit a full receive buffer */
	EV_RCVBUF_FULL = 7,
	/* the first DNS entry of a namespace: user space reads that
	 * namespace's conntrack counters from now on */
	EV_CT_NETNS = 8,
	/* the answers table was full: the answer of qid, which NAT in its
	 * own namespace rewrites, cannot be matched (STAT_FLOWS_REFUSED) */
	EV_UNTRACKED = 9,
};

/* event.Tier (TestEnumValues). */
enum tier {
	TIER_NONE = 0,
	TIER_TRACEPOINT = 1,
	TIER_KPROBE = 2,
	TIER_FENTRY = 3,
};

/* rec_query.flags, rec_event.flags */
enum rec_flags {
	/* query: first seen by a netfilter or drop hook, not sent by a local
	 * socket the tracer saw (forwarded from outside, or its send missed) */
	RF_NO_SOCKET = 1 << 0,
	/* event: the packet is a DNS response */
	RF_RESPONSE = 1 << 1,
	/* event: winner is set */
	RF_WINNER = 1 << 2,
	/* query: first seen in its sender's own context (its send, or its skb
	 * still owned by the sending socket), so pid, comm and cgroup are the
	 * sender's; event (a query's drop): the skb was still owned by its
	 * socket, so it was dropped inside the send, which a netfilter drop
	 * fails with an error the sender sees */
	RF_SENDER = 1 << 3,
	/* query: first seen at its own drop: NAT in its own namespace dropped
	 * it, or it is a copy no earlier hop carried (a bridge flooding a
	 * frame to hosts that are not its destination, after NAT rewrote it) */
	RF_AT_DROP = 1 << 4,
	/* query: the flow table was full, so its flow was not kept: its
	 * answer cannot be matched (counted in STAT_FLOWS_REFUSED) */
	RF_UNTRACKED = 1 << 5,
};

struct tuple {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u8 family; /* 0 unknown, 4 IPv4, 6 IPv6 */
	__u8 proto;  /* IPPROTO_* */
	__u8 _pad[2];
};

struct ct {
	__u64 ptr; /* struct nf_conn address, 0 when none */
	__u32 status;
	__u32 _pad;
	struct tuple orig;  /* tuplehash[IP_CT_DIR_ORIGINAL] */
	struct tuple reply; /* tuplehash[IP_CT_DIR_REPLY] */
};

/* Every record starts with this. */
struct rec_hdr {
	__u64 ts;   /* bpf_ktime_get_ns */
	__u64 qid;  /* the query (cpu << 48 | sequence); 0 unknown */
	__u32 netns; /* inode of the namespace the hook ran in */
	__u16 cpu;
	__u8 type;  /* enum rec_type */
	__u8 tier;  /* enum tier */
};

struct rec_query {
	struct rec_hdr h;
	__u64 cgroup;  /* cgroup v2 id of current */
	__u32 pid;     /* tgid of current */
	__u16 dns_len; /* bytes of dns[] that follow */
	__u8 flags;    /* enum rec_flags */
	__u8 _pad;
	__u8 comm[16];
	struct tuple t; /* the asking socket's view (original direction) */
	/* followed by dns_len bytes of the DNS message */
};

struct rec_answer {
	struct rec_hdr h;
	__u16 dns_flags; /* the response's header flags (rcode in the low bits) */
	__u8 _pad[6];
};

struct rec_event {
	struct rec_hdr h;
	__u64 location;   /* drop: address that freed the skb */
	__u64 winner_qid; /* the winner's query, when the maps know it */
	__u32 reason;     /* drop: enum skb_drop_reason (0 before 5.17) */
	__u16 dns_len;    /* bytes of dns[] that follow (unmatched answers) */
	__u8 kind;        /* enum ev_kind */
	__u8 flags;       /* enum rec_flags */
	struct tuple pkt; /* the packet's IP/UDP header as the hook saw it */
	struct ct ct;     /* the packet's entry (the loser, for a race) */
	struct ct winner; /* the entry already in the table (RF_WINNER) */
	/* followed by dns_len bytes of the DNS message */
};

/* The flow table's sweep (bpf/lib/sweep.h), run by the loader with
 * BPF_PROG_TEST_RUN: this struct is the run's packet, in and out. */
#define SWEEP_BUCKETS 64

enum sweep_table {
	SWEEP_FLOWS = 0,
	SWEEP_ANSWERS = 1,
};

struct sweep_io {
	__u32 table;   /* in: enum sweep_table */
	__u32 max_age; /* in: older entries, in jiffies, are swept */
	/* in: the jiffies (low half) ages are taken at, 0 for now; out: those
	 * it took (an eviction pass takes the bins' pass's, so no entry
	 * changes bin between them) */
	__u32 now;
	__u32 _pad;
	/* in: entries at least evict_all jiffies old are evicted, and
	 * evict_some of those at least evict_from old; evict_all 0: none */
	__u32 evict_all;
	__u32 evict_from;
	__u32 evict_some;
	__u32 swept;     /* out */
	__u32 evicted;   /* out: each reported as EV_UNTRACKED */
	__u32 left;      /* out: entries kept */
	/* out: the kept entries by age, bucket age * SWEEP_BUCKETS / (max_age + 1) */
	__u32 hist[SWEEP_BUCKETS];
};

/* Runtime filters, one read-only global set by the loader before load. */
struct config {
	__u16 ports[MAX_PORTS]; /* DNS ports, host order; unused slots 0 */
	__u32 netns;            /* only this netns inode; 0 = every netns */
	__u32 wakeup_bytes;     /* wake the reader when this much is queued */
	/* kmem_cache_free without a cache argument (before 6.1): the
	 * nf_conntrack module's text, where its entries are freed */
	__u64 ct_free_lo;
	__u64 ct_free_hi;
	__u32 hz; /* jiffies a second (the kernel's HZ), measured by the loader */
	__u32 _pad;
};

/* Per-CPU counters, indexes of the stats map: event.StatRingLost and its
 * siblings. Not "enum stat": struct stat in vmlinux.h has that tag. */
enum stat_index {
	STAT_RING_LOST = 0,     /* records the ring buffer had no room for */
	STAT_FLOWS_NEW = 1,     /* flows inserted (queries first seen) */
	STAT_FLOWS_ANSWERED = 2, /* flows deleted because answered */
	STAT_FLOWS_REFUSED = 3, /* flows and answers entries a full table had no room for */
	STAT_MAX = 4,
};

#endif /* DNSRACE_H */
