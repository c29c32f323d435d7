// Package correlate turns the tracer's records into incidents: one per
// resolver timeout a lookup waited out, saying which query was lost and why,
// plus one per conntrack race the kernel rescued.
//
// The kernel side (bpf/dnsrace.bpf.c) owns each flow and names every query
// with an id (QID): a Query record when it is first seen, an Answer record
// when its answer reaches the asker, and an evidence record only when
// something happens that must be explained. This package keeps the queries
// in flight (index.go), decides what a lost query died of (rules.go), and
// groups lost queries into stalls (stalls.go).
//
// A query is lost when it is dropped, or when a retry for the same name
// leaves the same namespace while it is still unanswered. The retry closes
// the stall: the stall is the time from the lost query to the retry (about
// 5 s for glibc, 2.5 s for musl). A and AAAA of one attempt share a stall.
//
// What a dropped query died of (rules.go, dropRules; first match wins; a
// drop is classified a quarter second after it happened, so the winner's
// records and the kernel's counter increments are in, and drops with direct
// evidence of a race are classified first):
//
//	evidence                                                     cause          kernel counters explained
//	netfilter drop, entry unconfirmed, and confirm said NF_DROP  insert_race    insert_failed, drop
//	  or the namespace's insert_failed has room for it
//	netfilter drop, no entry at all, and the namespace's drop    table_full     drop
//	  counter has room for it
//	any other netfilter drop                                     rule_drop      -
//	any other drop                                               local_drop     -
//
// "Netfilter drop" is the drop reason NETFILTER_DROP, or before drop
// reasons (5.17; 5.15.58 backport) a packet freed by nf_hook_slow.
//
// The race of an insert_race (raceKind): same_tuple when the winning entry
// has the loser's original tuple (the same socket's other packet, A/AAAA),
// reply_clash when it is another flow holding the loser's reply tuple (two
// flows given the same SNAT mapping). The holder of the reply tuple wins
// over the holder of the original tuple (pickWinner): the kernel drops a
// loser whose original tuple clashed only when its reply tuple is taken too.
//
// What a dropped answer did to its query (answerDropRules), used when the
// query is declared lost:
//
//	drop reason (or, without reasons, the freeing function)          cause
//	NO_SOCKET, SOCKET_FILTER, NETFILTER_DROP, IP_NOPROTO              reply_unmatched
//	  (__udp4_lib_rcv, __udp6_lib_rcv, nf_hook_slow)
//	SOCKET_RCVBUFF, PROTO_MEM (udp_queue_rcv_one_skb, ...)            rcvbuf_full
//	anything else                                                     local_drop
//
// A query never answered and never seen dropped is no_reply. A race the
// kernel rescued (the loser merged into the winner, or inserted reply-only
// with IPS_NAT_CLASH, kernel >= 5.6) is one clash_resolved incident per
// loser, counted against the kernel's clash_resolve; its race is same_tuple
// unless the winner says otherwise. In the tracepoint tier a merged loser
// shows only as its freed unconfirmed entry, named by its original tuple:
// the loser is the last query its socket sent.
//
// The correlator is single-threaded: Handle, Tick and Close are called from
// one goroutine. Following an answered query allocates nothing: query
// structs are recycled, names interned, and the indexes are open-addressing
// tables without tombstones (table.go); a query answered within
// MinRetryGap never enters its name's index at all. A stall is one
// allocation, its incident inside it. Incidents are written as JSON by
// Incident.AppendJSON (json.go), byte for byte what encoding/json writes
// for their field tags, at a seventh of its cost.
package correlate
