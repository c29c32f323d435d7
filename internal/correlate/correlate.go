package correlate

import (
	"hash/maphash"
	"net/netip"
	"time"

	"github.com/dnsrace/dnsrace/internal/event"
)

// Config tunes a Correlator. Zero values take the defaults.
type Config struct {
	// MinRetryGap: a later query for the same name from the same
	// namespace is a retry only when sent at least this long after the
	// lost one (A and AAAA of one attempt leave within microseconds).
	MinRetryGap time.Duration
	// ClassifyDelay: how long a drop waits for the winner's events and
	// the counters before it is classified.
	ClassifyDelay time.Duration
	// QueryTTL: an unanswered query with no retry is declared lost after
	// this long, and an open stall with no retry is closed (retried=false).
	QueryTTL time.Duration
	// ResolverTimeout: at Close, a query unanswered for this long is lost
	// (its resolver has given up on it already).
	ResolverTimeout time.Duration
	// MaxQueries caps the queries in flight; the oldest are evicted and
	// counted.
	MaxQueries int
	// ReasonName maps an skb drop reason value to its name.
	ReasonName func(uint32) string
	// Location formats a drop location.
	Location func(uint64) string
	// Counters are the kernel's per-namespace conntrack deltas; nil when
	// unavailable (then drops without event evidence count as rule_drop).
	Counters CounterSource
	// OnIncident receives every incident, in the order they close.
	OnIncident func(*Incident)
	// Wall converts a CLOCK_MONOTONIC time in ns to wall time.
	Wall func(mono uint64) time.Time
}

// DefaultMaxQueries is Config.MaxQueries when left 0. A query in flight
// costs about 1.1 KB of heap with its index entries (BenchmarkInFlight,
// dnsrace bench --memory), so the cap holds the correlator near 75 MB of
// heap however many queries go unanswered (1,000,000 fed: 65,536 kept, the
// rest evicted and counted). Queries stay QueryTTL (answered ones too, for
// the sibling of a later stall): the cap covers about 5,000 queries/s
// without eviction.
const DefaultMaxQueries = 1 << 16

func (c *Config) defaults() {
	if c.MinRetryGap == 0 {
		c.MinRetryGap = 400 * time.Millisecond
	}
	if c.ClassifyDelay == 0 {
		c.ClassifyDelay = 250 * time.Millisecond
	}
	if c.QueryTTL == 0 {
		c.QueryTTL = 12 * time.Second
	}
	if c.ResolverTimeout == 0 {
		c.ResolverTimeout = 5 * time.Second
	}
	if c.MaxQueries == 0 {
		c.MaxQueries = DefaultMaxQueries
	}
	if c.ReasonName == nil {
		c.ReasonName = func(v uint32) string { return "reason_" + itoa(int(v)) }
	}
	if c.Location == nil {
		c.Location = func(uint64) string { return "" }
	}
	if c.Wall == nil {
		c.Wall = func(uint64) time.Time { return time.Time{} }
	}
}

type qstate uint8

const (
	statePending qstate = iota
	stateAnswered
	stateLost
)

type qkey struct {
	netns uint32
	src   netip.AddrPort
	dst   netip.AddrPort
	id    uint16
	qtype uint16
}

type sockKey struct {
	netns    uint32
	src, dst netip.AddrPort
}

type nameKey struct {
	netns uint32
	name  uint64
}

type idKey struct {
	id    uint16
	qtype uint16
	name  uint64
}

// query is one DNS question on the wire, from its first sighting. It is
// kept small (every query stays QueryTTL, up to MaxQueries of them): what
// only a lost or raced query needs lives in *queryExtra, allocated then.
type query struct {
	key    qkey
	name   uint64
	qname  string // interned: queries for one name share it
	sentNs uint64
	lastNs uint64 // last time an event carried it
	cgroup uint64
	ctPtr  uint64 // the last conntrack entry seen on the query's skb
	pid    uint32
	nodeNS uint32
	cpu    uint16
	tier   event.Tier
	state  qstate
	dead   bool // removed from the indexes
	nskb   uint8
	comm   [16]byte
	// skb addresses that carried it, for forget: the first ones inline.
	skb      [2]uint64
	moreSkbs []uint64
	// The live queries sent on the same socket (netns, src, dst), in
	// order of first sighting: where sibling looks.
	prevOnSock, nextOnSock *query
	nextPending            *query // in its name's pendList
	x                      *queryExtra
}

// sockList is the doubly linked list of a socket's live queries.
type sockList struct{ head, tail *query }

// pendList is a singly linked list of queries through nextPending.
type pendList struct{ head, tail *query }

