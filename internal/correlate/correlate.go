package correlate

import (
	"hash/maphash"
	"math"
	"net/netip"
	"time"

	"github.com/dnsrace/dnsrace/internal/ctstats"
	"github.com/dnsrace/dnsrace/internal/event"
)

// This file is the correlator's core: its Config, Handle, Tick and Close,
// and a query's life from its first record until it is forgotten.

// Config tunes a Correlator. Zero values take the defaults.
type Config struct {
	// MinRetryGap: a later query for the same name from the same
	// namespace is a retry only when sent at least this long after the
	// lost one (A and AAAA of one attempt leave within microseconds); the
	// queries of a retry's attempt are the resends sent within it of the
	// retry.
	MinRetryGap time.Duration
	// ClassifyDelay: how long a drop waits for the winner's records and
	// the counters before it is classified.
	ClassifyDelay time.Duration
	// QueryTTL: an unanswered query with no retry is declared lost after
	// this long, and an open stall with no retry is closed this long after
	// its latest attempt began (retried=false).
	QueryTTL time.Duration
	// ResolverTimeout: at Close, a query unanswered for this long is lost
	// (its resolver has given up on it already).
	ResolverTimeout time.Duration
	// LateAnswer: a query answered this long after it was sent, with no
	// loss of its own, is a stall too (late_answer, or upstream_lost when
	// a local forwarder's query for it was lost).
	LateAnswer time.Duration
	// AddrOwner names the namespace that holds an address (a local
	// forwarder a client asked); nil: unknown (only a forwarder on the
	// client's own loopback is found).
	AddrOwner func(netip.Addr) (netns uint32, ok bool)
	// ForwarderGrace is how long a stall's incident waits, once the stall
	// ended, for the stalls of clients that waited on it (a forwarder's
	// next try answers them too, moments later) to name it (negative:
	// none).
	ForwarderGrace time.Duration
	// OnClosed is called with the asker of each incident that waits
	// ForwarderGrace before OnIncident, as it closes: its pod may be gone
	// by the time it is emitted (a pod's last lookup), so a caller that
	// names pods looks it up now. It must not block.
	OnClosed func(netns, pid uint32, cgroup uint64)
	// OnStaleNAT is called with each stale_nat loss's entry as it is
	// decided, so the caller can read what the node does now (the entry's
	// namespace, the rules) while the entry and its namespace still exist:
	// the incident is written seconds later. It must not block.
	OnStaleNAT func(StaleNAT)
	// UpstreamTCP reports whether the forwarder in netns has TCP
	// connections to DNS servers (it forwards over TCP); nil: unknown.
	UpstreamTCP func(netns uint32) bool
	// MaxQueries caps the queries in flight; the oldest are evicted and
	// counted.
	MaxQueries int
	// MaxStalls caps the stalls in progress (lost queries waiting for
	// their retry); past it the oldest is reported at once, as not
	// retried (or at its retry, if that retry's attempt was under way),
	// and counted.
	MaxStalls int
	// ReasonName maps an skb drop reason value to its name in the
	// kernel's enum skb_drop_reason ("NETFILTER_DROP"): "" where the
	// kernel has no drop reasons (before 5.17), and for a value the enum
	// lacks anything that is no enum name (probe.DropReasonName gives
	// "reason(7)"). The writers show what it gives; the rules read it only
	// as an enum name. nil: no names ("reason(7)" shown).
	ReasonName func(uint32) string
	// Symbol names the kernel function at a drop location and the offset
	// into it (ksym.Table.Lookup): the rules read the function, the
	// writers show "nf_hook_slow+0x7d" (the bare address where ok is
	// false). nil: no names.
	Symbol func(addr uint64) (name string, off uint64, ok bool)
	// Counters are the kernel's per-namespace conntrack deltas; nil when
	// unavailable (then drops without event evidence count as rule_drop).
	Counters CounterSource
	// OnIncident receives every incident, in the order they close (one
	// per stalled lookup, at the retry whose attempt lost nothing).
	OnIncident func(*Incident)
	// Wall converts a CLOCK_MONOTONIC time in ns to wall time.
	Wall func(mono uint64) time.Time
}

