package correlate

import "github.com/dnsrace/dnsrace/internal/event"

// This file turns lost queries into stalls, one per lookup: a query is
// lost when it is dropped, or when a retry for the same name leaves the
// same namespace while it is still unanswered. The lost queries of one
// lookup attempt share one stall, and so do those of the lookup's next
// attempts when they are lost too; the stall ends at the first retry whose
// attempt loses nothing. Races the kernel rescued are incidents too, with
// no stall.

// stall is one lookup's stall while it is in progress: its lost queries. Its
// incident, room for the usual one lost query, and what the incident's
// pointers point to when it closes (its stall, retry, sibling and
// upstream) are part of it: a flood of drops opens and closes tens of
// thousands of stalls a second, each then one allocation at most, not
// six, and none once the incident written is given back (Recycle): the
// stall then holds a later one. What only a stall that sees a retry needs
// is in *retries, taken from the Correlator's free list then.
type stall struct {
	inc     *Incident // &incident
	key     nameKey
	firstNs uint64 // when its first lost query was sent
	// attemptNs is when the lookup's latest attempt that lost a query
	// began: firstNs, or the retry that began it. A query for the name
	// MinRetryGap after it is the lookup's next attempt (its retry).
	attemptNs uint64
	queries   []*query // lost, in the order they were found lost
	// retry is the query that ended the stall; while the retry's attempt
	// is not over, the query that began the lookup's next attempt.
	retry *query
	// waiting: it is in Correlator.waiting.
	waiting bool
	// sib is the first lost query's A/AAAA sibling, found when the stall
	// opened and held: a lookup that waits out several timeouts ends after
	// its first attempt's queries are forgotten (QueryTTL).
	sib *query
	r   *retries
	// openAt is its place in Correlator.stalls while it is in progress.
	openAt int
	// askKey: its first lost query was counted as asking a namespace
	// (askCounted); it is counted in Correlator.stallsAsking by that key
	// while it is in progress (0: not counted, or no longer).
	askKey uint64

	incident Incident
	query1   [1]*query
	lost1    [1]Packet
	stallMs  float64
	retryOf  Retry
	sibling  Sibling
	upstream Upstream
}

// stallSet is the stalls in progress: each knows its place in the slice,
// so opening and closing one writes no map.
type stallSet struct{ s []*stall }

func (set *stallSet) add(o *stall) {
	o.openAt = len(set.s)
	set.s = append(set.s, o)
}

// remove takes o out, if it is in, moving the last stall to its place.
func (set *stallSet) remove(o *stall) {
	if !set.has(o) {
		return
	}
	last := set.s[len(set.s)-1]
	set.s[o.openAt], last.openAt = last, o.openAt
	set.s[len(set.s)-1] = nil
	set.s = set.s[:len(set.s)-1]
}

func (set *stallSet) has(o *stall) bool {
	return o.openAt < len(set.s) && set.s[o.openAt] == o
}

// stallRef is a stall as the lists that let closed stalls leave lazily
// hold it (stallLog, waiting). Once a closed stall's incident is given
// back (Recycle) its memory may be a later stall: the incident's ID, set
// as a stall opens, tells the two apart.
type stallRef struct {
	o  *stall
	id uint64
}

func refOf(o *stall) stallRef { return stallRef{o, o.incident.ID} }

// inProgress: r is still the stall it was taken for, and that stall is in
// progress.
func (c *Correlator) inProgress(r stallRef) bool {
	return r.o.incident.ID == r.id && c.stalls.has(r.o)
}

func (set *stallSet) len() int { return len(set.s) }

// each calls fn for every stall in progress; fn may close the stall it is
// given (and no other).
func (set *stallSet) each(fn func(*stall)) {
	for i := len(set.s) - 1; i >= 0; i-- {
		if i < len(set.s) {
			fn(set.s[i])
		}
	}
}

// retries is what a stall that sees a retry needs.
type retries struct {
	// attempt holds the queries of the retry's attempt (those sent
	// within MinRetryGap of the retry that resend the lookup's) while the
	// stall waits for it: the stall ends at the retry once they are all
	// answered, and goes on if one is lost.
	attempt []*query
	// ids are the lookup's queries as a resend asks again: the lost
	// ones (the stall's queries[:idsOf]) and their A/AAAA siblings.
	ids   []asked
	idsOf int

	attempt1 [2]*query
	ids1     [4]asked
}

// asked is one of a lookup's queries as a resend repeats it: its type and
// DNS id, and the socket and process that sent it.
type asked struct {
	id   uint32 // type<<16 | DNS id
	pid  uint32
	sock sockKey
}

