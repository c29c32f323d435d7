// Package runcost measures what one run of a BPF program costs on the
// running kernel (`dnsrace bench --run-cost`): a trivial program on a
// tracepoint that this package fires itself, timed against the same
// firing with nothing attached.
//
// Two triggers, because where a run happens decides its cost:
//
//   - syscall: task:task_rename, fired by prctl(PR_SET_NAME) in a loop on
//     one pinned thread, one kernel entry per run, timed by the thread's
//     own CPU time. A hook on a system-call path (kmem_cache_free in an
//     open/close loop) runs like this.
//   - in-kernel: bpf_trace:bpf_trace_printk, fired by a driver program
//     that BPF_PROG_TEST_RUN repeats inside one kernel entry (as the
//     kernel's trig-* benchmarks keep their runs in the kernel), timed by
//     the kernel. Its ftrace event is switched off while it runs and put
//     back as it was.
//
// Each variant is one program (return 0, count, one helper) attached as a
// raw tracepoint (one also as tp_btf), or with kernel.bpf_stats_enabled
// on; rounds rotate the order so that drift falls on every variant alike,
// and a variant's figure is its median round. Every variant but the empty
// ones counts its runs in a per-CPU array, and Measure fails unless each
// ran once per firing: a figure is never about runs that did not happen.
// ReadMachine records what explains the difference between machines:
// page-table isolation and PCID, the indirect-call mitigation, the clock
// source.
//
// Needs root (CAP_BPF and CAP_PERFMON). Loads nothing of dnsrace's own.
package runcost