// DefaultMaxQueries is Config.MaxQueries when left 0. Queries stay
// QueryTTL (answered ones too, for the sibling of a later stall), so the
// cap covers about 5,000 queries/s without eviction; past it the oldest go
// first and are counted.
const DefaultMaxQueries = 1 << 16

// DefaultMaxStalls is Config.MaxStalls when left 0. A stall holds its lost
// queries and its incident, about 1 KB, for up to QueryTTL: uncapped, a
// flood of lost queries with distinct names (each its own stall) grows the
// heap without bound and keeps the GC running against its memory limit.
const DefaultMaxStalls = 1 << 14

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
	if c.LateAnswer == 0 {
		c.LateAnswer = time.Second
	}
	switch {
	case c.ForwarderGrace == 0:
		c.ForwarderGrace = 500 * time.Millisecond
	case c.ForwarderGrace < 0:
		c.ForwarderGrace = 0
	}
	if c.MaxQueries == 0 {
		c.MaxQueries = DefaultMaxQueries
	}
	if c.MaxStalls == 0 {
		c.MaxStalls = DefaultMaxStalls
	}
	if c.Symbol == nil {
		c.Symbol = func(uint64) (string, uint64, bool) { return "", 0, false }
	}
	if c.Wall == nil {
		c.Wall = func(uint64) time.Time { return time.Time{} }
	}
}

// lossKey names one loser: its entry's address and its original tuple.
// The address alone is reused by the slab at once; the query alone can
// differ between the paths that see one loser. A key seen again more than
// lossWindow later is another loser: the slab hands a freed entry's
// address to the next one, and a socket's next query (a retry, or a new
// socket given the same port) has the same tuple.
type lossKey struct {
	ptr  uint64
	orig event.Tuple
}

// lossWindow bounds the records of one loser: they come from one
// confirm, one free and the packet's next hooks, microseconds apart.
const lossWindow = uint64(time.Second)

// Correlator joins records into incidents. It is single-threaded: Handle,
// Tick and Close are called from one goroutine.
type Correlator struct {
	cfg  Config
	seed maphash.Seed
	ix   index

	// drops wait in arrival order, which is due order up to the skew
	// between CPUs' records: a tick takes them off the front without
	// copying the rest (a flood of drops holds tens of thousands).
	drops     fifo[pendingDrop]
	direct    []bool   // classifyDue's scratch
	evidence  evidence // decide's scratch
	compactAt uint64   // when Tick next gives the drops' memory back
	stalls    stallSet // stalls in progress
	// stallsAsking counts the stalls in progress whose first query asked
	// a namespace, by question and namespace (asking.go)
	stallsAsking askCounts
	// owners caches AddrOwner's answers (askedNSCached).
	owners [ownerSlots]ownerEntry
	// awaitLooks counts the queries awaited has compared with an
	// incident: what a test holds to where nobody asks a forwarder.
	awaitLooks uint64
	// freeRetries: retry states of closed stalls, for the next ones
	freeRetries []*retries
	// stallLow is at most lastAttempt of every stall in progress (their
	// earliest as of the last walk): expire walks stalls only once one may
	// be past QueryTTL. A walk costs a cache miss per stall, and a flood
	// of drops keeps MaxStalls stalls open: not at every tick.
	stallLow uint64
	// stallLog is stalls by opening, oldest first, for the cap; closed
	// ones leave it lazily.
	stallLog fifo[stallRef]
	// waiting: stalls waiting for their retry's attempt to end (some
	// already ended, or gone on; endAttempts drops them).
	waiting []stallRef
	// freeStalls: stalls whose incidents were given back (Recycle), for
	// the next ones
	freeStalls []*stall
	// pendFrom: no query before this place in the order log (seq) waits
	// for its answer (oldestPending).
	pendFrom uint64
	// kernelNow: the kernel's counters read for this batch of drops
	kernelNow map[uint32]ctstats.Counters
	// counted: losers counted as rescued in the last lossWindow (-> when).
	counted map[lossKey]uint64
	attrib  map[uint32]*Attributed
	// rescuesFrom: per namespace, the send time before which its rescued
	// races are the caller's to count (CountRescuesFrom).
	rescuesFrom map[uint32]uint64
	// latest: each client's latest query per name and type (resend.go)
	latest *[resendSlots]resendSlot
	// latestByNS, history, waitingOut: each namespace's latest query per
	// question, each client's last stall per name, and incidents waiting
	// for their clients' stalls to name them (forwarder.go)
	latestByNS *[latestSlots]latestRef
	// byID, copies: the latest query per DNS id and question, and copies
	// of queries found, until their drops come (copies.go)
	byID   *[byIDSlots]byIDRef
	copies map[uint64]copied
	// lastAnswers: each socket's last answer (stale.go)
	lastAnswers *[lastAnswerSlots]lastAnswer
	history     *[historySlots]historySet
	waitingOut  []lingering
	late        map[nameKey]lateIncident // lookups' late answers waiting out (forwarder.go)
	// strs interns question names by hash.
	strs *[internSlots]interned
	// locs caches drop locations by address: a flood of drops comes from a
	// handful of places, and naming one formats a string.
	locs  [locSlots]location
	comms [commSlots]struct {
		b [16]byte
		s string
	}

	nextID    uint64
	lastNs    uint64
	evicted   uint64
	early     uint64
	untracked uint64
	// earlyUntracked: queries reported untracked before their QUERY
	// record, when the report came (untrackLater)
	earlyUntracked map[uint64]uint64
	queries        uint64
	answered       uint64
	lost           uint64
}

