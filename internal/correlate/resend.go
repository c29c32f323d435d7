package correlate

// A send that fails is resent by most resolvers at once: glibc sends the
// query again on its socket with the same id (the kernel side follows the
// two as one flow), Go's resolver and dnsmasq ask again on a new socket
// with a new id. Such a loss costs no wait and is no stall: it is reported
// as refused at send, with the resend. This file finds the resend: the
// same client's next query for the same name and type within MinRetryGap.

// resendSlots is the size of the table of each client's latest query per
// name and type: direct-mapped, a slot per query, overwritten in place.
const resendSlots = 1 << 12

type resendSlot struct {
	nk     nameKey
	qtype  uint16
	qid    uint64
	sentNs uint64
}

func resendSlotOf(nk nameKey, qtype uint16) uint64 {
	return (uint64(nk) ^ uint64(qtype)*0x9e3779b97f4a7c15) >> 52 & (resendSlots - 1)
}

// noteResend records q as its client's latest query for its name and type,
// and as the resend of the one before it when that was sent within
// MinRetryGap.
func (c *Correlator) noteResend(q *query) {
	s := &c.latest[resendSlotOf(q.nk, q.qtype)]
	if s.nk == q.nk && s.qtype == q.qtype && s.qid != 0 && q.sentNs >= s.sentNs && q.sentNs-s.sentNs < uint64(c.cfg.MinRetryGap) {
		if prev := c.ix.lookup(s.qid); prev != nil && !prev.dead {
			prev.extraForWrite().resentBy = q.qid
		}
	}
	*s = resendSlot{nk: q.nk, qtype: q.qtype, qid: q.qid, sentNs: q.sentNs}
}

// resentAtOnce returns the query that resent q at once: q itself when
// its resend was answered as the same flow, the next query its client
// sent for the question within MinRetryGap, or nil.
func (c *Correlator) resentAtOnce(q *query) *query {
	if q.state == stateAnswered {
		return q
	}
	if id := q.extraForRead().resentBy; id != 0 {
		return c.ix.lookup(id)
	}
	return nil
}

// refusedAtSend reports a loss its sender was told of and resent at once:
// an incident with no stall, its retry the resend. The loss is counted
// (Stats.Lost) and attributed like any, but opens no stall.
func (c *Correlator) refusedAtSend(q, resend *query, p Packet) {
	if q.state == statePending || q.state == stateUnwatched {
		// An answered one is one flow with its resend: answered.
		c.ix.setState(q, stateLost)
		c.ix.unpend(q)
		c.lost++
	}
	inc := c.newIncident(q, p.Cause, p.Race)
	inc.NodeNetNS = p.NetNS
	zero := 0.0
	inc.StallMs, inc.Retried, inc.RefusedAtSend = &zero, true, true
	inc.Retry = &Retry{QType: QType(resend.qtype), ID: resend.id, Src: resend.src, Dst: resend.dst}
	inc.Lost = append(inc.Lost, p)
	if w := q.extraForRead().winner; w != nil {
		inc.Winner = w
	}
	if sib := c.siblingQuery(q); sib != nil {
		inc.Sibling = describeSibling(q, sib)
	}
	// A forwarder that gave up after the error may have left its client
	// waiting: the client's stall names this loss, and this lists it.
	c.remember(pastStall{key: q.nk, firstNs: q.sentNs, endNs: q.sentNs, id: inc.ID, up: upstreamOf(q, inc)})
	c.lingerIncident(inc, q, q.sentNs, q.sentNs)
}
