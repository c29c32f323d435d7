package correlate

import (
	"strconv"

	"github.com/dnsrace/dnsrace/internal/event"
)

// This file classifies: it gathers the evidence of each drop once it is
// due (and of each dropped answer as it is seen), and hands it to the
// rules (rules.go) to name a cause.

// pendingDrop is evidence waiting ClassifyDelay: a dropped query, an
// unconfirmed entry freed (a merged loser, named by its original tuple),
// or a rescue read before its query.
type pendingDrop struct {
	due      uint64
	kind     event.Kind // KindDrop, KindCTFreed, KindMerged or KindNATClash
	qid      uint64     // by id: the struct may be recycled meanwhile
	netns    uint32
	ct       event.CT
	winner   *event.CT // only a drop the kernel named a winner for: most have none, and a flood of drops waits here
	wqid     uint64
	reason   uint32
	location uint64
	timeNs   uint64
	flags    uint8 // the drop record's (event.FlagSender)
	// copy: the dropped packet was a copy of the query after NAT (its
	// addresses), first seen at its drop (copies.go)
	copy event.Tuple
	// sentNs: when the dropped query was sent (a freed entry: timeNs),
	// for OldestOpen.
	sentNs uint64
}

// reason names a drop reason value: its enum name for the rules ("" when
// unknown), and what the writers show.
func (c *Correlator) reason(v uint32) (r dropReason, shown string) {
	r.value = v
	if c.cfg.ReasonName == nil {
		return r, "reason(" + strconv.FormatUint(uint64(v), 10) + ")"
	}
	shown = c.cfg.ReasonName(v)
	if isEnumName(shown) {
		r.name = shown
	}
	return r, shown
}

// answerDropped records why the answer of a query was dropped: its query
// is named by the kernel (QID), or by the question the record carries.
func (c *Correlator) answerDropped(e *event.Event) {
	q := c.ix.lookup(e.QID)
	if q == nil && e.DNS.Valid {
		q = c.ix.byQuestion(e.DNS.ID, e.DNS.QType, c.hashName(e.DNS.NameKey()), e.TimeNs, uint64(c.cfg.QueryTTL))
	}
	if q == nil || q.dead {
		return
	}
	ev := &c.evidence
	*ev = evidence{seen: seenAnswerDrop}
	var reason, loc string
	ev.reason, reason = c.reason(e.Reason)
	ev.symbol, loc = c.location(e.Location)
	rule := decide(ev)
	if rule.delivered {
		if q.state == statePending {
			c.answer(q, e.TimeNs)
		}
		return
	}
	x := q.extraForWrite()
	x.replyCause, x.replyReason, x.replyLoc, x.replyNS = rule.cause, reason, loc, e.NetNS
}

// rcvbufFull: an answer hit a full receive buffer: its query's, or (before
// 6.10, no skb) every unanswered query of the socket.
func (c *Correlator) rcvbufFull(e *event.Event) {
	ev := &c.evidence
	*ev = evidence{seen: seenRcvbufHook}
	rule := decide(ev)
	mark := func(q *query) {
		x := q.extraForWrite()
		x.replyCause, x.replyReason, x.replyNS = rule.cause, rule.shownReason, e.NetNS
	}
	if q := c.ix.lookup(e.QID); q != nil {
		mark(q)
		return
	}
	// The record's tuple is the datagram's direction: the socket is its
	// reverse.
	r, n := c.ix.recentOnSocket(c.ix.sockets(e.Packet.Dst, e.Packet.Src))
	for _, q := range r[:n] {
		if q.state == statePending && q.netns == e.NetNS && q.src == e.Packet.Dst && q.dst == e.Packet.Src {
			mark(q)
		}
	}
}

// classifyDue classifies the drops due by now (all of them with force).
// Drops with direct evidence of a race go first: the counters' budget then
// goes to the drops that certainly raced before the others are weighed.
func (c *Correlator) classifyDue(now uint64, force bool) {
	k := 0
	for k < c.drops.len() && (force || c.drops.at(k).due <= now) {
		k++
	}
	if k == 0 {
		return
	}
	// Classifying pushes no drop: the k entries stay where they are.
	c.direct = c.direct[:0]
	for i := range k {
		c.direct = append(c.direct, c.isDirect(c.drops.at(i)))
	}
	clear(c.kernelNow)
	for _, first := range []bool{true, false} {
		for i := range k {
			if c.direct[i] == first {
				c.classify(c.drops.at(i))
			}
		}
	}
	for range k {
		c.drops.pop()
	}
}

// isDirect: the drop carries its own proof of a race (a winner, or
// confirm's NF_DROP).
func (c *Correlator) isDirect(d *pendingDrop) bool {
	if d.winner != nil && d.winner.Ptr != 0 {
		return true
	}
	q := c.ix.lookup(d.qid)
	return q != nil && (q.extraForRead().confirmDrop || q.extraForRead().winnerCT.Ptr != 0)
}