func askedOf(q *query) asked { return asked{id: lookupID(q), pid: q.pid, sock: q.sock} }

// retriesOf returns o's retry state, taken from the free list on first
// use (closeStall gives it back).
func (c *Correlator) retriesOf(o *stall) *retries {
	if o.r == nil {
		if n := len(c.freeRetries); n > 0 {
			o.r = c.freeRetries[n-1]
			c.freeRetries = c.freeRetries[:n-1]
		} else {
			o.r = &retries{}
		}
		o.r.attempt, o.r.ids = o.r.attempt1[:0], o.r.ids1[:0]
	}
	return o.r
}

// attempt is the retry's attempt's queries (none without a retry).
func (o *stall) attempt() []*query {
	if o.r == nil {
		return nil
	}
	return o.r.attempt
}

// retry is called for every new query: an older unanswered query for the
// same name in the same namespace is lost, and the stall in progress for
// the name ends now, or, when the query resends one of the stall's (its
// lookup's next attempt), once the attempt is over without a loss.
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
			// markLost may end the name's stall and forget its state
			// (then old was the last in the list: next is nil).
			s.pend.remove(old)
			c.markLost(old, c.unansweredLoss(old))
		}
		old = next
	}
	// The name's state now: the one held above may have been forgotten
	// and recycled, and a stall markLost opened is in a new one.
	if s = c.ix.nameOfQuery(q); s == nil {
		return
	}
	o := s.stall
	switch {
	case o == nil:
	case o.retry == nil:
		if q.sentNs < o.attemptNs+gap {
			break
		}
		o.retry = q
		if !c.resends(o, q) {
			// Another lookup, or a resolver that asks anew each
			// attempt (Go's): the stall ends here.
			c.closeStall(o, q.sentNs, true)
			break
		}
		r := c.retriesOf(o)
		r.attempt = append(r.attempt[:0], q)
		q.held = true
		if !o.waiting {
			o.waiting = true
			c.waiting = append(c.waiting, refOf(o))
		}
	case q.sentNs < o.retry.sentNs+gap:
		if c.resends(o, q) {
			r := c.retriesOf(o)
			r.attempt = append(r.attempt, q)
			q.held = true
		}
	case o.attemptOver():
		c.closeStall(o, o.retry.sentNs, true)
	}
}

// resends: q asks again what one of the stall's lost queries asked, or the
// A/AAAA sibling of one: the same namespace and name, the same type and
// DNS id, from the same socket, or from the same process on another (a
// resolver that reopens its socket: glibc's third attempt). glibc and musl
// resend a lookup's queries as they were (glibc's next attempt starts with
// A, even when only AAAA was lost); Go's resolver draws new ids, so its
// next attempt is taken for a new lookup, a stall of its own. DNS ids are
// no lookup's own: pods that count their lookups (the lab's musl
// emulation) ask with the same ids at the same time, and in one pod
// another process may draw the ids a lookup has.
func (c *Correlator) resends(o *stall, q *query) bool {
	// The stall's name state is keyed by a hash of both: check them.
	if first := o.queries[0]; q.netns != first.netns || q.name != first.name {
		return false
	}
	// The siblings are looked up once, at the stall's first retry, while
	// the first attempt's queries are still in flight.
	r := c.retriesOf(o)
	for ; r.idsOf < len(o.queries); r.idsOf++ {
		l := o.queries[r.idsOf]
		r.ids = append(r.ids, askedOf(l))
		if s := c.siblingQuery(l); s != nil {
			r.ids = append(r.ids, askedOf(s))
		}
	}
	id := lookupID(q)
	for _, a := range r.ids {
		if a.id == id && (a.sock == q.sock || a.pid == q.pid) {
			return true
		}
	}
	return false
}

func lookupID(q *query) uint32 { return uint32(q.qtype)<<16 | uint32(q.id) }

// attemptOver: every query of the retry's attempt was answered (a lost one
// goes on the stall, and a dropped one stays unanswered until its drop is
// decided).
func (o *stall) attemptOver() bool {
	for _, q := range o.attempt() {
		if !q.dead && q.state == statePending {
			return false
		}
	}
	return true
}

// resentAll: the retry's attempt has resent every query of the lookup
// (each lost one and its A/AAAA sibling), and had each answered. A
// resolver sends a query at most once an attempt, so nothing more of the
// attempt can come: the stall ends without waiting out MinRetryGap for
// the rest of it. glibc resends both queries of a lookup; musl only the
// unanswered ones, whose attempt is over MinRetryGap after its retry.
func (o *stall) resentAll() bool {
	r := o.r
	if r == nil || len(r.ids) == 0 || r.idsOf < len(o.queries) {
		return false // a query found lost late whose sibling is not known yet
	}
	for _, a := range r.ids {
		answered := false
		for _, q := range r.attempt {
			if lookupID(q) == a.id && q.state == stateAnswered {
				answered = true
				break
			}
		}
		if !answered {
			return false
		}
	}
	return true
}

