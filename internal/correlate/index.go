package correlate

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net/netip"

	"github.com/dnsrace/dnsrace/internal/event"
)

// This file keeps the queries in flight and their indexes: by the kernel's
// query id, by the asking socket (for a conntrack entry's original tuple
// and for siblings), and by name per namespace (for retries); answers no
// flow expected are matched by walking the newest queries. It recycles query
// structs, so following a query costs no allocation.

type qstate uint8

const (
	statePending qstate = iota
	stateAnswered
	stateLost
	// stateUnwatched: first seen where no answer to it can be seen
	// (forwarded from outside the node): only its drops count.
	stateUnwatched
)

// query is one DNS question on the wire, from its first sighting. What only
// a lost or raced query needs lives in *queryExtra, allocated then.
type query struct {
	qid   uint64
	netns uint32
	// asked is the namespace that holds the address it asked (its own
	// for a loopback address), 0 when that is no namespace seen here (a
	// VIP, a server off the node): a forwarder's incident waits only for
	// queries that asked its namespace.
	asked  uint32
	src    netip.AddrPort
	dst    netip.AddrPort
	id     uint16
	qtype  uint16
	name   uint64 // hash of the question name
	sock   sockKey
	nk     nameKey
	qname  event.Name // interned: queries for one name share it
	sentNs uint64
	cgroup uint64
	pid    uint32
	nodeNS uint32 // where its conntrack evidence came from
	cpu    uint16
	tier   event.Tier
	state  qstate
	dead   bool // forgotten: out of every index
	held   bool // an open stall refers to it: not recycled yet
	// askCounted: it asked a namespace and was still pending MinRetryGap
	// after its send (promote), so it was counted in index.asking until
	// it was no longer pending.
	askCounted bool
	comm       [16]byte
	// prevPending and nextPending link the unanswered queries of its
	// name (inPend: q is linked).
	prevPending, nextPending *query
	inPend                   bool
	// inYoung: its young ref, at place youngAt (the young log's pushes
	// before it, mod 2^32: the log never holds that many), is set.
	inYoung bool
	youngAt uint32
	// seq is q's place in the order log; older is the query its socket
	// sent before it (sockLink).
	seq   uint64
	older sockLink
	x     *queryExtra
}

// queryExtra is the part of a query that only races and losses fill in.
type queryExtra struct {
	race   string
	winner *Flow
	// evidence from the fentry/kprobe confirm hook, or a late winner
	confirmDrop bool
	winnerCT    event.CT
	winnerQID   uint64
	// loserCT is the address of its entry that lost a race, once its drop
	// is classified: a late winner there is no winner (raceRules).
	loserCT uint64
	// replyCause is set when the answer was seen dropped.
	replyCause  string
	replyReason string
	replyLoc    string
	replyNS     uint32
	// resentBy: the query its client sent next for its name and type,
	// within MinRetryGap (resend.go)
	resentBy uint64
	// stale: the entry that sent it to a backend that is gone
	stale *StaleNAT
}

// extraForWrite returns q's extra part to fill in, allocating it on first
// use.
func (q *query) extraForWrite() *queryExtra {
	if q.x == nil {
		q.x = &queryExtra{}
	}
	return q.x
}

// extraForRead returns q's extra part, or a zero one when it has none (not
// to be written: it is shared).
func (q *query) extraForRead() *queryExtra {
	if q.x == nil {
		return &noExtra
	}
	return q.x
}

var noExtra queryExtra

// sockKey names an asking socket by a hash of its source and destination
// (also a conntrack entry's original tuple, whatever namespace the entry
// is in). A map keyed by a number is several times faster than by two
// netip.AddrPorts; the queries found are checked against the real tuple.
type sockKey uint64

// sockSeed keys sockOf: a table of sockets is probed by their hashes, and
// the sources are the pods'.
var sockSeed = [4]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()}

// sockOf hashes the socket's addresses and ports a word at a time (the
// multiply-and-fold of wyhash): callgrind counts 74 instructions less per
// query than maphash.Bytes over the 36 bytes it needed copied out first.
func sockOf(src, dst netip.AddrPort) sockKey {
	s, d := src.Addr().As16(), dst.Addr().As16()
	ports := uint64(src.Port())<<16 | uint64(dst.Port())
	h := fold(binary.LittleEndian.Uint64(s[:8])^sockSeed[0], binary.LittleEndian.Uint64(s[8:])^sockSeed[1])
	h = fold(h^binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:])^sockSeed[2])
	return sockKey(fold(h^ports, sockSeed[3]))
}

