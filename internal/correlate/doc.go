// Package correlate turns the tracer's events into incidents: one per
// resolver timeout a lookup waited out, saying which query was lost and why,
// plus one per conntrack race the kernel rescued.
//
// It follows each DNS query by the sk_buff that carries it (one skb crosses
// veth pairs and namespaces unchanged), from the first device it leaves
// (the pod's) through the node's NAT to the upstream, and its answer back by
// (netns, reversed 5-tuple, DNS id, qtype). A query is lost when it is
// dropped (skb:kfree_skb), or when a retry for the same name leaves the same
// namespace while it is still unanswered. The retry closes the stall: the
// stall is the time from the lost query to the retry.
//
// A netfilter drop of a query whose conntrack entry is unconfirmed is an
// insertion race when a confirmed entry with the same reply tuple (reply
// clash: another flow got the same SNAT mapping) or the same original tuple
// (same-tuple race) was seen in that namespace; that entry is the winner.
// With the fentry/kprobe tiers the confirm verdict says it directly. The
// kernel's per-CPU counters (insert_failed, drop) decide what events alone
// cannot: a drop with no entry at all is table_full only while the node's
// drop counter has room for it, else rule_drop. Drops are classified after a
// short delay, so the winner's events and the counter increments are in.
//
// The correlator is single-threaded: Handle, Tick and Close are called from
// one goroutine.
package correlate
