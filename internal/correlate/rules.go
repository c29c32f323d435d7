package correlate

import (
	"net/netip"
	"strconv"

	"github.com/dnsrace/dnsrace/internal/event"
)

// Every decision that names a cause lives in this file: one table from
// evidence to cause, first match wins, and one from a race's winner to the
// race's kind. doc.go says the same tables in words, row by row, and
// TestDocTablesAreTheRules holds the two to each other: a row's why is its
// words in doc.go.

// seen is what the tracer saw of a lost query, or of a rescued one: the
// first field of every rule's evidence.
type seen uint8

const (
	// seenQueryDrop: the query was freed on its way (a drop record).
	seenQueryDrop seen = iota + 1
	// seenAnswerDrop: its answer was freed before the asker read it.
	seenAnswerDrop
	// seenRcvbufHook: udp_fail_queue_rcv_skb fired for the asking socket:
	// its receive buffer refused an answer (before 6.10 it names the socket
	// only, not the packet).
	seenRcvbufHook
	// seenNothing: never answered, and neither the query nor its answer
	// seen dropped.
	seenNothing
	// seenRescue: the kernel resolved the query's conntrack race without
	// losing it: merged into the winner's entry, inserted reply-only
	// (IPS_NAT_CLASH), or, in the tracepoint tier, its unconfirmed entry
	// freed.
	seenRescue
	// seenUpstreamLoss: never answered or answered late, and the local
	// forwarder it asked lost its own query for the question.
	seenUpstreamLoss
	// seenLateAnswer: answered, but late, and nothing lost on the way.
	seenLateAnswer
)

// dropReason is an skb drop reason as a drop record carries it: its value,
// and its name in the running kernel's enum skb_drop_reason when one is
// known.
type dropReason struct {
	value uint32
	// name is the enum's name of value ("NETFILTER_DROP"); "" where the
	// kernel has no drop reasons (before 5.17) or its enum lacks the value.
	name string
}

// given: the kernel said why it dropped the packet (a known reason, other
// than NOT_SPECIFIED).
func (r dropReason) given() bool { return r.name != "" && r.name != "NOT_SPECIFIED" }

// evidence is what is known about one lost (or rescued) query when its
// cause is decided: for a dropped query, a quarter second after the drop,
// so the winner's records and the kernel's counter increments are in.
type evidence struct {
	seen   seen
	reason dropReason // of the drop seen, if any
	// symbol is the kernel function that freed the packet
	// ("nf_hook_slow"), from the symbol table; "" when unknown.
	symbol string
	// The dropped query's conntrack entry: present, and confirmed.
	ct, confirmed bool
	// The confirm hook (fentry/kprobe) saw NF_DROP for it.
	confirmDrop bool
	// The kernel's counters in the drop's namespace, minus what was
	// attributed there so far (read only for netfilter drops).
	insertBudget, dropBudget int64
	// inSend: the dropped packet still belonged to the socket that sent
	// it (event.FlagSender): it was dropped inside that send.
	inSend bool
	// staleEntry: the dropped query's entry was NATed and had been
	// answered before it (made by an earlier query of its socket).
	staleEntry bool
}

// Netfilter drops: a netfilter verdict dropped the packet when the drop
// reason says so, or, before drop reasons (5.17; 5.15.58 backport), when
// nf_hook_slow freed it.
const (
	netfilterReason = "NETFILTER_DROP"
	netfilterSymbol = "nf_hook_slow"
)

// netfilter: a netfilter verdict dropped the packet.
func (e *evidence) netfilter() bool {
	return e.reason.name == netfilterReason || !e.reason.given() && e.symbol == netfilterSymbol
}

// sendFailed: the sender was told of the loss. A netfilter verdict that
// drops a packet inside its send (the sender's own OUTPUT or POSTROUTING:
// NAT in the sender's namespace, a node's own process) fails the send with
// EPERM (nf_hook_slow); other drops there (a full qdisc, a neighbour that
// never answers) pass silently or happen after the send returned. Whether
// the loss is a stall is the sender's: glibc, Go and dnsmasq resend at
// once, musl ignores the error and waits for its next resend.
func (e *evidence) sendFailed() bool { return e.seen == seenQueryDrop && e.inSend && e.netfilter() }

