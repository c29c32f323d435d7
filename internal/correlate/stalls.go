package correlate

import "github.com/dnsrace/dnsrace/internal/event"

// This file turns lost queries into stalls: a query is lost when it is
// dropped, or when a retry for the same name leaves the same namespace
// while it is still unanswered; the lost queries of one lookup attempt
// share one stall, which the retry ends. Races the kernel rescued are
// incidents too, with no stall.

// open is a stall in progress: lost queries of one lookup attempt. Its
// incident, and room for the usual one lost query, are part of it: a
// flood of drops opens tens of thousands of stalls a second, and one
// allocation each is a quarter of four.
type open struct {
	inc     *Incident // &incident
	key     nameKey
	firstNs uint64
	queries []*query
	retry   *query // the query that ended the stall

	incident Incident
	query1   [1]*query
	lost1    [1]Packet
}

// retry is called for every new query: an older unanswered query for the
// same name in the same namespace is lost, and the stall it caused ends now.
func (c *Correlator) retry(q *query) {
	s := c.ix.nameOfQuery(q)
	if s == nil {
		return
	}
	gap := uint64(c.cfg.MinRetryGap)
	for old := s.pend.head; old != nil; {
		next := old.nextPending
		switch {
		case old.state != statePending:
			s.pend.remove(old)
		case q.sentNs >= old.sentNs+gap:
			s.pend.remove(old)
			c.markLost(old, c.unansweredLoss(old))
		}
		old = next
	}
	if o := s.open; o != nil && q.sentNs >= o.firstNs+gap {
		o.retry = q
		c.closeOpen(o, q.sentNs, true)
	}
}

// unansweredLoss explains a query that was never answered and never seen
// dropped: its answer was dropped, or nothing local saw it at all.
func (c *Correlator) unansweredLoss(q *query) Packet {
	p := Packet{QType: QType(q.qtype), ID: q.id, CPU: q.cpu, SentNs: q.sentNs}
	if x := q.ext(); x.replyCause != "" {
		// decided when the answer's drop was seen
		p.Cause, p.Reason, p.Location, p.NetNS = x.replyCause, x.replyReason, x.replyLoc, x.replyNS
		return p
	}
	ev := &c.evidence
	*ev = evidence{seen: seenNothing}
	p.Cause = decide(ev).cause
	return p
}

// markLost records a lost query and adds it to the open stall of its
// lookup (A and AAAA of one attempt share one stall).
func (c *Correlator) markLost(q *query, p Packet) {
	if q.state != statePending && q.state != stateUnwatched {
		return
	}
	c.ix.setState(q, stateLost)
	c.lost++
	s := c.ix.nameStateOf(q.nk)
	o := s.open
	if o != nil && q.sentNs >= o.firstNs+uint64(c.cfg.MinRetryGap) {
		// An older stall whose retry was lost too: that retry ended it.
		o.retry = q
		c.closeOpen(o, q.sentNs, true)
		o = nil
	}
	if o == nil {
		c.capStalls(q.sentNs)
		o = &open{key: q.nk, firstNs: q.sentNs}
		o.inc, o.queries = &o.incident, o.query1[:0]
		c.fillIncident(o.inc, q, p.Cause, p.Race)
		o.inc.Lost = o.lost1[:0]
		s.open = o
		if len(c.opens) == 0 || o.firstNs < c.openLow {
			c.openLow = o.firstNs
		}
		c.opens[o] = true
		c.openLog.push(o)
	}
	q.held = true
	o.queries = append(o.queries, q)
	o.inc.Lost = append(o.inc.Lost, p)
}

// capStalls makes room for one more stall in progress: past MaxStalls the
// oldest is reported now, as not retried, and counted.
func (c *Correlator) capStalls(now uint64) {
	for len(c.opens) >= c.cfg.MaxStalls && c.openLog.len() > 0 {
		if o := c.openLog.pop(); c.opens[o] {
			c.closeOpen(o, now, false)
			c.early++
		}
	}
}

func (c *Correlator) newIncident(q *query, cause, race string) *Incident {
	inc := &Incident{}
	c.fillIncident(inc, q, cause, race)
	return inc
}