func (l *pendList) push(q *query) {
	q.nextPending = nil
	if l.tail == nil {
		l.head, l.tail = q, q
		return
	}
	l.tail.nextPending = q
	l.tail = q
}

// queryExtra is the part of a query that only races and losses fill in.
type queryExtra struct {
	race   string
	winner *Flow
	// confirm verdicts from the fentry/kprobe tiers
	confirmFailed bool
	clashWinner   event.CT
	// replyCause is set when the answer was seen dropped.
	replyCause  string
	replyReason string
	replyLoc    string
	replyNS     uint32
}

// extra returns q's extra part, allocating it on first use.
func (q *query) extra() *queryExtra {
	if q.x == nil {
		q.x = &queryExtra{}
	}
	return q.x
}

// ext returns q's extra part or a zero one (read only).
func (q *query) ext() *queryExtra {
	if q.x == nil {
		return &noExtra
	}
	return q.x
}

var noExtra queryExtra

// open is a stall in progress: lost queries of one lookup attempt.
type open struct {
	inc     *Incident
	key     nameKey
	firstNs uint64
	queries []*query
	retry   *query // the query that ended the stall
}

type ctSeen struct {
	ptr    uint64
	orig   event.Tuple
	reply  event.Tuple
	timeNs uint64
	q      *query
}

type pendingDrop struct {
	due uint64
	ev  dropEv
}

type dropEv struct {
	kind     event.Kind
	q        *query // nil for a CT free with no known query
	netns    uint32
	ct       event.CT
	reason   uint32
	location uint64
	timeNs   uint64
	cpu      uint16
}

// Correlator joins events into incidents.
type Correlator struct {
	cfg  Config
	seed maphash.Seed

	bySkb map[uint64]*query
	byKey map[qkey]*query
	byID  map[idKey]*query
	// bySock: the live queries sent on a socket, oldest first, linked
	// through prevOnSock/nextOnSock.
	bySock map[sockKey]sockList
	// pending: the unanswered queries of a name in a namespace, oldest
	// first, linked through query.nextPending (no allocation per query).
	pending map[nameKey]pendList
	opens   map[nameKey]*open
	byCT    map[uint64]*query
	// byTuple: the last query sent on a 5-tuple, whatever the namespace:
	// a conntrack entry's original tuple names the query that made it.
	byTuple map[event.Tuple]*query
	order   []*query // queries by first sighting, for expiry

	// confirmed entries seen recently, per namespace and tuple
	byReply map[nsTuple]ctSeen
	byOrig  map[nsTuple]ctSeen
	ctOrder []nsTuple

	// dropped: entries of dropped packets (address and original tuple:
	// the slab hands a freed entry's address to the next entry at once)
	// -> time of the drop.
	dropped map[lossKey]uint64
	// counted: losers already counted as rescued.
	counted map[lossKey]uint64 // -> when it was counted
	drops   []pendingDrop
	attrib  map[uint32]*Attributed
	// names interns question names by hash (bounded: cleared when full).
	names map[uint64]string
	// forgotten counts queries forgotten since the indexes were last
	// rebuilt (see compact).
	forgotten int
	nextID    uint64
	lastNs    uint64
	evicted   uint64
	queries   uint64
	answered  uint64
}

// lossKey names one loser: its entry's address and its original tuple
// (the asking socket's, new for every flow). The address alone is reused
// by the slab at once; the query alone differs between the paths that see
// the loser (confirm verdict, NAT_CLASH entry, freed entry), which may
// find different queries of one A/AAAA pair.
type lossKey struct {
	ptr  uint64
	orig event.Tuple
}

type nsTuple struct {
	netns uint32
	t     event.Tuple
}

// New returns a Correlator.
func New(cfg Config) *Correlator {
	cfg.defaults()
	return &Correlator{
		cfg: cfg, seed: maphash.MakeSeed(),
		bySkb: map[uint64]*query{}, byKey: map[qkey]*query{}, byID: map[idKey]*query{},
		bySock: map[sockKey]sockList{}, pending: map[nameKey]pendList{}, opens: map[nameKey]*open{},
		byCT: map[uint64]*query{}, byTuple: map[event.Tuple]*query{}, byReply: map[nsTuple]ctSeen{}, byOrig: map[nsTuple]ctSeen{},
		dropped: map[lossKey]uint64{}, counted: map[lossKey]uint64{}, attrib: map[uint32]*Attributed{},
		names: map[uint64]string{},
	}
}

// Stats are the correlator's own counts.
type Stats struct {
	Queries  uint64 `json:"queries"`
	Answered uint64 `json:"answered"`
	InFlight int    `json:"in_flight"`
	Evicted  uint64 `json:"evicted"`
}

func (c *Correlator) Stats() Stats {
	return Stats{Queries: c.queries, Answered: c.answered, InFlight: len(c.byKey), Evicted: c.evicted}
}