// rule is one row of the table: the evidence it matches and the cause it
// names.
type rule struct {
	why  string // the row in words, exactly as doc.go's table says it
	seen seen
	// reasons and symbols, when either is set, match a drop whose reason
	// is one of reasons or, where the kernel gave no reason, whose freeing
	// function is one of symbols.
	reasons, symbols []string
	// when, if set, must hold too.
	when  func(*evidence) bool
	cause string
	// shownReason is the drop reason the writers show for evidence that
	// carries none of its own (the receive buffer hook).
	shownReason string
	// raced: the cause is a conntrack race, whose kind raceRules name.
	raced bool
	// delivered: no loss. The answer reached its asker, which stopped
	// reading before it came: it is an answer, timed at its free.
	delivered bool
	// The kernel counters the cause explains, one packet each.
	insertFailed, drop, clashResolve bool
}

func (r *rule) matches(e *evidence) bool {
	if r.seen != e.seen {
		return false
	}
	if len(r.reasons)+len(r.symbols) > 0 && !freedBy(e, r.reasons, r.symbols) {
		return false
	}
	return r.when == nil || r.when(e)
}

// freedBy: the drop's reason is one of reasons, or, without a reason, its
// freeing function is one of symbols.
func freedBy(e *evidence, reasons, symbols []string) bool {
	for _, n := range reasons {
		if e.reason.name == n {
			return true
		}
	}
	if e.reason.given() {
		return false
	}
	for _, s := range symbols {
		if e.symbol == s {
			return true
		}
	}
	return false
}