// nextAttempt makes the stall go on: the lookup's attempt that began at
// at lost a query too. The stall waits for the lookup's next retry.
func (c *Correlator) nextAttempt(o *stall, at uint64) {
	for _, q := range o.attempt() {
		if q.state != stateLost { // the lost one is the stall's now
			q.held = false
			c.ix.recycle(q)
		}
	}
	if r := o.r; r != nil {
		clear(r.attempt)
		r.attempt = r.attempt[:0]
	}
	o.retry, o.attemptNs = nil, at
}

// lastAttempt is when the stall's latest attempt began; for a stall
// waiting for its retry's attempt, when that attempt's queries were all
// sent (MinRetryGap after the retry). A stall ends, not retried, QueryTTL
// after it: a query of the attempt waited that long is lost by then.
func (c *Correlator) lastAttempt(o *stall) uint64 {
	if r := o.retry; r != nil {
		return r.sentNs + uint64(c.cfg.MinRetryGap)
	}
	return o.attemptNs
}

// endAttempts ends the stalls whose retry's attempt is over by now,
// without a loss, at their retry: MinRetryGap after the retry, or once
// the attempt has resent and had answered every query of the lookup (an
// incident MinRetryGap late came after the pod was gone when its lookup
// was the pod's last: the tracer names the pod as it writes).
func (c *Correlator) endAttempts(now uint64) {
	gap := uint64(c.cfg.MinRetryGap)
	n := 0
	for _, r := range c.waiting {
		o := r.o
		switch {
		case !c.inProgress(r):
			continue // closed; maybe reused since
		case o.retry == nil:
			o.waiting = false
			continue
		case (now >= o.retry.sentNs+gap || o.resentAll()) && o.attemptOver():
			o.waiting = false
			c.closeStall(o, o.retry.sentNs, true)
			continue
		}
		c.waiting[n] = r
		n++
	}
	clear(c.waiting[n:])
	c.waiting = c.waiting[:n]
}

// unansweredLoss explains a query that was never answered and never seen
// dropped: its answer was dropped, or nothing local saw it at all.
func (c *Correlator) unansweredLoss(q *query) Packet {
	p := Packet{QType: QType(q.qtype), ID: q.id, CPU: q.cpu, SentNs: q.sentNs}
	if x := q.extraForRead(); x.replyCause != "" {
		// decided when the answer's drop was seen
		p.Cause, p.Reason, p.Location, p.NetNS = x.replyCause, x.replyReason, x.replyLoc, x.replyNS
		return p
	}
	ev := &c.evidence
	*ev = evidence{seen: seenNothing}
	p.Cause = decide(ev).cause
	return p
}

// markLost records a lost query and adds it to the stall in progress of
// its lookup: A and AAAA of one attempt share one stall, and so do the
// lookup's next attempts.
func (c *Correlator) markLost(q *query, p Packet) {
	if q.state != statePending && q.state != stateUnwatched {
		return
	}
	c.ix.setState(q, stateLost)
	c.lost++
	var o *stall
	if s, ok := c.ix.names.get(uint64(q.nk)); ok {
		o = s.stall
	}
	if o != nil {
		gap := uint64(c.cfg.MinRetryGap)
		switch r := o.retry; {
		case r == nil && q.sentNs < o.attemptNs+gap, r != nil && q.sentNs < r.sentNs:
			// of the latest attempt, or of an earlier one, found late
		case c.resends(o, q):
			// A later attempt lost it: the lookup waits on. It is the
			// retry's, or a retry that left no trace before its loss
			// (first seen where its answer cannot be).
			at := q.sentNs
			if r != nil && q.sentNs < r.sentNs+gap {
				at = r.sentNs
			}
			c.nextAttempt(o, at)
		default:
			// Another lookup's query: it ended the stall (its retry
			// unless the stall had one).
			end := q.sentNs
			if r != nil {
				end = r.sentNs
			} else {
				o.retry = q
			}
			c.closeStall(o, end, true)
			o = nil
		}
	}
	if o == nil {
		c.capStalls(q.sentNs)
		o = c.newStall()
		o.key, o.firstNs, o.attemptNs = q.nk, q.sentNs, q.sentNs
		if o.sib = c.siblingQuery(q); o.sib != nil {
			o.sib.held = true
		}
		c.fillIncident(o.inc, q, p.Cause, p.Race)
		o.inc.Lost, o.inc.owner = o.lost1[:0], o
		// Its lookup had a query answered late: the stall has it.
		if late := c.unlinger(c.lateOf(q)); late != nil {
			o.inc.Lost = append(o.inc.Lost, late.Lost...)
			delete(c.late, q.nk)
		}
		// Asked for only now: closeStall above forgets the name's state
		// when nothing else is going on, and a state held across it was
		// recycled for another name with this stall in it.
		c.ix.nameStateOf(q.nk).stall = o
		if c.stalls.len() == 0 || o.attemptNs < c.stallLow {
			c.stallLow = o.attemptNs
		}
		c.stalls.add(o)
		if q.askCounted {
			o.askKey = askKey(q.name, q.qtype, q.asked)
			c.stallsAsking.add(o.askKey, clientOf(q))
		}
		c.stallLog.push(refOf(o))
	}
	q.held = true
	o.queries = append(o.queries, q)
	o.inc.Lost = append(o.inc.Lost, p)
	if s := q.extraForRead().stale; s != nil && o.inc.StaleNAT == nil {
		o.inc.StaleNAT = s
		if o.inc.Cause == CauseLocalDrop || o.inc.Cause == CauseNoReply {
			// a first loss the entry's staleness explains too (its
			// server gone before its address)
			o.inc.Cause = CauseStaleNAT
		}
	}
}

