package correlate

// A forwarder's incident waits while a client's query that joined its
// stall is still open (forwarder.go, awaited). The queries and stalls that
// could have joined one are another client's that asked its namespace the
// same question: they are counted by question and namespace asked
// (askKey), with whether more than one client's are counted, so that an
// incident whose namespace nobody else asks that question (nearly every
// incident: a pod's, whose namespace nobody asks; a flood's, all of one
// client) looks no further. Only queries that asked a namespace seen here
// (a loopback address, a node-local cache) and were still unanswered
// MinRetryGap after their send are counted, as they join their name's
// pending list (index.promote): a client waiting on a forwarder's lost
// query is, and the floods' answered and dropped queries never are. The
// counts are exact, so that a question asked of a busy forwarder never
// sends the incidents of other namespaces looking.

// askKey is the key of a question asked of namespace asked (never 0).
func askKey(name uint64, qtype uint16, asked uint32) uint64 {
	return (name^uint64(qtype)*0x9e3779b97f4a7c15^uint64(asked)*0xc2b2ae3d27d4eb4f)<<1 | 1
}

// askCounts counts queries (or stalls) by askKey.
type askCounts struct{ t table[askCount] }

func newAskCounts() askCounts { return askCounts{newTable[askCount]()} }

func (a *askCounts) add(k, who uint64) { a.t.refOrAdd(k).add(who) }

func (a *askCounts) sub(k uint64) {
	if i := a.t.find(k); i >= 0 {
		if c := &a.t.slots[i].v; c.n > 1 {
			c.n--
		} else {
			a.t.delAt(i)
		}
	}
}

// others: a query of k of a client other than who may be counted.
func (a *askCounts) others(k, who uint64) bool {
	c, ok := a.t.get(k)
	return ok && (c.mixed || c.who != who)
}

// askCount counts the queries (or stalls) of one key.
type askCount struct {
	n     uint32
	mixed bool   // more than one client's were counted since it was added
	who   uint64 // the first of them (clientOf)
}

func (a *askCount) add(who uint64) {
	switch {
	case a.n == 0:
		a.who = who
	case a.who != who:
		a.mixed = true
	}
	a.n++
}

// clientOf is the client that sent q, whatever it asked: its namespace
// and lookupOwner.
func clientOf(q *query) uint64 { return uint64(nameOf(q.netns, 0, lookupOwner(q))) }
