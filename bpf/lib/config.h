/* The runtime configuration the loader sets before load (read-only, so the
 * verifier prunes what a setting turns off), and the filters that read it.
 */
#ifndef DNSRACE_LIB_CONFIG_H
#define DNSRACE_LIB_CONFIG_H

#include "vmlinux.h"
#include "bpf_helpers.h"
#include "dnsrace.h"

volatile const struct config cfg = {
	.ports = {53},
	.wakeup_bytes = 1 << 20,
	.hz = 250,
};

/* Windows (a hop or a resend, a copy of an answer, a late winner) are
 * timed in jiffies: bpf_jiffies64 reads a variable where bpf_ktime_get_ns
 * reads the clock source, slow on a VM, and the tracepoint tier times every
 * hop. Their ends are off by up to a tick (1 to 10 ms), nothing next to the
 * windows' 100 ms to 1 s. */
static __always_inline bool within_ms(__u64 then, __u64 now, __u64 ms)
{
	return (now - then) * 1000 < ms * cfg.hz;
}

/* Set by the loader when the tracer runs on tracepoints alone (its mode,
 * internal/probe ModeTracepoint): without the conntrack confirm and clash
 * hooks, the device hooks watch entries get confirmed instead, and no send
 * hook starts a flow without a source address. */
volatile const bool tracepoint_mode = false;

/* Set by the loader where the kernel preempts kernel code (internal/
 * preemption): the kprobe tier pairs confirm's entries and returns per task,
 * not per CPU (maps.h, confirm_stacks). */
volatile const bool confirm_by_task = false;

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

static __always_inline bool netns_match(__u32 inum)
{
	return cfg.netns == 0 || cfg.netns == inum;
}

#endif /* DNSRACE_LIB_CONFIG_H */