func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// A socket's queries are a list from its newest, the head the socks table
// holds, through each query's older link. Queries are forgotten in the
// order they were first seen (the order log's front goes first), so every
// link is stamped with its target's place in that order (seq): a link to a
// query the log has passed (seq < popped) ends the list, and forgetting a
// query touches neither its socket's entry nor its neighbours. Adding a
// query then costs one table slot (a number), not a write to
// the struct of the socket's previous query, long out of the cache; the
// entries of sockets whose queries are all gone are dropped when the table
// would grow (sweepSockets). Walks look at the sockRecentLen newest:
// enough for an A/AAAA pair and its retries, and a flood's socket with
// thousands in flight costs no more.
const sockRecentLen = 8

// sockLink is a link to a query of a socket: its place in the order log
// (seq) plus one, 0 for none. The log finds the query while it is in
// flight; a number rather than a pointer keeps the socks table free of
// pointers, so the garbage collector never scans it, and its slots are 16
// bytes, four to a cache line.
type sockLink uint64

func linkTo(q *query) sockLink { return sockLink(q.seq + 1) }

// nameKey is a name asked by one client in a namespace: the name's hash
// mixed with the namespace's inode and the client (lookupOwner; a number
// key, for speed). A lookup's queries, its retries and its stall all have
// one key; another client asking the same name (another pod's process
// behind a node-local cache, another process of the pod) never ends a
// stall or makes a query lost.
type nameKey uint64

func nameOf(netns uint32, name, owner uint64) nameKey {
	return nameKey(name ^ (uint64(netns)+1)*0x9e3779b97f4a7c15 ^ (owner+1)*0xc2b2ae3d27d4eb4f)
}

// lookupOwner is who asks: the process, where the query was first seen in
// its context (resolvers resend from the same process, on the same socket
// or a new one), else the socket alone.
func lookupOwner(q *query) uint64 {
	if q.pid != 0 {
		return uint64(q.pid)
	}
	return uint64(q.sock) | 1<<63
}

// nameState is what a name in a namespace has going on: its unanswered
// queries, oldest first, and its stall in progress.
type nameState struct {
	pend  pendList
	stall *stall
}

// pendList is a doubly linked list of queries through prevPending and
// nextPending, oldest first.
type pendList struct{ head, tail *query }

func (l *pendList) push(q *query) {
	q.prevPending, q.nextPending, q.inPend = l.tail, nil, true
	if l.tail == nil {
		l.head = q
	} else {
		l.tail.nextPending = q
	}
	l.tail = q
}

// remove unlinks q if it is linked (in O(1)).
func (l *pendList) remove(q *query) {
	if !q.inPend {
		return
	}
	if q.prevPending == nil {
		l.head = q.nextPending
	} else {
		q.prevPending.nextPending = q.nextPending
	}
	if q.nextPending == nil {
		l.tail = q.prevPending
	} else {
		q.nextPending.prevPending = q.prevPending
	}
	q.prevPending, q.nextPending, q.inPend = nil, nil, false
}

// index holds every query in flight.
type index struct {
	byQID table[*query]
	socks table[sockLink]   // by sockKey: the socket's newest query
	names table[*nameState] // by nameKey
	order fifo[*query]      // by first sighting, for expiry
	// pushed and popped count the order log's pushes and pops: a query
	// with seq >= popped is still in flight.
	pushed, popped uint64
	// young: pending queries not yet in their name's list. A query is
	// only ever found there as an older query a retry makes lost, sent at
	// least MinRetryGap before it; most are answered long before that, so
	// they join the list only once that old (promote), and an answered
	// query costs no name state at all.
	young       fifo[youngRef]
	youngPopped uint64 // pops of young: a ref's place is its push count
	// recycled structs: following a query allocates nothing
	free      []*query
	freeNames []*nameState
	pending   int // queries in statePending
	// asking counts the pending queries that asked a namespace, once
	// promoted (askCounted), by question and namespace (asking.go)
	asking askCounts
}

// notPending counts q out of the pending queries.
func (ix *index) notPending(q *query) {
	ix.pending--
	if q.askCounted {
		ix.asking.sub(askKey(q.name, q.qtype, q.asked))
	}
}