// budget returns how many more packets of a kind the kernel counted in ns
// than dnsrace explained so far. The kernel's counters are read once per
// namespace per batch of drops (a netlink round trip each): a flood of
// drops must not cost one read each.
func (c *Correlator) budget(ns uint32) (insertFailed, drop int64) {
	if c.cfg.Counters == nil {
		return 0, 0
	}
	d, ok := c.kernelNow[ns]
	if !ok {
		if d, ok = c.cfg.Counters.Delta(ns); !ok {
			return 0, 0
		}
		c.kernelNow[ns] = d
	}
	a := c.attributed(ns)
	return int64(d.InsertFailed) - int64(a.InsertFailed), int64(d.Drop) - int64(a.Drop)
}

// rescuedByQuery reports the rescue d holds (a Merged or NATClash record)
// if its query is known by now.
func (c *Correlator) rescuedByQuery(d *pendingDrop) bool {
	q := c.ix.lookup(d.qid)
	if q == nil {
		return false
	}
	var w event.CT
	if d.winner != nil {
		w = *d.winner
	}
	c.rescued(q, d.netns, d.ct, w, d.wqid, d.timeNs)
	return true
}

func (c *Correlator) classify(d *pendingDrop) {
	switch d.kind {
	case event.KindCTFreed:
		// A merged loser: the last query its socket sent (the loser left
		// on the winner's entry, so its own entry never met a device).
		if q := c.ix.onSocket(d.ct.Orig.Src, d.ct.Orig.Dst); q != nil {
			c.rescued(q, d.netns, d.ct, event.CT{}, 0, d.timeNs)
		}
		return
	case event.KindMerged, event.KindNATClash:
		// A rescue read before its query's record.
		c.rescuedByQuery(d)
		return
	}
	q := c.ix.lookup(d.qid)
	if q == nil {
		return
	}
	// A drop inside the send the sender then resent on the same socket
	// with the same id at once is one flow with its resend: answered by
	// now, and still a loss to explain (refusedAtSend).
	inSend := d.flags&event.FlagSender != 0
	if q.state != statePending && q.state != stateUnwatched && !(inSend && q.state == stateAnswered) {
		return
	}
	x := q.extraForRead()
	var dw event.CT
	if d.winner != nil {
		dw = *d.winner
	}
	winner, wqid := pickWinner(d.ct, dw, x.winnerCT, d.wqid, x.winnerQID)
	// The rules are function values, so evidence passed to them escapes:
	// it lives in the Correlator, not in a new object per drop.
	ev := &c.evidence
	*ev = evidence{seen: seenQueryDrop, ct: d.ct.Ptr != 0, confirmed: d.ct.Confirmed(), confirmDrop: x.confirmDrop,
		inSend: inSend}
	stale := c.staleNAT(q, d)
	ev.staleEntry = stale != nil
	var reason, loc string
	ev.reason, reason = c.reason(d.reason)
	ev.symbol, loc = c.location(d.location)
	if ev.netfilter() {
		ev.insertBudget, ev.dropBudget = c.budget(d.netns)
	}
	rule := decide(ev)
	p := Packet{QType: QType(q.qtype), ID: q.id, CPU: q.cpu, SentNs: q.sentNs, Cause: rule.cause,
		Reason: reason, Location: loc, NetNS: d.netns, SendFailed: ev.sendFailed()}
	a := c.attributed(d.netns)
	if rule.insertFailed {
		a.InsertFailed++
	}
	if rule.drop {
		a.Drop++
	}
	if !d.copy.IsValid() {
		q.nodeNS = d.netns // a copy's drop was not where NAT ran
	}
	if rule.raced {
		p.Race = raceKind(d.ct, winner)
		qx := q.extraForWrite()
		qx.race, qx.loserCT = p.Race, d.ct.Ptr
		if winner.Ptr != 0 {
			qx.winner = c.flowOf(winner, wqid)
		}
	}
	if rule.cause == CauseStaleNAT {
		q.extraForWrite().stale = stale
		if c.cfg.OnStaleNAT != nil {
			c.cfg.OnStaleNAT(*stale)
		}
	}
	if p.SendFailed {
		if r := c.resentAtOnce(q); r != nil {
			c.refusedAtSend(q, r, p)
			return
		}
	}
	c.markLost(q, p)
}

// flowOf describes a winning entry and, when known, the query behind it:
// the kernel named it (qid), or it is the last query sent on its
// original tuple.
func (c *Correlator) flowOf(ct event.CT, qid uint64) *Flow {
	f := &Flow{Src: ct.Orig.Src, Dst: ct.Orig.Dst, ReplySrc: ct.Reply.Src, ReplyDst: ct.Reply.Dst}
	q := c.ix.lookup(qid)
	if q == nil {
		q = c.ix.onSocket(ct.Orig.Src, ct.Orig.Dst)
	}
	if q != nil {
		f.NetNS, f.QName, f.QType, f.PID = q.netns, q.qname.String(), QType(q.qtype), q.pid
		f.Comm = c.comm(q.comm)
	}
	return f
}