// rules decide what a lost query died of, and name a race the kernel
// rescued. Each kind of evidence ends with a row that matches all of it.
var rules = []rule{
	{
		why: "query dropped by netfilter, its entry unconfirmed, and confirm said NF_DROP or the namespace's " +
			"insert_failed has room for it",
		seen: seenQueryDrop,
		when: func(e *evidence) bool {
			return e.netfilter() && e.ct && !e.confirmed && (e.confirmDrop || e.insertBudget > 0)
		},
		cause: CauseInsertRace, raced: true, insertFailed: true, drop: true,
	},
	{
		why:   "query dropped by netfilter with no entry at all, and the namespace's drop counter has room for it",
		seen:  seenQueryDrop,
		when:  func(e *evidence) bool { return e.netfilter() && !e.ct && e.dropBudget > 0 },
		cause: CauseTableFull, drop: true,
	},
	{
		why:   "any other query dropped by netfilter: a rule",
		seen:  seenQueryDrop,
		when:  (*evidence).netfilter,
		cause: CauseRuleDrop,
	},
	{
		// the entry keeps sending the socket's queries to a backend
		// that is gone: no neighbour answers for its address (the
		// drop comes when the neighbour's queue gives up), no route
		// leads to it, a bridge floods it to hosts that are not it or
		// to the port of a device going away, or, its server gone
		// before its address, nothing listens there any more
		why: "query dropped for NEIGH_FAILED, NEIGH_QUEUEFULL, NEIGH_DEAD, QUEUE_PURGE, IP_OUTNOROUTES, " +
			"IP_INNOROUTES, OTHERHOST, NO_SOCKET or SOCKET_CLOSE; without a reason, freed by ip_rcv_core, " +
			"neigh_invalidate, __neigh_event_send, br_dev_queue_push_xmit, __udp4_lib_rcv, __udp6_lib_rcv or " +
			"udp_destruct_common; on a conntrack entry that was NATed and answered before it (an earlier query of " +
			"its socket made it)",
		seen: seenQueryDrop,
		reasons: []string{"NEIGH_FAILED", "NEIGH_QUEUEFULL", "NEIGH_DEAD", "QUEUE_PURGE", "IP_OUTNOROUTES", "IP_INNOROUTES",
			"OTHERHOST", "NO_SOCKET", "SOCKET_CLOSE"},
		symbols: []string{"ip_rcv_core", "neigh_invalidate", "__neigh_event_send", "br_dev_queue_push_xmit",
			"__udp4_lib_rcv", "__udp6_lib_rcv", "udp_destruct_common"},
		when:  func(e *evidence) bool { return e.staleEntry },
		cause: CauseStaleNAT,
	},
	{
		why:   "any other query dropped",
		seen:  seenQueryDrop,
		cause: CauseLocalDrop,
	},
	{
		// the asker gave up (its timeout) and closed its socket with the
		// answer in it, come meanwhile: answered, not lost, and late by
		// at most the free's time
		why: "answer freed at its socket's close (SOCKET_CLOSE; without a reason, freed by udp_destruct_common " +
			"or udp_destruct_sock): it reached the asker, who had stopped reading; an answer at that time",
		seen:      seenAnswerDrop,
		reasons:   []string{"SOCKET_CLOSE"},
		symbols:   []string{"udp_destruct_common", "udp_destruct_sock"},
		delivered: true,
	},
	{
		// not reverse-NATed: nothing listens on the tuple it carries
		why: "answer dropped for NO_SOCKET, SOCKET_FILTER, NETFILTER_DROP or IP_NOPROTO; without a reason, " +
			"freed by __udp4_lib_rcv, __udp6_lib_rcv or nf_hook_slow",
		seen:    seenAnswerDrop,
		reasons: []string{"NO_SOCKET", "SOCKET_FILTER", "NETFILTER_DROP", "IP_NOPROTO"},
		symbols: []string{"__udp4_lib_rcv", "__udp6_lib_rcv", "nf_hook_slow"},
		cause:   CauseReplyUnmatched,
	},
	{
		// the asking socket's receive buffer was full
		why: "answer dropped for SOCKET_RCVBUFF or PROTO_MEM; without a reason, freed by udp_queue_rcv_one_skb, " +
			"__udp_queue_rcv_skb, udpv6_queue_rcv_one_skb or __udpv6_queue_rcv_skb",
		seen:    seenAnswerDrop,
		reasons: []string{"SOCKET_RCVBUFF", "PROTO_MEM"},
		symbols: []string{"udp_queue_rcv_one_skb", "__udp_queue_rcv_skb", "udpv6_queue_rcv_one_skb", "__udpv6_queue_rcv_skb"},
		cause:   CauseRcvbufFull,
	},
	{
		why:         "udp_fail_queue_rcv_skb fired for the asking socket (an answer its receive buffer refused)",
		seen:        seenRcvbufHook,
		cause:       CauseRcvbufFull,
		shownReason: "SOCKET_RCVBUFF",
	},
	{
		why:   "answer dropped for any other reason",
		seen:  seenAnswerDrop,
		cause: CauseLocalDrop,
	},
	{
		why:   "never answered, and neither the query nor its answer seen dropped",
		seen:  seenNothing,
		cause: CauseNoReply,
	},
	{
		why: "never answered, or answered late, and the local forwarder it asked lost its own query for the " +
			"question (the one in flight, which the question joined, or the next)",
		seen:  seenUpstreamLoss,
		cause: CauseUpstreamLost,
	},
	{
		why:   "answered, but after a second or more, and neither it nor a forwarder's query for it lost",
		seen:  seenLateAnswer,
		cause: CauseLateAnswer,
	},
	{
		why: "a race the kernel rescued: the loser merged into the winner's entry, inserted reply-only " +
			"(IPS_NAT_CLASH), or (tracepoint tier before 6.4) its unconfirmed entry freed",
		seen:  seenRescue,
		cause: CauseClashResolved, raced: true, clashResolve: true,
	},
}

// decide returns the first rule that matches e. Every kind of evidence has
// a last row that matches all of it.
func decide(e *evidence) *rule {
	for i := range rules {
		if rules[i].matches(e) {
			return &rules[i]
		}
	}
	panic("correlate: no rule for evidence seen " + strconv.Itoa(int(e.seen)))
}