// Attributed returns what was explained, per namespace of the drop.
func (c *Correlator) Attributed() map[uint32]Attributed {
	out := make(map[uint32]Attributed, len(c.attrib))
	for ns, a := range c.attrib {
		out[ns] = *a
	}
	return out
}

func (c *Correlator) attributed(ns uint32) *Attributed {
	a := c.attrib[ns]
	if a == nil {
		a = &Attributed{}
		c.attrib[ns] = a
	}
	return a
}

func (c *Correlator) hashName(b []byte) uint64 { return maphash.Bytes(c.seed, b) }

// maxInterned bounds the name intern table.
const maxInterned = 1 << 16

// intern returns name as a string, shared with earlier queries for the same
// name: a busy node asks for few distinct names, so the hot path does not
// allocate one string per query.
func (c *Correlator) intern(h uint64, name []byte) string {
	if s, ok := c.names[h]; ok && s == string(name) {
		return s
	}
	if len(c.names) >= maxInterned {
		clear(c.names)
	}
	s := string(name)
	c.names[h] = s
	return s
}

// Handle processes one event. It keeps nothing that e points to.
func (c *Correlator) Handle(e *event.Event) {
	if e.TimeNs > c.lastNs {
		c.lastNs = e.TimeNs
	}
	if e.CT.Ptr != 0 && e.CT.Confirmed() {
		c.noteCT(e.NetNS, e.CT, e.TimeNs)
	}
	switch e.Kind {
	case event.KindCTFree:
		if t, ok := c.dropped[lossKey{e.CT.Ptr, e.CT.Orig}]; ok && e.TimeNs >= t && e.TimeNs-t < uint64(2*time.Second) {
			// The entry of a dropped packet, freed with it (same CPU,
			// after the drop event; tens of ms after under emulation).
			// Matched by address and original tuple, decided now: the
			// address alone is reused and dropped again at once.
			return
		}
		if e.CT.Ptr != 0 && !e.CT.Confirmed() {
			q := c.byCT[e.CT.Ptr]
			if q == nil {
				// A merged loser never shows on a query event: its
				// packet leaves with the winner's entry.
				q = c.byTuple[event.Tuple{Src: e.CT.Orig.Src, Dst: e.CT.Orig.Dst, Proto: 17}]
			}
			c.drops = append(c.drops, pendingDrop{due: e.TimeNs + uint64(c.cfg.ClassifyDelay), ev: dropEv{
				kind: e.Kind, q: q, netns: e.NetNS, ct: e.CT, timeNs: e.TimeNs, cpu: e.CPU}})
		}
		return
	case event.KindClash:
		if q := c.skbQuery(e); q != nil {
			q.extra().clashWinner = e.Winner
		}
		return
	}
	if !e.DNS.Valid {
		return
	}
	if e.DNS.Response {
		c.handleResponse(e)
		return
	}
	q := c.skbQuery(e)
	if q == nil && (e.Kind == event.KindXmit || e.Kind == event.KindSend) {
		q = c.newQuery(e)
	}
	if q == nil {
		// The skb was not seen leaving the asker (a copied skb, or its
		// event lost): the question itself names the query, if one by
		// that id, type and name is waiting and was seen just now.
		q = c.byQuestion(e)
	}
	if q == nil {
		return
	}
	if e.CT.Ptr != 0 {
		q.ctPtr = e.CT.Ptr
		q.nodeNS = e.NetNS
		c.byCT[e.CT.Ptr] = q
		if lk := (lossKey{e.CT.Ptr, e.CT.Orig}); e.CT.Status&event.IPSNATClash != 0 && !c.isCounted(lk) {
			// nf_ct_resolve_clash_harder inserted this loser reply-only.
			c.counted[lk] = e.TimeNs
			c.rescued(q, e.NetNS, e.CT, e.TimeNs)
		}
	}
	switch e.Kind {
	case event.KindConfirm:
		if e.Verdict == 0 {
			q.extra().confirmFailed = true
		} else if lk := (lossKey{e.CT.Ptr, e.CT.Orig}); e.CTAfter != 0 && e.CTAfter != e.CT.Ptr && !c.isCounted(lk) {
			// The skb now carries the winner: the loser was merged.
			c.counted[lk] = e.TimeNs
			c.rescued(q, e.NetNS, e.CT, e.TimeNs)
		}
	case event.KindDrop:
		if e.CT.Ptr != 0 {
			c.dropped[lossKey{e.CT.Ptr, e.CT.Orig}] = e.TimeNs
		}
		c.drops = append(c.drops, pendingDrop{due: e.TimeNs + uint64(c.cfg.ClassifyDelay), ev: dropEv{
			kind: e.Kind, q: q, netns: e.NetNS, ct: e.CT, reason: e.Reason, location: e.Location, timeNs: e.TimeNs, cpu: e.CPU}})
	}
}