// fillIncident starts inc, a zero Incident, as q's.
func (c *Correlator) fillIncident(inc *Incident, q *query, cause, race string) {
	c.nextID++
	*inc = Incident{
		Type: "incident", ID: c.nextID, Time: c.cfg.Wall(q.sentNs), Cause: cause,
		QName: q.qname, QType: QType(q.qtype), NetNS: q.netns, PID: q.pid,
		Comm: c.comm(q.comm), Cgroup: q.cgroup, Src: q.src, Dst: q.dst,
		NodeNetNS: q.nodeNS, Tier: tierOf(q), Lost: []Packet{},
	}
	if race != "" {
		r := race // only a race's incident pays for the pointer
		inc.Race = &r
	}
}

func tierOf(q *query) string {
	if q.tier == event.TierNone {
		return event.TierTracepoint.String()
	}
	return q.tier.String()
}

// rescued emits a clash_resolved incident: a race the kernel resolved
// without losing the packet. One per loser, whichever records see it.
func (c *Correlator) rescued(q *query, ns uint32, loser, winner event.CT, wqid uint64, t uint64) {
	lk := lossKey{loser.Ptr, loser.Orig}
	if t0, done := c.counted[lk]; done && max(t, t0)-min(t, t0) < lossWindow {
		return
	}
	c.counted[lk] = t
	ev := &c.evidence
	*ev = evidence{seen: seenRescue}
	rule := decide(ev)
	var race string
	if rule.raced {
		race = rescuedRace(loser, winner)
	}
	inc := c.newIncident(q, rule.cause, race)
	inc.NodeNetNS = ns
	zero := 0.0
	inc.StallMs = &zero
	if winner.Ptr != 0 {
		inc.Winner = c.flowOf(winner, wqid)
	}
	if rule.clashResolve {
		c.attributed(ns).ClashResolve++
	}
	c.emit(inc, q)
}

func (c *Correlator) closeOpen(o *open, endNs uint64, retried bool) {
	delete(c.opens, o)
	if s, ok := c.ix.names.get(uint64(o.key)); ok && s.open == o {
		s.open = nil
		c.ix.dropName(o.key, s)
	}
	inc := o.inc
	inc.Retried = retried
	if r := o.retry; r != nil {
		inc.Retry = &Retry{QType: QType(r.qtype), ID: r.id, Src: r.src, Dst: r.dst}
	}
	if retried {
		ms := float64(endNs-o.firstNs) / 1e6
		inc.StallMs = &ms
	}
	first := o.queries[0]
	if inc.Race == nil && first.ext().race != "" {
		r := first.ext().race
		inc.Race = &r
	}
	for _, q := range o.queries {
		if w := q.ext().winner; w != nil {
			inc.Winner = w
			break
		}
	}
	if inc.NodeNetNS == 0 {
		inc.NodeNetNS = first.nodeNS
	}
	c.emit(inc, first)
	for _, q := range o.queries {
		q.held = false
		c.ix.recycle(q)
	}
}

func (c *Correlator) emit(inc *Incident, q *query) {
	if s := c.sibling(q); s != nil {
		inc.Sibling = s
	}
	if c.cfg.OnIncident != nil {
		c.cfg.OnIncident(inc)
	}
}

// sibling finds the other query of q's A/AAAA pair: sent on the same
// socket within MinRetryGap, another type, the same name; the first such
// in order of sighting among the socket's recent queries.
func (c *Correlator) sibling(q *query) *Sibling {
	r, n := c.ix.recentOnSocket(c.ix.socketHead(q.sock))
	for i := n - 1; i >= 0; i-- {
		other := r[i]
		if other == q || other.dead || other.netns != q.netns || other.src != q.src || other.dst != q.dst || other.qtype == q.qtype || other.name != q.name {
			continue
		}
		gap := int64(other.sentNs) - int64(q.sentNs)
		if gap < 0 {
			gap = -gap
		}
		if gap > int64(c.cfg.MinRetryGap) {
			continue
		}
		return &Sibling{
			QType: QType(other.qtype), ID: other.id, GapUs: float64(gap) / 1e3,
			CPUs: [2]int{int(q.cpu), int(other.cpu)}, Answered: other.state == stateAnswered,
			Lost: other.state == stateLost,
		}
	}
	return nil
}