// New returns a Correlator.
func New(cfg Config) *Correlator {
	cfg.defaults()
	return &Correlator{cfg: cfg, seed: maphash.MakeSeed(), ix: newIndex(), stallsAsking: newAskCounts(),
		kernelNow: map[uint32]ctstats.Counters{}, counted: map[lossKey]uint64{}, attrib: map[uint32]*Attributed{}, strs: new([internSlots]interned),
		latest: new([resendSlots]resendSlot), latestByNS: new([latestSlots]latestRef), history: new([historySlots]historySet),
		late: map[nameKey]lateIncident{}, byID: new([byIDSlots]byIDRef), copies: map[uint64]copied{}, earlyUntracked: map[uint64]uint64{}, lastAnswers: new([lastAnswerSlots]lastAnswer)}
}

// Stats are the correlator's own counts.
type Stats struct {
	// Queries first seen; Answered: their answers seen reaching the
	// asker; Lost: declared lost (dropped, or retried unanswered);
	// InFlight: waiting for an answer now; Evicted: forgotten early
	// because more than MaxQueries were in flight; StallsReportedEarly:
	// stalls reported before their retry or QueryTTL (as not retried)
	// because more than MaxStalls were in progress; Untracked: queries
	// the kernel's flow table had no room for, whose answers cannot be
	// matched (never taken for losses).
	Queries             uint64 `json:"queries"`
	Answered            uint64 `json:"answered"`
	Lost                uint64 `json:"lost"`
	InFlight            int    `json:"in_flight"`
	Evicted             uint64 `json:"evicted"`
	StallsReportedEarly uint64 `json:"stalls_reported_early"`
	Untracked           uint64 `json:"untracked"`
}

func (c *Correlator) Stats() Stats {
	return Stats{Queries: c.queries, Answered: c.answered, Lost: c.lost, InFlight: c.ix.pending, Evicted: c.evicted,
		StallsReportedEarly: c.early, Untracked: c.untracked}
}

// OldestOpen is the earliest start (CLOCK_MONOTONIC ns) of a stall not
// reported yet: of the oldest stall in progress, or the send of the oldest
// query that may still be found lost (unanswered, or dropped and not
// decided yet), which would start a stall then; 0 when there is none. A
// writer that puts stalls in the order they started can write every
// reported stall that started before it: no stall reported later started
// earlier.
func (c *Correlator) OldestOpen() uint64 {
	var oldest uint64
	take := func(t uint64) {
		if oldest == 0 || t < oldest {
			oldest = t
		}
	}
	for _, o := range c.stalls.s {
		take(o.firstNs)
	}
	for _, l := range c.waitingOut {
		take(l.firstNs)
	}
	if q := c.oldestPending(); q != nil {
		take(q.sentNs)
	}
	// Drops of queries not waiting for an answer (first seen where it
	// cannot be seen), or freed entries of rescued races.
	for i := range c.drops.len() {
		take(c.drops.at(i).sentNs)
	}
	return oldest
}

