package correlate

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// A local forwarder (NodeLocal DNSCache, a dnsmasq, systemd-resolved)
// answers a pod's query by asking upstream itself, and joins identical
// questions in flight to one upstream query: when that query is lost, the
// pods wait, though nothing lost theirs. Their queries are then never
// answered (no_reply), or answered late, once the forwarder's next try
// gets through. This file ties such a pod's stall to the forwarder's lost
// query, and the forwarder's incident back to the pods that waited on it.
//
// The forwarder is whoever holds the address the pod asked (Config.
// AddrOwner; a loopback address is the pod's own namespace), and its
// query is its latest for the same question (name and type) from that
// namespace. Its loss is its stall: in progress, or among the last ones
// its client closed (stallHistory), covering the pod's query. Its
// incident waits Config.ForwarderGrace after its stall ends (lingering)
// for the pods' stalls to name it, and longer while a pod's query that
// joined it is still open (awaited).

// Upstream is the query a local forwarder sent upstream for the question
// of a client's query, and what became of it.
type Upstream struct {
	// Incident is the forwarder's incident (its id), when it has one.
	Incident uint64         `json:"incident,omitempty"`
	NetNS    uint32         `json:"netns"`
	PID      uint32         `json:"pid,omitempty"`
	Comm     string         `json:"comm,omitempty"`
	QType    QType          `json:"qtype,omitzero"`
	ID       uint16         `json:"id,omitempty"`
	Src      netip.AddrPort `json:"src,omitzero"`
	Dst      netip.AddrPort `json:"dst,omitzero"`
	// Cause, Race and the drop: the upstream query's own loss.
	Cause    string `json:"cause,omitempty"`
	Race     string `json:"race,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Location string `json:"location,omitempty"`
	// LostIn is the namespace where it was dropped.
	LostIn uint32 `json:"lost_in,omitempty"`
	// SentMs is when it was sent, from the client's query (negative: it
	// was in flight already, and the client's question joined it).
	SentMs float64 `json:"sent_ms"`
	// TCP: the forwarder asked upstream over TCP (no UDP query of it was
	// seen), which dnsrace does not follow: its answer came late, why is
	// not known.
	TCP bool `json:"tcp,omitempty"`
}

// Asker is a client's query that waited on a forwarder's lost query.
type Asker struct {
	Incident uint64         `json:"incident"`
	NetNS    uint32         `json:"netns"`
	Src      netip.AddrPort `json:"src"`
	QType    QType          `json:"qtype"`
	ID       uint16         `json:"id"`
}

// maxDownstream caps the askers an incident lists (the rest are counted).
const maxDownstream = 16

// latestSlots is the size of the table of each namespace's latest query
// per question: direct-mapped, a slot per query, overwritten in place.
const latestSlots = 1 << 13

type latestRef struct {
	key uint64
	nk  nameKey // the client that asked: its stalls outlive its queries
}

func latestKey(name uint64, qtype uint16, netns uint32) uint64 {
	return name ^ uint64(qtype)*0x9e3779b97f4a7c15 ^ (uint64(netns)+1)*0xc2b2ae3d27d4eb4f
}

// noteLatest records q as its namespace's latest query for its question.
func (c *Correlator) noteLatest(q *query) {
	k := latestKey(q.name, q.qtype, q.netns)
	c.latestByNS[k>>51&(latestSlots-1)] = latestRef{key: k, nk: q.nk}
}

// latestIn returns the client in netns that last asked the question of q.
func (c *Correlator) latestIn(q *query, netns uint32) (nameKey, bool) {
	k := latestKey(q.name, q.qtype, netns)
	r := c.latestByNS[k>>51&(latestSlots-1)]
	return r.nk, r.key == k
}

// historySlots and historyWays size the table of each client's last
// stalls per name (its losses refused at send among them): a forwarder's
// stall is looked up there once it has ended. A slot keeps the last
// historyWays of the clients hashed to it.
const (
	historySlots = 1 << 8
	historyWays  = 8
)

type historySet struct {
	past [historyWays]pastStall
	next uint8
}

// pastStall is an ended stall, as a client's query may need it: when it
// ran, its incident's ID (the incident itself may be given back once
// emitted: Recycle), and its first lost query's upstream.
type pastStall struct {
	key            nameKey
	firstNs, endNs uint64
	id             uint64
	up             Upstream
}

func historySlot(k nameKey) uint64 { return uint64(k) >> 54 & (historySlots - 1) }

// lingering is an incident waiting Config.ForwarderGrace to be emitted,
// or longer while a client's query that may name it is open (awaited).
type lingering struct {
	inc                 *Incident
	firstNs, endNs, due uint64
	// key, name and qtype: the client whose stall it is, and the question
	// of its first lost query.
	key   nameKey
	who   uint64 // clientOf
	name  uint64
	qtype uint16
}

// linger holds inc for Config.ForwarderGrace before it is emitted, and records
// the stall in its client's history.
func (c *Correlator) linger(o *stall, endNs uint64) {
	first := o.queries[0]
	c.remember(pastStall{key: o.key, firstNs: o.firstNs, endNs: endNs, id: o.inc.ID, up: upstreamOf(first, o.inc)})
	c.lingerIncident(o.inc, first, o.firstNs, endNs)
}

// remember records an ended stall in its client's history.
func (c *Correlator) remember(p pastStall) {
	h := &c.history[historySlot(p.key)]
	h.past[h.next%historyWays] = p
	h.next++
}

// pastStallOf returns the latest ended stall of client nk that covers.
func (c *Correlator) pastStallOf(nk nameKey, covers func(firstNs, endNs uint64) bool) *pastStall {
	var best *pastStall
	h := &c.history[historySlot(nk)]
	for i := range h.past {
		if p := &h.past[i]; p.key == nk && p.id != 0 && covers(p.firstNs, p.endNs) && (best == nil || p.firstNs > best.firstNs) {
			best = p
		}
	}
	return best
}

// lingerIncident holds inc, whose stall ran from firstNs to endNs and
// began with q lost, for Config.ForwarderGrace (none: it is emitted now).
func (c *Correlator) lingerIncident(inc *Incident, q *query, firstNs, endNs uint64) {
	if c.cfg.ForwarderGrace == 0 {
		if c.cfg.OnIncident != nil {
			c.cfg.OnIncident(inc)
		}
		return
	}
	if c.cfg.OnClosed != nil {
		c.cfg.OnClosed(inc.NetNS, inc.PID, inc.Cgroup)
	}
	c.waitingOut = append(c.waitingOut, lingering{inc: inc, firstNs: firstNs, endNs: endNs, due: endNs + uint64(c.cfg.ForwarderGrace),
		key: q.nk, who: clientOf(q), name: q.name, qtype: q.qtype})
}

// emitLingering emits the incidents whose grace is over by now (all with
// force).
func (c *Correlator) emitLingering(now uint64, force bool) {
	n := 0
	for _, l := range c.waitingOut {
		if !force && l.due <= now && c.awaited(&l, now) {
			l.due = now + uint64(c.cfg.ForwarderGrace)
		}
		if force || l.due <= now {
			if c.cfg.OnIncident != nil {
				c.cfg.OnIncident(l.inc)
			}
			if late, ok := c.late[l.inc.key]; ok && late.inc == l.inc {
				delete(c.late, l.inc.key)
			}
			continue
		}
		c.waitingOut[n] = l
		n++
	}
	clear(c.waitingOut[n:])
	c.waitingOut = c.waitingOut[:n]
	if force {
		clear(c.history[:])
	}
}

// askWalk bounds the pending queries awaited looks at for one incident:
// past it, the incident waits as if one of them were a client's.
const askWalk = 1 << 12

// awaited: a client's query that joined l's stall (asked the namespace of
// l's incident the same question while the stall lasted) is still
// unanswered, or in a stall of its own, so it may yet name l's incident
// (explainByForwarder): a pod that asked late in a forwarder's stall and
// waits out its resolver's timeout closes seconds after the forwarder's
// stall ended. l waits for it, at most QueryTTL past its stall's end.
func (c *Correlator) awaited(l *lingering, now uint64) bool {
	if now > l.endNs+uint64(c.cfg.QueryTTL) || l.inc.NetNS == 0 {
		return false
	}
	// A query is counted once MinRetryGap old: every query sent in the
	// stall is, by then.
	gap := uint64(c.cfg.MinRetryGap)
	if now < l.endNs+gap {
		return true
	}
	c.ix.promote(now, gap)
	k := askKey(l.name, l.qtype, l.inc.NetNS)
	if c.stallsAsking.others(k, l.who) {
		for _, o := range c.stalls.s {
			c.awaitLooks++
			if c.joined(l, o.queries[0]) {
				return true
			}
		}
	}
	ix := &c.ix
	if !ix.asking.others(k, l.who) {
		return false
	}
	// The order log is by sighting, near enough by send time: find the
	// first query sent MinRetryGap before the stall began (the window of
	// askedDuring), less another for records out of order, and walk to
	// its end.
	lo, hi := max(c.pendFrom, ix.popped), ix.pushed
	from := l.firstNs - min(l.firstNs, 2*gap)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if (*ix.order.at(int(mid - ix.popped))).sentNs < from {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for i, n := lo, 0; i < ix.pushed; i, n = i+1, n+1 {
		q := *ix.order.at(int(i - ix.popped))
		if q.sentNs > l.endNs+gap {
			break
		}
		if n == askWalk {
			return true
		}
		c.awaitLooks++
		if !q.dead && q.state == statePending && c.joined(l, q) {
			return true
		}
	}
	return false
}

// joined: q, another client's query, asked the question of l's stall of
// the namespace l's incident is in, while that stall lasted (as
// forwarderOf finds it from q).
func (c *Correlator) joined(l *lingering, q *query) bool {
	return q.asked == l.inc.NetNS && q.name == l.name && q.qtype == l.qtype && q.nk != l.key &&
		c.askedDuring(q, l.firstNs, l.endNs)
}

// askedNS is the namespace that holds the address q asked: q.asked, or,
// where that is none, AddrOwner's answer now: an address unknown when q
// was sent (a pod born since the last scan) may be known now.
func (c *Correlator) askedNS(q *query) (uint32, bool) {
	if q.asked != 0 {
		return q.asked, true
	}
	if c.cfg.AddrOwner == nil {
		return 0, false
	}
	return c.cfg.AddrOwner(q.dst.Addr())
}

// ownerSlots and ownerTTL: the cache of AddrOwner's answers that q.asked
// is read from (askedNSCached). Nearly every query asks one of a few addresses (the
// cluster DNS VIP, a node-local cache), and AddrOwner may rescan the
// node's namespaces when it does not know one: an answer is kept for
// ownerTTL of trace time.
const (
	ownerBits  = 3
	ownerSlots = 1 << ownerBits
	ownerTTL   = uint64(10 * time.Second)
)

type ownerEntry struct {
	addr  netip.Addr
	ns    uint32 // 0: no namespace here holds addr
	until uint64
}

// askedNSCached is the namespace q asked, for q.asked: its own for a
// loopback address, else AddrOwner's answer (cached), 0 when none.
func (c *Correlator) askedNSCached(q *query) uint32 {
	a := q.dst.Addr()
	if a.IsLoopback() {
		return q.netns
	}
	if c.cfg.AddrOwner == nil {
		return 0
	}
	// The slot from the address's last four bytes: the VIP and a
	// node-local cache often end alike (10.96.0.10, 169.254.20.10).
	b := a.As16()
	e := &c.owners[binary.BigEndian.Uint32(b[12:])*0x9e3779b1>>(32-ownerBits)]
	if e.addr != a || q.sentNs >= e.until {
		ns, ok := c.cfg.AddrOwner(a)
		if !ok {
			ns = 0
		}
		*e = ownerEntry{addr: a, ns: ns, until: q.sentNs + ownerTTL}
	}
	return e.ns
}

// askedDuring: q was asked while a forwarder's stall from firstNs to endNs
// was in progress (its first lost query may be q's own forward, sent just
// after q).
func (c *Correlator) askedDuring(q *query, firstNs, endNs uint64) bool {
	return firstNs <= q.sentNs+uint64(c.cfg.MinRetryGap) && q.sentNs <= endNs
}

// upstreamOf describes q, the first lost query of the stall whose incident
// is inc, as an upstream query.
func upstreamOf(q *query, inc *Incident) Upstream {
	u := Upstream{Incident: inc.ID, NetNS: q.netns, PID: q.pid, Comm: inc.Comm, QType: QType(q.qtype), ID: q.id,
		Src: q.src, Dst: q.dst, Cause: inc.Cause}
	if inc.Race != nil {
		u.Race = *inc.Race
	}
	// Where it was lost: the first loss of the incident's cause.
	for _, p := range inc.Lost {
		if p.Cause == inc.Cause {
			u.Reason, u.Location, u.LostIn = p.Reason, p.Location, p.NetNS
			break
		}
	}
	return u
}

// forwarderOf finds the forwarder's lost query behind q, a client's query
// that was never answered or answered late. It returns the forwarder's
// stall's upstream description and its incident (nil when already
// emitted), or false.
func (c *Correlator) forwarderOf(q *query) (Upstream, *Incident, bool) {
	fwd, ok := c.askedNS(q)
	if !ok {
		return Upstream{}, nil, false
	}
	nk, ok := c.latestIn(q, fwd)
	if !ok || nk == q.nk {
		// No query of the question from there: the forwarder asked some
		// other way (TCP), or answered from its cache.
		if c.cfg.UpstreamTCP != nil && c.cfg.UpstreamTCP(fwd) {
			return Upstream{NetNS: fwd, TCP: true}, nil, true
		}
		return Upstream{}, nil, false
	}
	covers := func(firstNs, endNs uint64) bool { return c.askedDuring(q, firstNs, endNs) }
	if s, ok := c.ix.names.get(uint64(nk)); ok && s.stall != nil && covers(s.stall.firstNs, c.lastNs) {
		o := s.stall
		up := upstreamOf(o.queries[0], o.inc)
		up.SentMs = float64(int64(o.firstNs)-int64(q.sentNs)) / 1e6
		return up, o.inc, true
	}
	if h := c.pastStallOf(nk, covers); h != nil {
		up := h.up
		up.SentMs = float64(int64(h.firstNs)-int64(q.sentNs)) / 1e6
		return up, c.lingeringByID(h.id), true
	}
	return Upstream{}, nil, false
}

// upstreamFor is up where inc keeps it: in its stall when it has one (a
// pointer to up itself would put up on the heap at every call, found or
// not).
func upstreamFor(inc *Incident, up Upstream) *Upstream {
	if o := inc.owner; o != nil {
		o.upstream = up
		return &o.upstream
	}
	p := new(Upstream)
	*p = up
	return p
}

// explainByForwarder makes inc, a client's stall that no loss of its own
// explains (no_reply, late_answer), the forwarder's: cause upstream_lost,
// naming the forwarder's lost query, which lists the client back.
func (c *Correlator) explainByForwarder(inc *Incident, q *query) {
	up, fwd, ok := c.forwarderOf(q)
	if !ok {
		return
	}
	inc.Upstream = upstreamFor(inc, up)
	if up.TCP {
		return // its answer came late; why is not known
	}
	ev := &c.evidence
	*ev = evidence{seen: seenUpstreamLoss}
	rule := decide(ev)
	inc.Cause = rule.cause
	for i := range inc.Lost {
		if inc.Lost[i].Cause == CauseNoReply || inc.Lost[i].Cause == CauseLateAnswer {
			inc.Lost[i].Cause = rule.cause
		}
	}
	if fwd != nil {
		if len(fwd.Downstream) < maxDownstream {
			fwd.Downstream = append(fwd.Downstream, Asker{Incident: inc.ID, NetNS: inc.NetNS, Src: inc.Src, QType: inc.QType, ID: q.id})
		} else {
			fwd.DownstreamMore++
		}
	}
}

// lateAnswer reports q, answered at now after LateAnswer or more without a
// loss of its own, as a stall: its wait is the client's whatever the
// reason, and a forwarder's lost query may explain it. A query of a
// lookup whose stall is in progress is that stall's; one of a lookup that
// had another query answered late moments before (its A/AAAA sibling, on
// the same socket or, for Go's resolver, another) joins that one's
// incident while it waits to be emitted: one incident per lookup.
func (c *Correlator) lateAnswer(q *query, now uint64) {
	if s := c.ix.nameOfQuery(q); s != nil && s.stall != nil {
		return
	}
	ms := float64(now-q.sentNs) / 1e6
	ev := &c.evidence
	*ev = evidence{seen: seenLateAnswer}
	rule := decide(ev)
	p := Packet{QType: QType(q.qtype), ID: q.id, CPU: q.cpu, SentNs: q.sentNs, Cause: rule.cause, AnsweredMs: &ms}
	if inc := c.lateOf(q); inc != nil {
		if inc.Upstream != nil && !inc.Upstream.TCP {
			p.Cause = inc.Cause
		}
		inc.Lost = append(inc.Lost, p)
		if ms > *inc.StallMs {
			inc.StallMs = &ms
		}
		return
	}
	inc := c.newIncident(q, rule.cause, "")
	inc.StallMs = &ms
	inc.Lost = append(inc.Lost, p)
	c.explainByForwarder(inc, q)
	if sib := c.siblingQuery(q); sib != nil {
		inc.Sibling = describeSibling(q, sib)
	}
	c.late[q.nk] = lateIncident{inc: inc, sentNs: q.sentNs}
	inc.key = q.nk
	c.lingerIncident(inc, q, q.sentNs, now)
}

// lateIncident is a lookup's late answer's incident, while it waits to be
// emitted.
type lateIncident struct {
	inc    *Incident
	sentNs uint64
}

// lateOf returns the incident of a late answer of q's lookup sent within
// MinRetryGap of q, while it waits to be emitted (else nil).
func (c *Correlator) lateOf(q *query) *Incident {
	l, ok := c.late[q.nk]
	if !ok {
		return nil
	}
	if !c.isLingering(l.inc) {
		delete(c.late, q.nk)
		return nil
	}
	if max(l.sentNs, q.sentNs)-min(l.sentNs, q.sentNs) > uint64(c.cfg.MinRetryGap) {
		return nil
	}
	return l.inc
}

// unlinger takes inc back from the incidents waiting to be emitted: it
// returns inc if it was waiting, else nil.
func (c *Correlator) unlinger(inc *Incident) *Incident {
	if inc == nil {
		return nil
	}
	for i, l := range c.waitingOut {
		if l.inc == inc {
			c.waitingOut = append(c.waitingOut[:i], c.waitingOut[i+1:]...)
			return inc
		}
	}
	return nil
}

// lingeringByID returns the incident with this ID if it waits to be
// emitted, else nil.
func (c *Correlator) lingeringByID(id uint64) *Incident {
	for _, l := range c.waitingOut {
		if l.inc.ID == id {
			return l.inc
		}
	}
	return nil
}

// isLingering: inc waits to be emitted.
func (c *Correlator) isLingering(inc *Incident) bool {
	return c.lingeringByID(inc.ID) == inc
}