func (c *Correlator) isCounted(k lossKey) bool {
	_, ok := c.counted[k]
	return ok
}

func (c *Correlator) bindSkb(skb uint64, q *query) {
	c.bySkb[skb] = q
	for i := range int(q.nskb) {
		if q.skb[i] == skb {
			return
		}
	}
	for _, s := range q.moreSkbs {
		if s == skb {
			return
		}
	}
	if int(q.nskb) < len(q.skb) {
		q.skb[q.nskb] = skb
		q.nskb++
		return
	}
	q.moreSkbs = append(q.moreSkbs, skb)
}

// skbQuery returns the query the event's skb carries, if it is the same
// question (skb addresses are reused once freed).
func (c *Correlator) skbQuery(e *event.Event) *query {
	q := c.bySkb[e.Skb]
	if q == nil || q.dead {
		return nil
	}
	if e.DNS.Valid && (q.key.id != e.DNS.ID || q.key.qtype != e.DNS.QType || e.DNS.Response ||
		c.hashName(e.DNS.NameBytes()) != q.name) {
		// Another question in a reused skb: the slab hands a freed
		// skb's address out again at once, and two resolvers may use
		// the same id (the name tells them apart).
		return nil
	}
	// A packet crosses the node in well under MinRetryGap; a later hit on
	// the same address is a resend of the same question in a reused skb.
	if e.TimeNs > q.lastNs+uint64(c.cfg.MinRetryGap) {
		return nil
	}
	q.lastNs = e.TimeNs
	return q
}

// byQuestion finds the pending query a non-first event belongs to by its
// DNS id, type and name, and binds the event's skb to it.
func (c *Correlator) byQuestion(e *event.Event) *query {
	q := c.byID[idKey{e.DNS.ID, e.DNS.QType, c.hashName(e.DNS.NameBytes())}]
	if q == nil || q.dead || q.state != statePending || e.TimeNs > q.lastNs+uint64(c.cfg.MinRetryGap) || e.TimeNs < q.sentNs {
		return nil
	}
	q.lastNs = e.TimeNs
	c.bindSkb(e.Skb, q)
	return q
}

func (c *Correlator) newQuery(e *event.Event) *query {
	k := qkey{netns: e.NetNS, src: e.Packet.Src, dst: e.Packet.Dst, id: e.DNS.ID, qtype: e.DNS.QType}
	if old := c.byKey[k]; old != nil && !old.dead {
		if e.TimeNs < old.sentNs+uint64(c.cfg.MinRetryGap) {
			// Seen again on another device of the same namespace.
			c.bindSkb(e.Skb, old)
			return old
		}
		// A resend with the same id on the same socket (glibc's
		// single-request retry, musl's resend): a new query.
		delete(c.byKey, k)
	}
	name := e.DNS.NameBytes()
	h := c.hashName(name)
	q := &query{
		key: k, name: h, qname: c.intern(h, name), sentNs: e.TimeNs, lastNs: e.TimeNs, cpu: e.CPU,
		pid: e.PID, comm: e.Comm, cgroup: e.Cgroup, tier: e.Tier,
	}
	c.queries++
	c.byKey[k] = q
	c.bindSkb(e.Skb, q)
	c.byID[idKey{k.id, k.qtype, q.name}] = q
	c.order = append(c.order, q)
	nk := nameKey{k.netns, q.name}
	c.retry(nk, q)
	l := c.pending[nk]
	l.push(q)
	c.pending[nk] = l
	sk := sockKey{k.netns, k.src, k.dst}
	sl := c.bySock[sk]
	if sl.tail != nil {
		sl.tail.nextOnSock, q.prevOnSock = q, sl.tail
	} else {
		sl.head = q
	}
	sl.tail = q
	c.bySock[sk] = sl
	c.byTuple[event.Tuple{Src: k.src, Dst: k.dst, Proto: 17}] = q
	if len(c.byKey) > c.cfg.MaxQueries {
		c.evictOldest()
	}
	return q
}

// retry is called for every new query: an older unanswered query for the
// same name in the same namespace is lost, and the stall it caused ends now.
func (c *Correlator) retry(nk nameKey, q *query) {
	gap := uint64(c.cfg.MinRetryGap)
	var keep pendList
	for old := c.pending[nk].head; old != nil; {
		next := old.nextPending
		if old.state == statePending && q.sentNs >= old.sentNs+gap {
			c.markLost(old, c.unansweredLoss(old))
		} else if old.state == statePending {
			keep.push(old)
		} else {
			old.nextPending = nil
		}
		old = next
	}
	if keep.head == nil {
		delete(c.pending, nk)
	} else {
		c.pending[nk] = keep
	}
	if o := c.opens[nk]; o != nil && q.sentNs >= o.firstNs+gap {
		o.retry = q
		c.closeOpen(o, q.sentNs, true)
	}
}