// oldestPending is the first query in order of sighting still waiting for
// its answer. A query never waits again once it stops, so the walk goes
// on from where the last one stopped: each query is passed once.
func (c *Correlator) oldestPending() *query {
	ix := &c.ix
	i := max(c.pendFrom, ix.popped)
	for ; i < ix.pushed; i++ {
		if q := *ix.order.at(int(i - ix.popped)); !q.dead && q.state == statePending {
			break
		}
	}
	c.pendFrom = i
	if i == ix.pushed {
		return nil
	}
	return *ix.order.at(int(i - ix.popped))
}

// Attributed returns what was explained, per namespace of the drop.
func (c *Correlator) Attributed() map[uint32]Attributed {
	out := make(map[uint32]Attributed, len(c.attrib))
	for ns, a := range c.attrib {
		out[ns] = *a
	}
	return out
}

// CountRescuesFrom leaves out of Attributed the rescued races in ns of
// queries sent before t (CLOCK_MONOTONIC ns): the caller counts those from
// the kernel's clash_resolve counter, read at t, because the records that
// name them may come from a program linked only just before. Their
// incidents are still reported.
func (c *Correlator) CountRescuesFrom(ns uint32, t uint64) {
	if c.rescuesFrom == nil {
		c.rescuesFrom = map[uint32]uint64{}
	}
	c.rescuesFrom[ns] = t
}

func (c *Correlator) attributed(ns uint32) *Attributed {
	a := c.attrib[ns]
	if a == nil {
		a = &Attributed{}
		c.attrib[ns] = a
	}
	return a
}

// answer: pending query q was answered at now.
func (c *Correlator) answer(q *query, now uint64) {
	c.ix.setState(q, stateAnswered)
	c.ix.unpend(q)
	c.answered++
	c.noteAnswer(q, now)
	if now >= q.sentNs+uint64(c.cfg.LateAnswer) {
		c.lateAnswer(q, now)
	}
}

// Handle processes one record. It keeps nothing that e points to.
func (c *Correlator) Handle(e *event.Event) {
	if e.TimeNs > c.lastNs {
		c.lastNs = e.TimeNs
	}
	switch e.Kind {
	case event.KindQuery:
		if e.DNS.Valid {
			c.newQuery(e)
		}
	case event.KindAnswer:
		if q := c.ix.lookup(e.QID); q != nil && q.state == statePending {
			c.answer(q, e.TimeNs)
		}
	case event.KindDrop:
		if e.Response() {
			c.answerDropped(e)
			return
		}
		d := pendingDrop{due: e.TimeNs + uint64(c.cfg.ClassifyDelay), kind: e.Kind, qid: e.QID, netns: e.NetNS,
			ct: e.CT, reason: e.Reason, location: e.Location, timeNs: e.TimeNs, flags: e.Flags}
		q := c.ix.lookup(e.QID)
		if q == nil {
			cp, ok := c.copies[e.QID]
			if !ok {
				return
			}
			delete(c.copies, e.QID)
			if q = c.ix.lookup(cp.orig); q == nil {
				return
			}
			d.qid, d.copy = cp.orig, cp.pkt
		}
		d.sentNs = q.sentNs
		if e.Flags&event.FlagWinner != 0 {
			w := e.Winner
			d.winner, d.wqid = &w, e.WinnerQID
		}
		c.drops.push(d)
	case event.KindConfirmDrop:
		if q := c.ix.lookup(e.QID); q != nil {
			x := q.extraForWrite()
			x.confirmDrop = true
			if e.Flags&event.FlagWinner != 0 {
				x.winnerCT = e.Winner
			}
		}
	case event.KindWinner:
		if q := c.ix.lookup(e.QID); q != nil {
			x := q.extraForWrite()
			if keepLateWinner(q.src, q.dst, x.winnerCT, e.Winner) || e.Winner.Ptr == x.loserCT {
				return
			}
			x.winnerCT, x.winnerQID = e.Winner, e.WinnerQID
			if x.winner == nil && q.state == stateLost {
				x.winner = c.flowOf(e.Winner, e.WinnerQID)
			}
		}
	case event.KindMerged, event.KindNATClash:
		d := pendingDrop{due: e.TimeNs + uint64(c.cfg.ClassifyDelay), kind: e.Kind, qid: e.QID, netns: e.NetNS,
			ct: e.CT, wqid: e.WinnerQID, timeNs: e.TimeNs, sentNs: e.TimeNs}
		if e.Flags&event.FlagWinner != 0 {
			w := e.Winner
			d.winner = &w
		}
		if !c.rescuedByQuery(&d) {
			// The query's own record may come after it: a copy racing
			// the query's first packet on another CPU found the flow
			// that packet had just made, before that CPU wrote the
			// query's record.
			c.drops.push(d)
		}
	case event.KindCTFreed:
		// The loser's query is the one its socket sent last, once its
		// packet has been seen (it leaves after the free): decided later.
		c.drops.push(pendingDrop{due: e.TimeNs + uint64(c.cfg.ClassifyDelay), kind: e.Kind,
			netns: e.NetNS, ct: e.CT, timeNs: e.TimeNs, sentNs: e.TimeNs})
	case event.KindRcvbufFull:
		c.rcvbufFull(e)
	case event.KindUntracked:
		if q := c.ix.lookup(e.QID); q != nil {
			c.untrack(q)
		} else {
			// Its QUERY record may still be on its way (the report
			// comes from the table's sweeper, not the ring).
			c.untrackLater(e.QID)
		}
	}
}

