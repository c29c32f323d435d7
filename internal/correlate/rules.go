package correlate

import (
	"strings"

	"github.com/dnsrace/dnsrace/internal/event"
)

// Every rule that names a cause lives in this file: a table from evidence
// to cause, first match wins. doc.go mirrors the tables in words; a change
// here changes both.

// dropEvidence is what is known about one dropped query when it is
// classified (a quarter second after the drop, so the winner's records and
// the kernel's counter increments are in).
type dropEvidence struct {
	reason   string // skb drop reason name; "" where the kernel has none
	location string // the freeing function ("nf_hook_slow"), from the symbol
	// The packet's conntrack entry: present, and confirmed.
	ct, confirmed bool
	// The confirm hook (fentry/kprobe) saw NF_DROP for it.
	confirmDrop bool
	// The entry holding its tuple is known (either tier).
	winner bool
	// The kernel's counters in the drop's namespace, minus what was
	// attributed there so far.
	insertBudget, dropBudget int64
}

// netfilter: a netfilter verdict dropped it: the drop reason says so, or,
// before drop reasons (5.17; 5.15.58 backport), nf_hook_slow freed it.
func (e *dropEvidence) netfilter() bool {
	if e.reason == "NETFILTER_DROP" {
		return true
	}
	return noReason(e.reason) && e.location == "nf_hook_slow"
}

// noReason: the record carries no usable drop reason (a kernel before
// 5.17, or a path that does not set one).
func noReason(name string) bool {
	return name == "" || name == "NOT_SPECIFIED" || strings.HasPrefix(name, "reason(")
}

type dropRule struct {
	why   string // in words, as doc.go says it
	when  func(*dropEvidence) bool
	cause string
	// counts are the kernel counters the cause explains.
	insertFailed, drop bool
}

// dropRules decide what a dropped query died of.
var dropRules = []dropRule{
	{
		why: "netfilter dropped it with its entry unconfirmed, and confirm said NF_DROP or the namespace's insert_failed has room for it",
		when: func(e *dropEvidence) bool {
			return e.netfilter() && e.ct && !e.confirmed && (e.confirmDrop || e.insertBudget > 0)
		},
		cause: CauseInsertRace, insertFailed: true, drop: true,
	},
	{
		why:   "netfilter dropped it with no entry at all, and the namespace's drop counter has room for it",
		when:  func(e *dropEvidence) bool { return e.netfilter() && !e.ct && e.dropBudget > 0 },
		cause: CauseTableFull, drop: true,
	},
	{
		why:   "any other netfilter drop: a rule",
		when:  (*dropEvidence).netfilter,
		cause: CauseRuleDrop,
	},
	{
		why:   "dropped for another reason on the way",
		when:  func(*dropEvidence) bool { return true },
		cause: CauseLocalDrop,
	},
}

// classifyDrop returns the first rule that matches e.
func classifyDrop(e *dropEvidence) *dropRule {
	for i := range dropRules {
		if dropRules[i].when(e) {
			return &dropRules[i]
		}
	}
	return &dropRules[len(dropRules)-1]
}

// answerDropRules decide what a dropped answer did to its query, by drop
// reason, or by the freeing function where the kernel has no reasons.
var answerDropRules = []struct {
	reasons, locations []string
	cause              string
}{
	{ // not reverse-NATed: nothing listens on the tuple it carries
		reasons:   []string{"NO_SOCKET", "SOCKET_FILTER", "NETFILTER_DROP", "IP_NOPROTO"},
		locations: []string{"__udp4_lib_rcv", "__udp6_lib_rcv", "nf_hook_slow"},
		cause:     CauseReplyUnmatched,
	},
	{ // the asking socket's receive buffer was full
		reasons:   []string{"SOCKET_RCVBUFF", "PROTO_MEM"},
		locations: []string{"udp_queue_rcv_one_skb", "__udp_queue_rcv_skb", "udpv6_queue_rcv_one_skb", "__udpv6_queue_rcv_skb"},
		cause:     CauseRcvbufFull,
	},
}

// answerDropCause is the cause a dropped answer gives its query.
func answerDropCause(reason, location string) string {
	for _, r := range answerDropRules {
		for _, n := range r.reasons {
			if reason == n {
				return r.cause
			}
		}
		if noReason(reason) {
			for _, l := range r.locations {
				if location == l {
					return r.cause
				}
			}
		}
	}
	return CauseLocalDrop
}

// raceKind says which race a loser lost, given the entry that won: the
// same original tuple (the same socket's other packet: A/AAAA), or the
// same reply tuple from another flow (two flows given the same SNAT
// mapping). Unknown without a winner.
func raceKind(loser, winner event.CT) string {
	switch {
	case winner.Ptr == 0:
		return ""
	case winner.Orig == loser.Orig:
		return RaceSameTuple
	default:
		return RaceReplyClash
	}
}

// pickWinner chooses between two candidate winners of a loser's race (the
// drop's own, and one known later or from the confirm hook): the holder of
// the loser's reply tuple from another flow wins over the holder of its
// original tuple. The kernel drops a loser whose original tuple clashed
// only when its reply tuple is taken too, so the reply holder is the one
// that made the difference.
func pickWinner(loser event.CT, a, b event.CT, aq, bq uint64) (event.CT, uint64) {
	holds := func(w event.CT) bool { return w.Ptr != 0 && w.Reply == loser.Reply && w.Orig != loser.Orig }
	switch {
	case holds(a):
		return a, aq
	case holds(b):
		return b, bq
	case a.Ptr != 0:
		return a, aq
	}
	return b, bq
}

// rescuedRace is the race of a loser the kernel rescued (merged, or
// inserted reply-only): a same-tuple race unless the winner says otherwise.
func rescuedRace(loser, winner event.CT) string {
	if r := raceKind(loser, winner); r != "" {
		return r
	}
	return RaceSameTuple
}

// symbolOf is the function name of a formatted location ("nf_hook_slow"
// of "nf_hook_slow+0x7d").
func symbolOf(loc string) string {
	if i := strings.IndexByte(loc, '+'); i >= 0 {
		return loc[:i]
	}
	return loc
}
