// Package trace runs a tracing session: it loads and attaches the BPF
// programs (probe), feeds their events to the correlator, writes incidents
// as text or JSON Lines, and at the end reconciles what it attributed with
// the kernel's own per-CPU conntrack counters of every namespace where it
// saw DNS flows tracked, showing any mismatch.
//
// Counter baselines are taken when a namespace is first known: every named
// namespace and every process's namespace at start, and new ones as events
// reveal them. A namespace born after the start has its baseline taken on
// its first conntracked DNS packet, so a drop in that very packet can be
// missing from the kernel side of the reconciliation (the summary says which
// namespaces were late).
package trace
