/* The flow table's sweep, run from user space (BPF_PROG_TEST_RUN of an
 * XDP program whose packet is a struct sweep_io): entries older than any
 * answer are deleted, and, when the loader asks, the oldest of the rest.
 *
 * Why in BPF, not with map syscalls: a syscall on a map holds the CPU's
 * bpf_prog_active while it works (bpf_disable_instrumentation), and every
 * kprobe program that fires on that CPU meanwhile is skipped. Where the
 * kernel preempts kernel code (PREEMPT_LAZY, 7.0+), the sweeping task is
 * preempted inside such a walk and the sends and reads of every other
 * task on its CPU go untraced until it runs again. A test run holds no
 * such count, and bpf_for_each_map_elem walks the table under RCU.
 */
#ifndef DNSRACE_LIB_SWEEP_H
#define DNSRACE_LIB_SWEEP_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"
#include "maps.h"
#include "record.h"

/* Emit the types bpf2go generates Go code for (-type). */
const struct sweep_io *unused_sweep_io __attribute__((unused));
const enum sweep_table *unused_sweep_table __attribute__((unused));

struct sweep_ctx {
	__u64 now;
	__u32 max_age;
	__u32 evict_all;
	__u32 evict_from;
	__u32 evict_some;
	__u32 swept;
	__u32 evicted;
	__u32 left;
	__u32 hist[SWEEP_BUCKETS];
};

/* report_evicted tells user space that qid's entry is gone, so its answer
 * will not be matched. The record is built in the ring itself: a test run
 * can be preempted, and the CPU's scratch belongs to the hooks. */
static __always_inline void report_evicted(__u64 qid)
{
	const __u64 size = sizeof(struct rec_event) - sizeof(struct ct) - sizeof(struct ct);
	struct rec_event *r = bpf_ringbuf_reserve(&events, size, 0);
	if (!r) {
		stat_inc(STAT_RING_LOST);
		return;
	}
	__builtin_memset(r, 0, size);
	fill_hdr(&r->h, REC_EVENT, TIER_NONE, qid, 0);
	r->kind = EV_UNTRACKED;
	bpf_ringbuf_submit(r, 0);
}

/* sweep_entry decides one entry's fate: it returns true when the entry is
 * to be deleted (and counts it), false when it stays (and bins its age). */
static __always_inline bool sweep_entry(struct sweep_ctx *c, __u64 ts, __u64 qid)
{
	/* The difference of the low halves, as the loader's own sweep takes
	 * it; an entry made on another CPU after now was read is younger
	 * than 0, not 49 days old. */
	__s32 d = (__s32)((__u32)c->now - (__u32)ts);
	__u32 age = d > 0 ? d : 0;
	if (age > c->max_age) {
		c->swept++;
		return true;
	}
	/* the oldest, and as many as asked of the bin where they end */
	if (c->evict_all && (age >= c->evict_all || (age >= c->evict_from && c->evict_some))) {
		if (age < c->evict_all)
			c->evict_some--;
		c->evicted++;
		report_evicted(qid);
		return true;
	}
	c->left++;
	__u64 i = (__u64)age * SWEEP_BUCKETS / ((__u64)c->max_age + 1);
	if (i < SWEEP_BUCKETS)
		c->hist[i]++;
	return false;
}

static long sweep_flow_entry(struct bpf_map *map, struct flow_key *k, struct flow *f, struct sweep_ctx *c)
{
	if (sweep_entry(c, f->ts, f->qid))
		bpf_map_delete_elem(&flows, k);
	return 0;
}

static long sweep_answer_entry(struct bpf_map *map, struct ans_key *k, struct ans *a, struct sweep_ctx *c)
{
	if (sweep_entry(c, a->ts, a->qid))
		bpf_map_delete_elem(&answers, k);
	return 0;
}

static __always_inline int sweep(struct xdp_md *ctx)
{
	struct sweep_io *io = (void *)(long)ctx->data;
	if ((void *)(io + 1) > (void *)(long)ctx->data_end)
		return XDP_ABORTED;
	__u64 now = io->now ? io->now : bpf_jiffies64();
	struct sweep_ctx c = {.now = now, .max_age = io->max_age,
				 .evict_all = io->evict_all, .evict_from = io->evict_from, .evict_some = io->evict_some};
	if (io->table == SWEEP_ANSWERS)
		bpf_for_each_map_elem(&answers, sweep_answer_entry, &c, 0);
	else
		bpf_for_each_map_elem(&flows, sweep_flow_entry, &c, 0);
	io->now = (__u32)now;
	io->swept = c.swept;
	io->evicted = c.evicted;
	io->left = c.left;
	__builtin_memcpy(io->hist, c.hist, sizeof(io->hist));
	return XDP_PASS;
}

#endif /* DNSRACE_LIB_SWEEP_H */
