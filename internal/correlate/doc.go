// Package correlate turns the tracer's records into incidents: one per
// lookup that waited out a resolver timeout (or several), saying which
// queries were lost and why, plus one per conntrack race the kernel
// rescued.
//
// The kernel side (bpf/dnsrace.bpf.c) owns each flow and names every query
// with an id (QID): a Query record when it is first seen, an Answer record
// when its answer reaches the asker, and an evidence record only when
// something happens that must be explained. This package keeps the queries
// in flight (index.go), gathers the evidence of each loss (classify.go),
// decides what a lost query died of (rules.go), and groups lost queries
// into stalls (stalls.go).
//
// A query is lost when it is dropped, or when a retry for the same name
// leaves the same namespace while it is still unanswered. A stall is one
// lookup's: A and AAAA of one attempt share it, and so do the lookup's next
// attempts when they lose a query too. A retry that resends one of the
// stall's lost queries or its A/AAAA sibling begins the lookup's next
// attempt: the same namespace and name, the same type and DNS id, from the
// same socket, or from the same process on a new one (glibc and musl resend
// a lookup's queries as they were, glibc's next attempt starts with A even
// when only AAAA was lost, and its last may reopen its socket). A DNS id
// alone names no lookup: pods that count their lookups ask with the same
// ids at the same time. The stall ends at that retry once every query of
// the attempt (the resends within MinRetryGap of the retry) is answered,
// and goes on if one is lost; an attempt that resent every query of the
// lookup (glibc resends both) is known whole at once, one that resent some
// (musl resends the unanswered) MinRetryGap after its retry. Any other
// later query for the name in the namespace (another lookup, or a resolver
// that draws new ids each attempt, as Go's does) ends the stall at once.
// The stall is the time from the first lost query to the retry that ended
// it (about 5 s a timeout for glibc, 2.5 s for musl); with no retry it ends
// QueryTTL after its latest attempt began, not retried (reported
// MinRetryGap later, once that attempt's other queries have expired into
// it: Go's resolver sends A and AAAA on sockets of their own). Stalls are reported
// as they end; OldestOpen bounds when the stalls not reported yet began, so
// a writer can put them in the order they began.
//
// What a lost query died of, and what a race the kernel rescued was
// (rules.go, rules: the first row that matches the evidence wins). A
// dropped query is decided a quarter second after its drop, so the
// winner's records and the kernel's counter increments are in, and drops
// with direct evidence of a race are decided first. A query whose answer
// was dropped is decided when the answer's drop is seen, and declared lost
// as an unanswered one.
//
//	evidence                                                   cause            kernel counters explained
//	query dropped by netfilter, its entry unconfirmed, and     insert_race      insert_failed, drop
//	  confirm said NF_DROP or the namespace's insert_failed
//	  has room for it
//	query dropped by netfilter with no entry at all, and the   table_full       drop
//	  namespace's drop counter has room for it
//	any other query dropped by netfilter: a rule               rule_drop        -
//	query dropped for NEIGH_FAILED, NEIGH_QUEUEFULL,            stale_nat        -
//	  NEIGH_DEAD, QUEUE_PURGE, IP_OUTNOROUTES, IP_INNOROUTES,
//	  OTHERHOST, NO_SOCKET or SOCKET_CLOSE; without a reason,
//	  freed by ip_rcv_core, neigh_invalidate,
//	  __neigh_event_send, br_dev_queue_push_xmit,
//	  __udp4_lib_rcv, __udp6_lib_rcv or udp_destruct_common; on
//	  a conntrack entry that was NATed and answered before it
//	  (an earlier query of its socket made it)
//	any other query dropped                                    local_drop       -
//	answer freed at its socket's close (SOCKET_CLOSE; without  -                -
//	  a reason, freed by udp_destruct_common or
//	  udp_destruct_sock): it reached the asker, who had
//	  stopped reading; an answer at that time
//	answer dropped for NO_SOCKET, SOCKET_FILTER,               reply_unmatched  -
//	  NETFILTER_DROP or IP_NOPROTO; without a reason, freed
//	  by __udp4_lib_rcv, __udp6_lib_rcv or nf_hook_slow
//	answer dropped for SOCKET_RCVBUFF or PROTO_MEM; without    rcvbuf_full      -
//	  a reason, freed by udp_queue_rcv_one_skb,
//	  __udp_queue_rcv_skb, udpv6_queue_rcv_one_skb or
//	  __udpv6_queue_rcv_skb
//	udp_fail_queue_rcv_skb fired for the asking socket (an     rcvbuf_full      -
//	  answer its receive buffer refused)
//	answer dropped for any other reason                        local_drop       -
//	never answered, and neither the query nor its answer       no_reply         -
//	  seen dropped
//	never answered, or answered late, and the local forwarder  upstream_lost    -
//	  it asked lost its own query for the question (the one in
//	  flight, which the question joined, or the next)
//	answered, but after a second or more, and neither it nor   late_answer      -
//	  a forwarder's query for it lost
//	a race the kernel rescued: the loser merged into the       clash_resolved   clash_resolve
//	  winner's entry, inserted reply-only (IPS_NAT_CLASH), or
//	  (tracepoint tier before 6.4) its unconfirmed entry freed
//
// "Dropped by netfilter" is the drop reason NETFILTER_DROP, or before drop
// reasons (5.17; 5.15.58 backport) a packet freed by nf_hook_slow. "Without
// a reason" is a kernel before drop reasons, NOT_SPECIFIED, or a value the
// kernel's enum does not name. The evidence is typed where it is read: the
// reason's enum name (Config.ReasonName) and the freeing function
// (Config.Symbol), not the text the writers show.
//
// The race of an insert_race or a clash_resolved (rules.go, raceRules), by
// the entry that won it:
//
//	winner                                                     race
//	none known                                                 -
//	at the loser's own address: an entry made after the loser  -
//	  was freed, none known
//	holds the loser's original tuple: the same socket's        same_tuple
//	  other query (A/AAAA)
//	another flow holding the loser's reply tuple: two flows    reply_clash
//	  given the same SNAT mapping
//
// A race the kernel rescued with no winner known is same_tuple: the kernel
// rescues those by merging. The holder of the reply tuple wins over the
// holder of the original tuple (pickWinner): the kernel drops a loser whose
// original tuple clashed only when its reply tuple is taken too. A rescued
// race is one clash_resolved incident per loser (kernel >= 5.6), counted
// against the kernel's clash_resolve. The fentry/kprobe tiers see a merge
// at confirm, the tracepoint tier on 6.4+ by the netfilter program just
// before confirm and the packet's next sight (both a Merged record naming
// the loser's query); before 6.4 the tracepoint tier sees a merged loser
// only as its freed unconfirmed entry, named by its original tuple: the
// loser is the last query its socket sent.
//
// The correlator is single-threaded: Handle, Tick and Close are called from
// one goroutine. Following an answered query allocates nothing: query
// structs are recycled, names interned (caches.go), and the indexes are
// open-addressing tables without tombstones (table.go); a query answered
// within MinRetryGap never enters its name's index at all. A stall is one
// allocation, its incident inside it. Incidents are written as JSON by
// Incident.AppendJSON (json.go), byte for byte what encoding/json writes
// for their field tags, without its reflection.
package correlate