// unansweredLoss explains a query that was never answered and never seen
// dropped: its answer was dropped, or nothing local saw it at all.
func (c *Correlator) unansweredLoss(q *query) Packet {
	p := Packet{QType: qtypeName(q.key.qtype), ID: q.key.id, CPU: q.cpu, SentNs: q.sentNs, Cause: CauseNoReply}
	if x := q.ext(); x.replyCause != "" {
		p.Cause, p.Reason, p.Location, p.NetNS = x.replyCause, x.replyReason, x.replyLoc, x.replyNS
	}
	return p
}

func (c *Correlator) handleResponse(e *event.Event) {
	name := c.hashName(e.DNS.NameBytes())
	q := c.byID[idKey{e.DNS.ID, e.DNS.QType, name}]
	if q == nil || q.dead {
		return
	}
	switch e.Kind {
	case event.KindRecv, event.KindDeliver:
		// The answer reached the asking namespace with the tuple the
		// socket expects: answered.
		if e.NetNS == q.key.netns && e.Packet.Src == q.key.dst && e.Packet.Dst == q.key.src && q.state == statePending {
			q.state = stateAnswered
			c.answered++
		}
	case event.KindDrop:
		x := q.extra()
		switch c.cfg.ReasonName(e.Reason) {
		case "NO_SOCKET", "SOCKET_FILTER", "NETFILTER_DROP", "IP_NOPROTO":
			x.replyCause = CauseReplyUnmatched
		case "SOCKET_RCVBUFF", "PROTO_MEM":
			x.replyCause = CauseRcvbufFull
		default:
			x.replyCause = CauseLocalDrop
		}
		x.replyReason, x.replyLoc, x.replyNS = c.cfg.ReasonName(e.Reason), c.cfg.Location(e.Location), e.NetNS
	case event.KindRcvbufFull:
		x := q.extra()
		x.replyCause, x.replyReason, x.replyNS = CauseRcvbufFull, "SOCKET_RCVBUFF", e.NetNS
	}
}

// noteCT remembers a confirmed entry: a later drop of an unconfirmed entry
// with the same tuple lost the race to it.
func (c *Correlator) noteCT(ns uint32, ct event.CT, t uint64) {
	s := ctSeen{ptr: ct.Ptr, orig: ct.Orig, reply: ct.Reply, timeNs: t, q: c.byCT[ct.Ptr]}
	rk, ok := nsTuple{ns, ct.Reply}, nsTuple{ns, ct.Orig}
	if _, seen := c.byReply[rk]; !seen {
		c.ctOrder = append(c.ctOrder, rk, ok)
		// Bounded like the queries: at more new flows per second than
		// MaxQueries/10 s the oldest memories go first (a winner is
		// confirmed microseconds before its loser's drop).
		if len(c.ctOrder) > 2*c.cfg.MaxQueries {
			delete(c.byReply, c.ctOrder[0])
			delete(c.byOrig, c.ctOrder[1])
			c.ctOrder = c.ctOrder[2:]
		}
	}
	c.byReply[rk] = s
	c.byOrig[ok] = s
}

// winnerOf finds the entry a dropped unconfirmed ct lost to.
func (c *Correlator) winnerOf(ns uint32, ct event.CT, t uint64) (string, *ctSeen) {
	recent := func(s ctSeen) bool {
		d := int64(s.timeNs) - int64(t)
		return s.ptr != ct.Ptr && d < int64(2*time.Second) && d > -int64(5*time.Second)
	}
	if s, ok := c.byReply[nsTuple{ns, ct.Reply}]; ok && recent(s) && s.orig != ct.Orig {
		return RaceReplyClash, &s
	}
	if s, ok := c.byOrig[nsTuple{ns, ct.Orig}]; ok && recent(s) {
		return RaceSameTuple, &s
	}
	return "", nil
}

func (c *Correlator) flowOf(s *ctSeen) *Flow {
	f := &Flow{Src: s.orig.Src.String(), Dst: s.orig.Dst.String(), ReplySrc: s.reply.Src.String(), ReplyDst: s.reply.Dst.String()}
	if s.q == nil {
		s.q = c.byCT[s.ptr]
	}
	if q := s.q; q != nil {
		f.NetNS, f.QName, f.QType, f.PID = q.key.netns, q.qname, qtypeName(q.key.qtype), q.pid
		f.Comm = commString(q.comm)
	}
	return f
}