func newIndex() index {
	return index{byQID: newTable[*query](), socks: newTable[sockLink](), names: newTable[*nameState](), asking: newAskCounts()}
}

// alloc returns a zeroed query struct, recycled when one is free.
func (ix *index) alloc() *query {
	if n := len(ix.free); n > 0 {
		q := ix.free[n-1]
		ix.free = ix.free[:n-1]
		return q
	}
	return &query{}
}

// recycle returns q to the free list unless an open stall still refers to
// it.
func (ix *index) recycle(q *query) {
	if q.held || !q.dead {
		return
	}
	*q = query{}
	ix.free = append(ix.free, q)
}

// add puts a new query into every index (q.sock and q.nk set).
func (ix *index) add(q *query) {
	ix.byQID.set(q.qid, q)
	q.seq = ix.pushed
	ix.pushed++
	ix.order.push(q)
	ix.pushOnSocket(q)
	if q.state == statePending {
		ix.pending++
		q.inYoung, q.youngAt = true, uint32(ix.youngPopped)+uint32(ix.young.len())
		ix.young.push(youngRef{q, q.sentNs})
	}
}

// youngRef is a young query. q is nil once the query is no longer pending
// (answered, lost or forgotten): its ref is cleared then, while it is
// recent and in the cache, so promote passes it without reading the
// query's struct, long out of the cache by then (callgrind's cache model
// put 1.5 misses per query there, the read path's largest).
type youngRef struct {
	q      *query
	sentNs uint64
}

// leaveYoung clears q's young ref, if it has one.
func (ix *index) leaveYoung(q *query) {
	if q.inYoung {
		ix.young.at(int(q.youngAt - uint32(ix.youngPopped))).q = nil
		q.inYoung = false
	}
}

// promote links the young queries sent at least gap before now into their
// names' lists of unanswered queries, oldest first.
func (ix *index) promote(now, gap uint64) {
	for ix.young.len() > 0 {
		r := ix.young.front()
		if q := r.q; q != nil {
			if r.sentNs+gap > now {
				return
			}
			q.inYoung = false
			if !q.inPend {
				ix.nameStateOf(q.nk).pend.push(q)
			}
			if q.asked != 0 {
				q.askCounted = true
				ix.asking.add(askKey(q.name, q.qtype, q.asked), clientOf(q))
			}
		}
		ix.young.pop()
		ix.youngPopped++
	}
}

// nameStateOf returns the state of a name in a namespace, making it.
func (ix *index) nameStateOf(k nameKey) *nameState {
	nk := uint64(k)
	s, ok := ix.names.get(nk)
	if !ok {
		if n := len(ix.freeNames); n > 0 {
			s = ix.freeNames[n-1]
			ix.freeNames = ix.freeNames[:n-1]
		} else {
			s = &nameState{}
		}
		ix.names.set(nk, s)
	}
	return s
}

// unpend takes an answered query off its name's list of unanswered ones,
// and forgets the name's state once nothing is going on. Left for a later
// walk, the states of answered names filled the table with every query
// in flight (a flood asks a new name each time), and each new query's
// lookup in it missed the cache.
func (ix *index) unpend(q *query) {
	if !q.inPend {
		return
	}
	if s, ok := ix.names.get(uint64(q.nk)); ok {
		s.pend.remove(q)
		ix.dropName(q.nk, s)
	}
}

// nameOfQuery returns q's name state, if it has one.
func (ix *index) nameOfQuery(q *query) *nameState {
	s, _ := ix.names.get(uint64(q.nk))
	return s
}

// dropName forgets the name state of key k once nothing is going on.
func (ix *index) dropName(k nameKey, s *nameState) {
	if s.pend.head != nil || s.stall != nil {
		return
	}
	ix.names.del(uint64(k))
	*s = nameState{}
	ix.freeNames = append(ix.freeNames, s)
}

// lookup returns the live query with kernel id qid.
func (ix *index) lookup(qid uint64) *query {
	if qid == 0 {
		return nil
	}
	q, _ := ix.byQID.get(qid)
	return q
}