// untrack stops waiting for q's answer, which the kernel cannot match (its
// table was full): an unanswered query unwatched is never a loss.
func (c *Correlator) untrack(q *query) {
	if q.state != statePending {
		return
	}
	c.ix.setState(q, stateUnwatched)
	c.ix.unpend(q)
	c.untracked++
}

// untrackLater remembers qid, reported untracked before its QUERY record
// was read, for a while: most such reports are of queries ended and
// forgotten already.
func (c *Correlator) untrackLater(qid uint64) {
	if len(c.earlyUntracked) >= maxEarlyUntracked {
		clear(c.earlyUntracked)
	}
	c.earlyUntracked[qid] = c.lastNs
}

// maxEarlyUntracked bounds the queries reported untracked before their
// QUERY record; earlyUntrackedFor is how long one is remembered.
const (
	maxEarlyUntracked = 1 << 16
	earlyUntrackedFor = uint64(2 * time.Second)
)

// untrackedEarly: qid was reported untracked before its QUERY record.
func (c *Correlator) untrackedEarly(qid uint64) bool {
	if len(c.earlyUntracked) == 0 {
		return false
	}
	if _, ok := c.earlyUntracked[qid]; ok {
		delete(c.earlyUntracked, qid)
		return true
	}
	return false
}

// newQuery starts following a query.
func (c *Correlator) newQuery(e *event.Event) {
	h := c.hashName(e.DNS.NameKey())
	if u := c.copyOf(e, h); u != nil {
		c.copies[e.QID] = copied{orig: u.qid, pkt: e.Packet, atNs: e.TimeNs}
		return
	}
	q := c.ix.alloc()
	*q = query{qid: e.QID, netns: e.NetNS, src: e.Packet.Src, dst: e.Packet.Dst, id: e.DNS.ID, qtype: e.DNS.QType,
		name: h, qname: c.intern(h, &e.DNS), sentNs: e.TimeNs, cpu: e.CPU, tier: e.Tier}
	if e.Flags&event.FlagSender != 0 {
		// Only a query first seen in its sender's own context has its
		// process: elsewhere (a softirq) the hook ran in whatever task
		// was interrupted.
		q.pid, q.cgroup, q.comm = e.PID, e.Cgroup, e.Comm
	}
	q.sock = sockOf(q.src, q.dst)
	q.nk = nameOf(q.netns, q.name, lookupOwner(q))
	q.asked = c.askedNSCached(q)
	if e.Flags&event.FlagNoSocket != 0 {
		q.state = stateUnwatched
	}
	if e.Flags&event.FlagUntracked != 0 || c.untrackedEarly(e.QID) {
		q.state = stateUnwatched
		c.untracked++
	}
	c.queries++
	c.noteResend(q)
	c.noteLatest(q)
	c.noteByID(q)
	if q.state == statePending {
		c.ix.promote(q.sentNs, uint64(c.cfg.MinRetryGap))
		c.retry(q)
	}
	// Room is made before q goes in: at MaxQueries (a power of two) the
	// tables then stay half full, not twice the size for one query more.
	if c.ix.byQID.len() >= c.cfg.MaxQueries {
		c.evictOldest(c.cfg.MaxQueries - 1)
	}
	c.ix.add(q)
}

