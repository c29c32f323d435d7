/* CO-RE flavours for kernel layouts that changed across the versions dnsrace
 * supports (5.10 and later are tested; the comments say when each changed).
 * A flavour is a struct named <real>___<suffix>: libbpf and cilium/ebpf
 * relocate it against <real> in the running kernel's BTF, and
 * bpf_core_field_exists() tells which flavour applies.
 */
#ifndef DNSRACE_CORE_FIXES_H
#define DNSRACE_CORE_FIXES_H

/* struct iov_iter: commit de4f5fed3f23 ("iov_iter: add iter_iovec() helper",
 * v6.4) renamed the iovec pointer from iov to __iov. Both names are
 * flavours, so the code builds against either vmlinux.h (x86 is dumped from
 * 6.18, arm64 from 6.1). */
struct iov_iter___pre64 {
	const struct iovec *iov;
} __attribute__((preserve_access_index));

struct iov_iter___v64 {
	const struct iovec *__iov;
} __attribute__((preserve_access_index));

/* struct iov_iter: commit 8cd54c1c8480 ("iov_iter: separate direction from
 * flavour", v5.14) replaced "unsigned int type" (the flavour bit ORed with
 * the direction) with "u8 iter_type". Before it, ITER_IOVEC was a bit (4). */
struct iov_iter___pre514 {
	unsigned int type;
	size_t iov_offset;
	size_t count;
	const struct iovec *iov;
} __attribute__((preserve_access_index));

/* struct bpf_nf_ctx (v6.4, "bpf: add bpf_link support for BPF_NETFILTER
 * programs"), as a flavour: the object builds against a vmlinux.h of an
 * older kernel, and the program loads only on 6.4+. */
struct bpf_nf_ctx___dnsrace {
	const struct nf_hook_state *state;
	struct sk_buff *skb;
} __attribute__((preserve_access_index));

/* enum skb_drop_reason grows with every release; a reason newer than the
 * arm64 vmlinux.h (6.1) is named by a flavour of the enum, which
 * bpf_core_enum_value() relocates against the running kernel's. QUEUE_PURGE:
 * commit 7b25a37b1c0b ("net: skb: introduce SKB_DROP_REASON_QUEUE_PURGE"),
 * v6.10. */
enum skb_drop_reason___dnsrace {
	SKB_DROP_REASON_QUEUE_PURGE___dnsrace = 0,
};

/* skb:kfree_skb and kmem:kmem_cache_free changed their arguments; tp_btf
 * programs are chosen by the loader per prototype (internal/probe/hooks.go).
 * The perf tracepoint's record (tp_kfree_skb_perf) is one flavour whose
 * fields are tested with bpf_core_field_exists: reason since v5.17, rx_sk
 * since v6.11. */
struct trace_event_raw_kfree_skb___dnsrace {
	void *skbaddr;
	void *location;
	void *rx_sk;
	enum skb_drop_reason reason;
} __attribute__((preserve_access_index));

#endif /* DNSRACE_CORE_FIXES_H */
