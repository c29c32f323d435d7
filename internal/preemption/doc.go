// Package preemption tells whether the running kernel preempts kernel code
// (its preemption model: none, voluntary, full, lazy, or a PREEMPT_RT
// build) and how it knows.
//
// It matters to the loader (internal/probe): a fentry or fexit program
// runs with migration off but preemption on, so where the kernel preempts
// kernel code a program in a task (a send, a read, a local packet's
// confirm) can be preempted, keeping its per-CPU recursion guard taken,
// and every other run of that program on the CPU is skipped until the task
// runs again (docs/kernel.md §12). Linux 7.0 left x86 and arm64 with full
// and lazy alone (7dadeaa6e851).
//
// Contract: Detect never guesses the safe answer away. It reads, in order,
// the model the scheduler reports (/sys/kernel/debug/sched/preempt, where
// debugfs is mounted), the build's flags in uname -v (a kernel built
// without PREEMPT_DYNAMIC has one model for good), and, for a dynamic
// build booted with no preempt= argument, the build's default from its
// config; every answer carries that basis. When none answers, or the
// command line asks for a model a kernel may refuse (7.0 refuses none and
// voluntary where lazy exists), the kernel is taken to preempt. Files are
// opened through the caller's kconfig.Opener, so doctor can read a host
// root mounted elsewhere.
package preemption
