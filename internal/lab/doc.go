// Package lab builds a miniature Kubernetes node out of network namespaces,
// reproduces each way a DNS lookup stalls (conntrack insertion races, a full
// table, firewall drops, replies that cannot be reverse-NATed, upstream loss)
// with real resolvers, measures ground truth, and tears it all down.
//
// Topology (names carry a prefix, "dnsrace" by default):
//
//	pod0..podN-1 (10.244.0.10+i, fd00:244::10+i) ── veth ── br0 10.244.0.1
//	                                                        │ node namespace:
//	                                                        │ DNAT VIP 10.96.0.10:53 → backend i (random per flow),
//	                                                        │ optional SNAT to 10.96.100.1:PORTS
//	dns namespace: backends 10.96.100.11.. ── veth ── to-dns 10.96.100.1
//
// The backends may listen on another port than the VIP's 53 (BackendPort).
//
// Most scenarios drop on the forwarding path of the node namespace, as on a
// real node. With LocalNAT the DNAT (and SNAT, to the pod's own address)
// rules sit instead in each pod's own namespace, on the OUTPUT and
// POSTROUTING hooks, as kube-proxy's rules act for a host-network pod; the
// node only routes. A NAT drop there is reported to the sender as EPERM:
// glibc and Go move on at once, musl ignores the error and waits.
//
// Ground truth comes from the kernel and the servers, not from a tracer: the
// per-CPU conntrack counters (ctstats) of every namespace that NATs (the
// node, or each pod with LocalNAT), UDP SNMP counters, nft counters of the
// queries each pod sent and the answers it got, the servers' own counts, and
// each client's measured lookup latency.
package lab