func commString(b [16]byte) string {
	for i, ch := range b {
		if ch == 0 {
			return string(b[:i])
		}
	}
	return string(b[:])
}

// Tick classifies drops that are due and expires old state. now is
// CLOCK_MONOTONIC in ns; 0 means the time of the last event.
func (c *Correlator) Tick(now uint64) {
	if now == 0 {
		now = c.lastNs
	}
	n := 0
	for _, d := range c.drops {
		if d.due <= now {
			c.classify(d.ev)
			continue
		}
		c.drops[n] = d
		n++
	}
	c.drops = c.drops[:n]
	c.expire(now)
}

// budget returns how many more packets of a kind the kernel counted in ns
// than dnsrace explained so far.
func (c *Correlator) budget(ns uint32) (insertFailed, drop int64) {
	if c.cfg.Counters == nil {
		return 0, 0
	}
	d, ok := c.cfg.Counters.Delta(ns)
	if !ok {
		return 0, 0
	}
	a := c.attributed(ns)
	return int64(d.InsertFailed) - int64(a.InsertFailed), int64(d.Drop) - int64(a.Drop)
}

func (c *Correlator) classify(d dropEv) {
	if d.kind == event.KindCTFree {
		// An unconfirmed entry freed without its packet being dropped:
		// the loser of a clash the kernel merged into the winner.
		if d.q == nil {
			return
		}
		lk := lossKey{d.ct.Ptr, d.ct.Orig}
		if c.isCounted(lk) {
			return
		}
		c.counted[lk] = d.timeNs
		c.rescued(d.q, d.netns, d.ct, d.timeNs)
		return
	}
	q := d.q
	if q == nil || q.state != statePending {
		return
	}
	reason := c.cfg.ReasonName(d.reason)
	p := Packet{QType: qtypeName(q.key.qtype), ID: q.key.id, CPU: q.cpu, SentNs: q.sentNs,
		Reason: reason, Location: c.cfg.Location(d.location), NetNS: d.netns}
	a := c.attributed(d.netns)
	switch {
	case reason == "NETFILTER_DROP" && (d.ct.Ptr == 0 || !d.ct.Confirmed()):
		race, w := "", (*ctSeen)(nil)
		if d.ct.Ptr != 0 {
			race, w = c.winnerOf(d.netns, d.ct, d.timeNs)
		}
		if cw := q.ext().clashWinner; cw.Ptr != 0 && w == nil {
			w = &ctSeen{ptr: cw.Ptr, orig: cw.Orig, reply: cw.Reply}
			race = RaceSameTuple
			if cw.Orig != d.ct.Orig {
				race = RaceReplyClash
			}
		}
		insertBudget, dropBudget := c.budget(d.netns)
		switch {
		case d.ct.Ptr != 0 && (w != nil || q.ext().confirmFailed || insertBudget > 0):
			p.Cause, p.Race = CauseInsertRace, race
			if w != nil {
				q.extra().winner = c.flowOf(w)
			}
			a.InsertFailed++
			a.Drop++
		case d.ct.Ptr == 0 && dropBudget > 0:
			p.Cause = CauseTableFull
			a.Drop++
		default:
			p.Cause = CauseRuleDrop
		}
	case reason == "NETFILTER_DROP":
		p.Cause = CauseRuleDrop
	default:
		p.Cause = CauseLocalDrop
	}
	if p.Race != "" || q.x != nil {
		q.extra().race = p.Race
	}
	c.markLost(q, p)
}

// markLost records a lost query and adds it to the open stall of its
// lookup (A and AAAA of one attempt share one stall).
func (c *Correlator) markLost(q *query, p Packet) {
	if q.state != statePending {
		return
	}
	q.state = stateLost
	nk := nameKey{q.key.netns, q.name}
	o := c.opens[nk]
	if o != nil && q.sentNs >= o.firstNs+uint64(c.cfg.MinRetryGap) {
		// An older stall whose retry was lost too: that retry ended it.
		o.retry = q
		c.closeOpen(o, q.sentNs, true)
		o = nil
	}
	if o == nil {
		o = &open{key: nk, firstNs: q.sentNs, inc: c.newIncident(q, p.Cause, p.Race)}
		c.opens[nk] = o
	}
	o.queries = append(o.queries, q)
	o.inc.Lost = append(o.inc.Lost, p)
}

func (c *Correlator) newIncident(q *query, cause, race string) *Incident {
	c.nextID++
	inc := &Incident{
		Type: "incident", ID: c.nextID, Time: c.cfg.Wall(q.sentNs), Cause: cause,
		QName: q.qname, QType: qtypeName(q.key.qtype), NetNS: q.key.netns, PID: q.pid,
		Comm: commString(q.comm), Cgroup: q.cgroup, Src: q.key.src.String(), Dst: q.key.dst.String(),
		NodeNetNS: q.nodeNS, Tier: tierOf(q), Lost: []Packet{},
	}
	if race != "" {
		inc.Race = &race
	}
	return inc
}

