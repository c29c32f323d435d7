// Package ctstats reads the kernel's own per-CPU conntrack counters
// (insert_failed, drop, early_drop, clash_resolve, ...) of one network
// namespace over ctnetlink (IPCTNL_MSG_CT_GET_STATS_CPU), plus the table's
// fill (entries and nf_conntrack_max).
//
// It is the ground truth dnsrace compares itself with: the lab reports
// deltas of these counters, the tracer reconciles what it attributed against
// them, and doctor shows them. The counters live in the namespace where NAT
// and confirmation happen (the host namespace on a Kubernetes node).
//
// The dump is issued through github.com/ti-mo/netfilter, the framing layer
// of github.com/ti-mo/conntrack, because conntrack v0.6.0's Stats drops the
// CLASH_RESOLVE (5.10+) and CHAIN_TOOLONG (5.15+) attributes.
package ctstats
