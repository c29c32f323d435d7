// Package metrics exports a tracing session to Prometheus
// (prometheus/client_golang, its own registry, served at /metrics):
//
//	dnsrace_races_total{race,outcome}        conntrack insertion races: outcome "dropped" (an
//	                                         insert_race incident: a lookup stalled) or "resolved"
//	                                         (clash_resolved: the kernel rescued it); race
//	                                         same_tuple, reply_clash or unknown (all six
//	                                         series present from 0)
//	dnsrace_incidents_total{cause}           incidents by cause (every cause present from 0)
//	dnsrace_stall_seconds                    histogram of stall durations (lost query to retry)
//	dnsrace_events_lost_total                ring buffer records the kernel could not deliver
//	dnsrace_bpf_recursion_misses_total{program}  hook calls the kernel skipped a program for (a BPF
//	                                         program already ran on that CPU); one per program
//	dnsrace_probes{hook,tier}                1 when the hook is attached at that tier, else 0
//	dnsrace_conntrack_insert_failed_total{netns}  the kernel's own per-CPU conntrack counters,
//	dnsrace_conntrack_drop_total{netns}           summed, read at scrape time, as deltas since
//	dnsrace_conntrack_early_drop_total{netns}     dnsrace took the namespace's baseline; one
//	dnsrace_conntrack_clash_resolve_total{netns}  netns (inode) per namespace with tracked DNS
//	dnsrace_pod_incidents_total{namespace,pod,cause}  only with Config.PodLabels
//
// Labels stay bounded: causes, races, hooks, programs and tiers are fixed sets; netns
// is one value per namespace where DNS was connection-tracked (the node's,
// and pods' own only when they run conntrack); pod labels are opt-in and
// capped at Config.MaxPods distinct pods, after which every other pod is
// counted as namespace="other", pod="other".
//
// Live values (events lost, recursion misses, probes, conntrack) come from a Source read at
// every scrape, so they are never stale and cost nothing between scrapes.
package metrics