// byQuestion returns the newest query with the DNS id, type and name an
// answer carries, sent within window before t. It walks the queries newest
// first: it serves only answers no flow expected (rare), so no index is
// kept for it on the hot path.
func (ix *index) byQuestion(id, qtype uint16, name uint64, t, window uint64) *query {
	for i := ix.order.len() - 1; i >= 0; i-- {
		q := *ix.order.at(i)
		if q.sentNs+window < t {
			break
		}
		if !q.dead && q.id == id && q.qtype == qtype && q.name == name {
			return q
		}
	}
	return nil
}

// setState moves q out of statePending (it stays in its name's pending
// list until the next walk drops it, or unpend does).
func (ix *index) setState(q *query, s qstate) {
	if q.state == statePending && s != statePending {
		ix.notPending(q)
		ix.leaveYoung(q)
	}
	q.state = s
}

// popOldest takes the oldest query off the order log; the caller forgets
// it unless it is dead already.
func (ix *index) popOldest() *query {
	ix.popped++
	return ix.order.pop()
}

// inFlight: l links to a query the order log still holds.
func (ix *index) inFlight(l sockLink) bool { return l != 0 && uint64(l)-1 >= ix.popped }

// linked is the query l links to, nil if the order log has passed it. The
// log's front is the query with seq popped.
func (ix *index) linked(l sockLink) *query {
	if !ix.inFlight(l) {
		return nil
	}
	return *ix.order.at(int(uint64(l) - 1 - ix.popped))
}

// pushOnSocket makes q (q.seq set) the newest query of its socket.
func (ix *index) pushOnSocket(q *query) {
	if 2*(ix.socks.len()+1) > len(ix.socks.slots) {
		ix.sweepSockets()
	}
	head := ix.socks.refOrAdd(uint64(q.sock))
	if ix.inFlight(*head) {
		q.older = *head
	}
	*head = linkTo(q)
}

// sweepSockets drops the entries of sockets with no query in flight, and
// sizes the table for the rest.
func (ix *index) sweepSockets() {
	ix.socks.keepOnly(func(l *sockLink) bool { return ix.inFlight(*l) })
}

// sockets returns the newest query in flight on the socket src->dst (or on
// one whose key collides), the head of its list, or nil.
func (ix *index) sockets(src, dst netip.AddrPort) *query {
	return ix.socketHead(sockOf(src, dst))
}

func (ix *index) socketHead(k sockKey) *query {
	l, _ := ix.socks.get(uint64(k))
	return ix.linked(l)
}

// recentOnSocket lists the newest queries in flight on the socket whose
// list starts at head, newest first; n says how many of r hold one.
func (ix *index) recentOnSocket(head *query) (r [sockRecentLen]*query, n int) {
	for q := head; q != nil && n < sockRecentLen; q = ix.olderOnSocket(q) {
		r[n] = q
		n++
	}
	return r, n
}

// olderOnSocket is the query q's socket sent before q, nil if none is in
// flight.
func (ix *index) olderOnSocket(q *query) *query {
	return ix.linked(q.older)
}

// onSocket is the newest query in flight on the socket src->dst.
func (ix *index) onSocket(src, dst netip.AddrPort) *query {
	for q, n := ix.sockets(src, dst), 0; q != nil && n < sockRecentLen; q, n = ix.olderOnSocket(q), n+1 {
		if q.src == src && q.dst == dst {
			return q
		}
	}
	return nil
}

// forget takes q out of every index; its struct is recycled once no open
// stall refers to it. q has been taken off the order log (popOldest): its
// socket's list then ends before it with no change.
func (ix *index) forget(q *query) {
	if q.dead {
		return
	}
	q.dead = true
	ix.leaveYoung(q)
	if i := ix.byQID.find(q.qid); i >= 0 && ix.byQID.slots[i].v == q {
		ix.byQID.delAt(i)
	}
	// Lost queries stay linked until the next walk: unlink q whatever
	// its state, its struct may be reused. A query not linked leaves its
	// name's state as it is (answered ones were unlinked at the answer).
	if nk := q.nk; q.inPend {
		if s, ok := ix.names.get(uint64(nk)); ok {
			s.pend.remove(q)
			ix.dropName(nk, s)
		}
	}
	if q.state == statePending {
		ix.notPending(q)
	}
	ix.recycle(q)
}

// compact gives memory back after a burst.
func (ix *index) compact() {
	ix.order.compact()
	ix.young.compact()
	ix.byQID.shrink()
	ix.socks.shrink()
	ix.names.shrink()
}