// raceRule is one row of the table that names a race from the entry that
// won it.
type raceRule struct {
	why  string // the row in words, exactly as doc.go's table says it
	when func(loser, winner event.CT) bool
	race string // "" for none known
}

// raceRules say which race a loser lost, given the entry that won: the
// same original tuple (the same socket's other packet: A/AAAA), or the
// same reply tuple from another flow (two flows given the same SNAT
// mapping).
var raceRules = []raceRule{
	{
		why:  "none known",
		when: func(_, w event.CT) bool { return w.Ptr == 0 },
	},
	{
		// the slab gives a freed entry's memory to the next entry
		// made on its CPU, most often the loser's own socket's next
		// flow, which holds the loser's original tuple
		why:  "at the loser's own address: an entry made after the loser was freed, none known",
		when: func(l, w event.CT) bool { return w.Ptr == l.Ptr },
	},
	{
		why:  "holds the loser's original tuple: the same socket's other query (A/AAAA)",
		when: func(l, w event.CT) bool { return w.Orig == l.Orig },
		race: RaceSameTuple,
	},
	{
		why:  "another flow holding the loser's reply tuple: two flows given the same SNAT mapping",
		when: func(event.CT, event.CT) bool { return true },
		race: RaceReplyClash,
	},
}

// rescuedRaceDefault is the race of a rescued loser whose winner is not
// known: the kernel rescues same-tuple races (A/AAAA on one socket) by
// merging them.
const rescuedRaceDefault = RaceSameTuple

// raceKind says which race a loser lost, given the entry that won; "" for
// none known.
func raceKind(loser, winner event.CT) string {
	for _, r := range raceRules {
		if r.when(loser, winner) {
			return r.race
		}
	}
	return ""
}

// rescuedRace is the race of a loser the kernel rescued (merged, or
// inserted reply-only): a same-tuple race unless the winner says otherwise.
func rescuedRace(loser, winner event.CT) string {
	if r := raceKind(loser, winner); r != "" {
		return r
	}
	return rescuedRaceDefault
}

// pickWinner chooses between two candidate winners of a loser's race (the
// drop's own, and one known later or from the confirm hook): the holder of
// the loser's reply tuple from another flow wins over the holder of its
// original tuple. The kernel drops a loser whose original tuple clashed
// only when its reply tuple is taken too, so the reply holder is the one
// that made the difference. An entry at the loser's own address is none
// (raceRules).
func pickWinner(loser event.CT, a, b event.CT, aq, bq uint64) (event.CT, uint64) {
	some := func(w event.CT) bool { return w.Ptr != 0 && w.Ptr != loser.Ptr }
	holds := func(w event.CT) bool { return some(w) && w.Reply == loser.Reply && w.Orig != loser.Orig }
	switch {
	case holds(a):
		return a, aq
	case holds(b):
		return b, bq
	case some(a):
		return a, aq
	case some(b):
		return b, bq
	}
	return event.CT{}, 0
}

// keepLateWinner says whether the late winner a dropped query has (a
// Winner record: the tracepoint tier saw it confirmed after the drop)
// stays when another comes. The drop awaits the holders of both of the
// loser's tuples; an entry of another flow holds its reply tuple and stays
// over one on the loser's original tuple, the asking socket's (src, dst),
// which the socket's next flow holds too once the loser is gone (glibc's
// AAAA after a lost A).
func keepLateWinner(src, dst netip.AddrPort, have, got event.CT) bool {
	otherFlow := func(w event.CT) bool { return w.Ptr != 0 && (w.Orig.Src != src || w.Orig.Dst != dst) }
	return otherFlow(have) && !otherFlow(got)
}

// isEnumName: s is a C enum constant's name (NETFILTER_DROP), as
// Config.ReasonName gives for a value the kernel's enum names; anything
// else it gives ("", or probe.DropReasonName's "reason(7)" for a value the
// enum lacks) names none.
func isEnumName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if ch := s[i]; !('A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '_') {
			return false
		}
	}
	return true
}
