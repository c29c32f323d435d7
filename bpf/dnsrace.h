/* Shared between the BPF programs (bpf/dnsrace.bpf.c) and user space.
 *
 * User space never mirrors these by hand: bpf2go generates Go types for
 * struct event, struct config, enum kind and enum tier (-type), and
 * internal/event/decode.go decodes the record at the offsets this header
 * defines; internal/event's tests build records from the generated type, so a
 * layout change here that Decode does not follow fails them.
 *
 * Byte order: every multi-byte integer is in host order (ports converted with
 * bpf_ntohs); addresses are in network order, IPv4 in the first 4 bytes.
 */
#ifndef DNSRACE_H
#define DNSRACE_H

/* Bytes of the DNS message kept per event: the 12-byte header, a question
 * name of up to 255 wire bytes and QTYPE/QCLASS. */
#define DNS_CAP 272

/* Must match event.Kind in internal/event/event.go (checked by a test). */
enum kind {
	KIND_INVALID = 0,
	KIND_SEND = 1,
	KIND_XMIT = 2,
	KIND_RECV = 3,
	KIND_DELIVER = 4,
	KIND_DROP = 5,
	KIND_CONFIRM = 6,
	KIND_CLASH = 7,
	KIND_CT_FREE = 8,
	KIND_RCVBUF_FULL = 9,
};

/* Must match event.Tier. */
enum tier {
	TIER_NONE = 0,
	TIER_TRACEPOINT = 1,
	TIER_KPROBE = 2,
	TIER_FENTRY = 3,
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
	__u64 ptr; /* struct nf_conn address, 0 when the skb has none */
	__u32 status;
	__u32 _pad;
	struct tuple orig;  /* tuplehash[IP_CT_DIR_ORIGINAL] */
	struct tuple reply; /* tuplehash[IP_CT_DIR_REPLY] */
};

struct event {
	__u64 ts;       /* bpf_ktime_get_ns */
	__u64 skb;      /* sk_buff address, 0 for send and ct_free */
	__u64 cgroup;   /* cgroup v2 id of current */
	__u64 location; /* drop: address that freed the skb */
	__u64 ct_after; /* confirm: skb->_nfct & ~7 on return */
	__u32 netns;    /* netns inode */
	__u32 ifindex;
	__u32 pid;      /* tgid of current */
	__u32 reason;   /* drop: enum skb_drop_reason */
	__s32 verdict;  /* confirm: NF_ACCEPT 1 / NF_DROP 0; -1 elsewhere */
	__u16 cpu;
	__u8 kind;      /* enum kind */
	__u8 tier;      /* enum tier */
	__u8 comm[16];
	struct tuple pkt;
	struct ct ct;
	struct ct winner; /* clash: the entry already in the table */
	__u16 dns_len;    /* valid bytes in dns[] */
	__u8 dns[DNS_CAP];
};

/* Runtime filters, one read-only global set by the loader before load. */
struct config {
	__u16 port;  /* DNS port, host order (default 53) */
	__u16 _pad;
	__u32 netns; /* only this netns inode; 0 = every netns */
};

#endif /* DNSRACE_H */