// capStalls makes room for one more stall in progress: past MaxStalls the
// oldest is reported now, as not retried, and counted.
func (c *Correlator) capStalls(now uint64) {
	for c.stalls.len() >= c.cfg.MaxStalls && c.stallLog.len() > 0 {
		if r := c.stallLog.pop(); c.inProgress(r) {
			c.finish(r.o, now)
			c.early++
		}
	}
}

// newStall is a zero stall whose incident is its own: a recycled one
// when an incident was given back, else a new one.
func (c *Correlator) newStall() *stall {
	var o *stall
	if n := len(c.freeStalls); n > 0 {
		o = c.freeStalls[n-1]
		c.freeStalls = c.freeStalls[:n-1]
		*o = stall{}
	} else {
		o = &stall{}
	}
	o.inc, o.queries = &o.incident, o.query1[:0]
	return o
}

// Recycle gives back inc, an incident OnIncident had, once nothing reads
// it any more (the caller's writer wrote it, and keeps no pointer into
// it or anything it points to): the stall it was part of then holds a
// later stall, so a flood of drops allocates no stall per lookup. It must
// run where the Correlator's other methods do (the reader), after
// OnIncident returned, once per incident. Incidents not given back are
// the garbage collector's.
func (c *Correlator) Recycle(inc *Incident) {
	o := inc.owner
	if o == nil || o.inc != inc {
		return // not a stall's (a rescued race, a late answer)
	}
	inc.owner = nil
	if len(c.freeStalls) < maxFreeStalls {
		c.freeStalls = append(c.freeStalls, o)
	}
}

// maxFreeStalls bounds the stalls kept for reuse (under 1 KB each): a
// tick's incidents come back together, a flood's thousands, and past this
// many the rest are let go.
const maxFreeStalls = 16384

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
		QName: c.shownName(q), Name: q.qname, QType: QType(q.qtype), NetNS: q.netns, PID: q.pid,
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
	if rule.clashResolve && q.sentNs >= c.rescuesFrom[ns] {
		c.attributed(ns).ClashResolve++
	}
	c.emit(inc, q, c.siblingQuery(q))
}

// finish ends a stall that no retry ended in time: at its retry if the
// retry's attempt was still under way, else not retried.
func (c *Correlator) finish(o *stall, now uint64) {
	if r := o.retry; r != nil {
		c.closeStall(o, r.sentNs, true)
		return
	}
	c.closeStall(o, now, false)
}

// gaveUp: every loss of the stall failed its send (the sender was told),
// and the sender did not ask any of them again: a stall only waits on a
// loss its sender did not know of, or one it resent later (musl ignores
// the error and resends at its interval).
func (c *Correlator) gaveUp(o *stall) bool {
	for _, p := range o.inc.Lost {
		if !p.SendFailed {
			return false
		}
	}
	return o.retry == nil || !c.resends(o, o.retry)
}

