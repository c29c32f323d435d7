/* Every map of the BPF programs, with the types of its keys and values,
 * grouped by the code that uses them.
 */
#ifndef DNSRACE_LIB_MAPS_H
#define DNSRACE_LIB_MAPS_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"
#include "packet_types.h"

/* ---- records ---------------------------------------------------------- */

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

/* Records a CPU sent (output_flags). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ring_sends SEC(".maps");

/* The slot's key lives in .rodata: the callers' stacks are full. */
static const __u32 ring_sends_key = 0;

/* ---- flows ------------------------------------------------------------ */

/* The sequence of query ids (new_qid), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} qid_seq SEC(".maps");

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

/* A plain preallocated hash, not an LRU: an answered query's flow is
 * inserted and deleted once each, and an LRU pays for its lists at both
 * (and evicts in per-CPU batches before it is full). The flows nobody
 * deletes (queries never answered) are swept once older than any answer
 * can be (lib/sweep.h); a full table refuses a new flow, counted and said
 * in its QUERY record (RF_UNTRACKED). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
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
	__u64 ts; /* made, in jiffies: the loader sweeps what nobody answered */
	struct flow_key fk;
};

/* Swept and refused as flows are. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct ans_key);
	__type(value, struct ans);
} answers SEC(".maps");

/* askers marks, per slot of namespace inode, the namespaces of that slot
 * that ever asked (a flow, or an answers entry made there): a response in a
 * namespace whose slot is 0 expects no answer, and the hops an answer
 * crosses on its way back (the DNS server's namespace, the node) cost one
 * array load instead of hash lookups. A slot is set once and never
 * cleared: a count kept per query would be written by every query on two
 * CPUs (a cache line they share), and a namespace that asked once only
 * pays the lookups every namespace paid before. */
#define ASKER_SLOTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ASKER_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} askers SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct preconfirm);
} preconfirm SEC(".maps");

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

/* ---- confirm (fentry/kprobe tiers) ------------------------------------ */

/* What confirm's entry knew, for its exit: the loser's entry is read at
 * entry, because after a merge it may already be freed and reused. */
struct pending_confirm {
	__u64 qid;
	__u32 netns;
	__u32 clashed; /* nf_ct_resolve_clash ran inside: winner is set */
	struct tuple pkt;
	struct ct ct;
	struct ct winner;
};

/* fentry: keyed by skb, completed at fexit (same skb argument). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct pending_confirm);
} confirm_entry SEC(".maps");

/* Confirm calls one CPU can have pending (kprobe). */
#define CONFIRM_DEPTH 4

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

/* Where the kernel preempts kernel code (confirm_by_task), a task can be
 * preempted inside confirm and return on another CPU: the stack is then
 * the task's, keyed by its thread id (or, for a CPU's idle task, whose id
 * is 0 on every CPU, by the CPU), and deleted when it empties. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct confirm_stack);
} confirm_stacks SEC(".maps");

/* Scratch for fentry's entry (the stack is too small for it). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pending_confirm);
} confirm_scratch SEC(".maps");

#endif /* DNSRACE_LIB_MAPS_H */