// Tick classifies drops that are due and expires old state. now is
// CLOCK_MONOTONIC in ns; 0 means the time of the last record.
func (c *Correlator) Tick(now uint64) {
	if now == 0 {
		now = c.lastNs
	}
	c.classifyDue(now, false)
	c.endAttempts(now)
	c.expire(now)
	c.emitLingering(now, false)
	c.forgetCopies(now)
	for qid, at := range c.earlyUntracked {
		if at+earlyUntrackedFor < now {
			delete(c.earlyUntracked, qid)
		}
	}
	// A tick may empty the drops' log and the next refill it: shrunk at
	// every tick, a flood of drops regrew it (copying) as often.
	if now >= c.compactAt {
		c.drops.compact()
		c.compactAt = now + uint64(compactEvery)
	}
}

// compactEvery is how often the drops' log may give memory back.
const compactEvery = 10 * time.Second

// expire declares old unanswered queries lost, closes stalls that saw no
// retry, and forgets old state.
func (c *Correlator) expire(now uint64) {
	ttl := uint64(c.cfg.QueryTTL)
	// The log is in order of first sighting, so the expired are at its
	// front (records from different CPUs may arrive microseconds out of
	// order: such a query expires a tick later).
	for c.ix.order.len() > 0 {
		q := c.ix.order.front()
		if !q.dead && q.sentNs+ttl > now {
			break
		}
		c.ix.popOldest()
		if q.dead {
			continue
		}
		if q.state == statePending {
			c.markLost(q, c.unansweredLoss(q))
		}
		c.ix.forget(q)
	}
	c.ix.compact()
	// A stall without a retry ends MinRetryGap after its last attempt
	// expired: that attempt's other queries (sent up to MinRetryGap
	// later, on other sockets for Go's resolver) expire into it first.
	wait := ttl + uint64(c.cfg.MinRetryGap)
	if c.stalls.len() > 0 && c.stallLow+wait <= now {
		low := uint64(math.MaxUint64)
		c.stalls.each(func(o *stall) {
			if at := c.lastAttempt(o); at+wait <= now {
				c.finish(o, now)
			} else {
				low = min(low, at)
			}
		})
		c.stallLow = low
	}
	if c.stallLog.len() > 2*c.stalls.len()+1024 {
		c.stallLog.keep(c.inProgress)
		c.stallLog.compact()
	}
	for k, t := range c.counted {
		if t+lossWindow <= now {
			delete(c.counted, k)
		}
	}
}

// evictOldest forgets the oldest queries until keep are left (counted).
// It runs for every query at the cap, where no table or log is sparse
// enough to shrink: compacting is the tick's (expire).
func (c *Correlator) evictOldest(keep int) {
	for c.ix.order.len() > 0 && c.ix.byQID.len() > keep {
		q := c.ix.popOldest()
		if !q.dead {
			c.ix.forget(q)
			c.evicted++
		}
	}
}

// Close classifies every pending drop and closes every open stall (as not
// retried, or at its retry if the retry's attempt was under way). A query
// still waiting is lost only if its answer was seen dropped or it has
// waited a whole resolver timeout by now (CLOCK_MONOTONIC ns): otherwise
// the trace ended, not the wait. Call it once, at the end.
func (c *Correlator) Close(now uint64) {
	c.classifyDue(0, true)
	for i := range c.ix.order.len() {
		if q := *c.ix.order.at(i); q.state == statePending && !q.dead && (q.extraForRead().replyCause != "" || now >= q.sentNs+uint64(c.cfg.ResolverTimeout)) {
			c.markLost(q, c.unansweredLoss(q))
		}
	}
	end := max(now, c.lastNs)
	c.stalls.each(func(o *stall) { c.finish(o, end) })
	c.emitLingering(end, true)
}