// closeStall reports o's incident and forgets its name's state if nothing
// else is going on there: a caller must not use a *nameState it holds
// across it.
func (c *Correlator) closeStall(o *stall, endNs uint64, retried bool) {
	if o.askKey != 0 {
		c.stallsAsking.sub(o.askKey)
		o.askKey = 0
	}
	c.stalls.remove(o)
	if s, ok := c.ix.names.get(uint64(o.key)); ok && s.stall == o {
		s.stall = nil
		c.ix.dropName(o.key, s)
	}
	inc := o.inc
	switch {
	case c.gaveUp(o):
		// Told of every loss, the sender asked nothing again (dnsmasq
		// answers its client at once): nobody waited.
		o.stallMs = 0
		inc.StallMs, inc.RefusedAtSend = &o.stallMs, true
	default:
		inc.Retried = retried
		if r := o.retry; r != nil {
			o.retryOf = Retry{QType: QType(r.qtype), ID: r.id, Src: r.src, Dst: r.dst}
			inc.Retry = &o.retryOf
		}
		switch {
		case retried:
			o.stallMs = float64(endNs-o.firstNs) / 1e6
			inc.StallMs = &o.stallMs
		case o.attemptNs > o.firstNs:
			// No retry ended it, but the lookup tried again and lost
			// again: it waited at least until its last attempt (then
			// gave up, or the trace ended).
			o.stallMs = float64(o.attemptNs-o.firstNs) / 1e6
			inc.StallMs, inc.StallAtLeast = &o.stallMs, true
		}
	}
	first := o.queries[0]
	if inc.Race == nil && first.extraForRead().race != "" {
		r := first.extraForRead().race
		inc.Race = &r
	}
	for _, q := range o.queries {
		if w := q.extraForRead().winner; w != nil {
			inc.Winner = w
			break
		}
	}
	if inc.NodeNetNS == 0 {
		inc.NodeNetNS = first.nodeNS
	}
	if o.sib != nil {
		o.sibling = siblingOf(first, o.sib)
		inc.Sibling = &o.sibling
	}
	if inc.Cause == CauseNoReply {
		c.explainByForwarder(inc, first)
	}
	c.linger(o, endNs)
	// A query may be in two of these (a lost sibling): recycling it
	// twice does nothing the second time.
	for _, qs := range [][]*query{o.queries, o.attempt(), {o.sib}} {
		for _, q := range qs {
			if q != nil {
				q.held = false
				c.ix.recycle(q)
			}
		}
	}
	if r := o.r; r != nil {
		*r = retries{}
		c.freeRetries = append(c.freeRetries, r)
	}
	o.r, o.sib = nil, nil
}

// emit hands inc, q's incident, to OnIncident, with q's sibling, if any,
// as it is now.
func (c *Correlator) emit(inc *Incident, q, sib *query) {
	if sib != nil {
		inc.Sibling = describeSibling(q, sib)
	}
	if c.cfg.OnIncident != nil {
		c.cfg.OnIncident(inc)
	}
}

// describeSibling describes other, the other query of q's A/AAAA pair
// (siblingQuery).
func describeSibling(q, other *query) *Sibling {
	s := siblingOf(q, other)
	return &s
}

func siblingOf(q, other *query) Sibling {
	gap := int64(other.sentNs) - int64(q.sentNs)
	if gap < 0 {
		gap = -gap
	}
	return Sibling{
		QType: QType(other.qtype), ID: other.id, GapUs: float64(gap) / 1e3,
		CPUs: [2]int{int(q.cpu), int(other.cpu)}, Answered: other.state == stateAnswered,
		Lost: other.state == stateLost,
	}
}

// siblingWalk bounds siblingQuery's walk of a socket's queries: a flood
// from other namespaces on the same addresses costs no more.
const siblingWalk = 4 * sockRecentLen

// siblingQuery finds the other query of q's A/AAAA pair: sent on the same
// socket in the same namespace within MinRetryGap, another type, the same
// name; the first such in order of sighting among the socket's recent
// queries in q's namespace. Namespaces may have the same addresses
// (containers on separate bridges): the socket's queries in others are
// passed, up to siblingWalk queries in all, and not counted as recent.
func (c *Correlator) siblingQuery(q *query) *query {
	var r [sockRecentLen]*query
	n := 0
	for other, walked := c.ix.socketHead(q.sock), 0; other != nil && n < sockRecentLen && walked < siblingWalk; other, walked = c.ix.olderOnSocket(other), walked+1 {
		if other.netns == q.netns {
			r[n] = other
			n++
		}
	}
	for i := n - 1; i >= 0; i-- {
		other := r[i]
		if other == q || other.dead || other.src != q.src || other.dst != q.dst || other.qtype == q.qtype || other.name != q.name {
			continue
		}
		gap := int64(other.sentNs) - int64(q.sentNs)
		if gap < 0 {
			gap = -gap
		}
		if gap > int64(c.cfg.MinRetryGap) {
			continue
		}
		return other
	}
	return nil
}