func tierOf(q *query) string {
	if q.tier == event.TierNone {
		return event.TierTracepoint.String()
	}
	return q.tier.String()
}

// rescued emits a clash_resolved incident: a race the kernel resolved
// without losing the packet.
func (c *Correlator) rescued(q *query, ns uint32, loser event.CT, t uint64) {
	race, w := c.winnerOf(ns, loser, t)
	if race == "" {
		race = RaceSameTuple
	}
	inc := c.newIncident(q, CauseClashResolved, race)
	inc.NodeNetNS = ns
	zero := 0.0
	inc.StallMs = &zero
	if w != nil {
		inc.Winner = c.flowOf(w)
	}
	c.attributed(ns).ClashResolve++
	c.emit(inc, q)
}

func (c *Correlator) closeOpen(o *open, endNs uint64, retried bool) {
	delete(c.opens, o.key)
	inc := o.inc
	inc.Retried = retried
	if r := o.retry; r != nil {
		inc.Retry = &Retry{QType: qtypeName(r.key.qtype), ID: r.key.id, Src: r.key.src.String(), Dst: r.key.dst.String()}
	}
	if retried {
		ms := float64(endNs-o.firstNs) / 1e6
		inc.StallMs = &ms
	}
	first := o.queries[0]
	if r := first.ext().race; inc.Race == nil && r != "" {
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
// socket within MinRetryGap; the first such in order of sighting. It walks
// the live queries of q's socket (the same set, in the same order, as the
// queries of c.order with q's netns, src and dst), and only the stretch
// sent within 2*MinRetryGap of q: queries are sighted in time order (ring
// buffer order; skew between CPUs is microseconds), so nothing outside it
// can be within MinRetryGap. A long-lived socket (musl, a flood) may carry
// thousands of queries; a stall on it no longer walks them all.
func (c *Correlator) sibling(q *query) *Sibling {
	sl, ok := c.bySock[sockKey{q.key.netns, q.key.src, q.key.dst}]
	if !ok {
		return nil
	}
	bound := 2 * uint64(c.cfg.MinRetryGap)
	start := sl.head // a forgotten q is older than every live query
	if !q.dead {
		start = q
		for start.prevOnSock != nil && start.prevOnSock.sentNs+bound >= q.sentNs {
			start = start.prevOnSock
		}
	}
	for other := start; other != nil; other = other.nextOnSock {
		if other.sentNs > q.sentNs+bound {
			break
		}
		if sib := c.siblingOf(q, other); sib != nil {
			return sib
		}
	}
	return nil
}

// siblingOf returns other as q's sibling, or nil if it is not one.
func (c *Correlator) siblingOf(q, other *query) *Sibling {
	if other == q || other.dead || other.key.netns != q.key.netns || other.key.src != q.key.src ||
		other.key.dst != q.key.dst || other.key.qtype == q.key.qtype || other.name != q.name {
		return nil
	}
	gap := int64(other.sentNs) - int64(q.sentNs)
	if gap < 0 {
		gap = -gap
	}
	if gap > int64(c.cfg.MinRetryGap) {
		return nil
	}
	return &Sibling{
		QType: qtypeName(other.key.qtype), ID: other.key.id, GapUs: float64(gap) / 1e3,
		CPUs: [2]int{int(q.cpu), int(other.cpu)}, Answered: other.state == stateAnswered,
		Lost: other.state == stateLost,
	}
}

// expire declares old unanswered queries lost, closes stalls that saw no
// retry, and forgets old state.
func (c *Correlator) expire(now uint64) {
	ttl := uint64(c.cfg.QueryTTL)
	n := 0
	for _, q := range c.order {
		if q.sentNs+ttl > now {
			c.order[n] = q
			n++
			continue
		}
		if q.state == statePending {
			c.markLost(q, c.unansweredLoss(q))
		}
		c.forget(q)
	}
	clear(c.order[n:])
	c.order = c.order[:n]
	c.compact()
	for _, o := range c.opens {
		if o.firstNs+ttl <= now {
			c.closeOpen(o, now, false)
		}
	}
	// Confirmed-entry and dropped-ct memories only matter for a few
	// seconds around a drop.
	keep := c.ctOrder[:0]
	for i := 0; i+1 < len(c.ctOrder); i += 2 {
		rk, ok := c.ctOrder[i], c.ctOrder[i+1]
		if s, found := c.byReply[rk]; found && s.timeNs+uint64(10*time.Second) > now {
			keep = append(keep, rk, ok)
			continue
		}
		delete(c.byReply, rk)
		delete(c.byOrig, ok)
	}
	c.ctOrder = keep
	for p, t := range c.dropped {
		if t+uint64(10*time.Second) <= now {
			delete(c.dropped, p)
		}
	}
	for k, t := range c.counted {
		if t+uint64(10*time.Second) <= now {
			delete(c.counted, k)
		}
	}
}

func (c *Correlator) forget(q *query) {
	if q.dead {
		return
	}
	q.dead = true
	c.forgotten++
	if c.byKey[q.key] == q {
		delete(c.byKey, q.key)
	}
	if k := (idKey{q.key.id, q.key.qtype, q.name}); c.byID[k] == q {
		delete(c.byID, k)
	}
	sk := sockKey{q.key.netns, q.key.src, q.key.dst}
	sl := c.bySock[sk]
	if sl.head == q {
		sl.head = q.nextOnSock
	}
	if sl.tail == q {
		sl.tail = q.prevOnSock
	}
	if sl.head == nil {
		delete(c.bySock, sk)
	} else {
		c.bySock[sk] = sl
	}
	if k := (event.Tuple{Src: q.key.src, Dst: q.key.dst, Proto: 17}); c.byTuple[k] == q {
		delete(c.byTuple, k)
	}
	if q.ctPtr != 0 && c.byCT[q.ctPtr] == q {
		delete(c.byCT, q.ctPtr)
	}
	for _, s := range q.skb[:q.nskb] {
		if c.bySkb[s] == q {
			delete(c.bySkb, s)
		}
	}
	for _, s := range q.moreSkbs {
		if c.bySkb[s] == q {
			delete(c.bySkb, s)
		}
	}
	// Unlink from its socket's list.
	if q.prevOnSock != nil {
		q.prevOnSock.nextOnSock = q.nextOnSock
	}
	if q.nextOnSock != nil {
		q.nextOnSock.prevOnSock = q.prevOnSock
	}
	q.prevOnSock, q.nextOnSock = nil, nil
	// An evicted query may still be pending: drop it from its name's
	// list, or names never asked again would keep it forever.
	if q.state == statePending {
		nk := nameKey{q.key.netns, q.name}
		if l, ok := c.pending[nk]; ok {
			var prev *query
			for p := l.head; p != nil; prev, p = p, p.nextPending {
				if p != q {
					continue
				}
				if prev == nil {
					l.head = p.nextPending
				} else {
					prev.nextPending = p.nextPending
				}
				if l.tail == p {
					l.tail = prev
				}
				break
			}
			q.nextPending = nil
			if l.head == nil {
				delete(c.pending, nk)
			} else {
				c.pending[nk] = l
			}
		}
	}
}

// compact rebuilds the per-query indexes once many queries have been
// forgotten since the last rebuild. Go maps never shrink, and under steady
// insert/delete churn deleted slots make them grow far beyond their live
// size (a cap of 65,536 queries held ~100 MB of map tables after 1M
// evictions). A rebuild costs O(live) once per 4x live forgets.
func (c *Correlator) compact() {
	if c.forgotten < 4*len(c.byKey)+4096 {
		return
	}
	c.forgotten = 0
	c.bySkb = clone(c.bySkb)
	c.byKey = clone(c.byKey)
	c.byID = clone(c.byID)
	c.bySock = clone(c.bySock)
	c.byTuple = clone(c.byTuple)
	c.byCT = clone(c.byCT)
	c.pending = clone(c.pending)
}

// clone copies m into a map sized for its live entries.
func clone[K comparable, V any](m map[K]V) map[K]V {
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

func (c *Correlator) evictOldest() {
	for len(c.order) > 0 && len(c.byKey) > c.cfg.MaxQueries {
		q := c.order[0]
		c.order = c.order[1:]
		c.forget(q)
		c.evicted++
	}
	c.compact()
}

// Close classifies every pending drop and closes every open stall (as not
// retried). A query still waiting is lost only if its answer was seen
// dropped or it has waited a whole resolver timeout by now (CLOCK_MONOTONIC
// ns): otherwise the trace ended, not the wait. Call it once, at the end.
func (c *Correlator) Close(now uint64) {
	for _, d := range c.drops {
		c.classify(d.ev)
	}
	c.drops = nil
	for _, q := range c.order {
		if q.state == statePending && !q.dead && (q.ext().replyCause != "" || now >= q.sentNs+uint64(c.cfg.ResolverTimeout)) {
			c.markLost(q, c.unansweredLoss(q))
		}
	}
	end := max(now, c.lastNs)
	for _, o := range c.opens {
		c.closeOpen(o, end, false)
	}
}
